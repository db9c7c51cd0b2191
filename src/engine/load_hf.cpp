// Hugging Face checkpoints: config.json + safetensors (f32/f16/bf16), and the
// GPTQ/AWQ-quantized versions (AutoGPTQ, GPTQModel v2, AutoAWQ gemm, and what
// `lowbit quantize` writes), read through checkpoint/read_packed_linear.
//
// Tensor names (transformers' LlamaForCausalLM / Qwen3ForCausalLM):
//   model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when tied)
//   model.layers.L.input_layernorm.weight, .post_attention_layernorm.weight
//   model.layers.L.self_attn.{q,k,v,o}_proj.weight (+ .bias), .self_attn.{q,k}_norm.weight (Qwen3)
//   model.layers.L.mlp.{gate,up,down}_proj.weight
// A quantized linear replaces P.weight with P.qweight/qzeros/scales(/g_idx).
#include <string>

#include "lowbit/checkpoint/quantized_checkpoint.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/weights.h"
#include "lowbit/formats/layout_registry.h"
#include "lowbit/io/hf_config.h"

namespace lowbit::engine {

namespace {

std::vector<float> read_vector(const io::Checkpoint& ck, const std::string& name, int64_t expected) {
  const TensorView v = ck.view(name);
  if (v.rank != 1 || v.shape[0] != expected)
    fail(ErrorKind::format, "tensor ", name, " in ", ck.path().string(), " has shape ", v.shape_string(),
         ", expected [", expected, "]");
  std::vector<float> out(static_cast<size_t>(expected));
  for (int64_t i = 0; i < expected; ++i) {
    switch (v.dtype) {
      case DType::f32: out[static_cast<size_t>(i)] = v.as<const float>()[i]; break;
      case DType::f16: out[static_cast<size_t>(i)] = f16_to_float(v.as<const f16>()[i]); break;
      case DType::bf16: out[static_cast<size_t>(i)] = bf16_to_float(v.as<const bf16>()[i]); break;
      default:
        fail(ErrorKind::format, "tensor ", name, " has dtype ", dtype_name(v.dtype), ": expected f32, f16 or bf16");
    }
  }
  return out;
}

WeightMatrix dense_matrix(const io::Checkpoint& ck, const std::string& name) {
  const TensorView v = ck.view(name);
  if (v.rank != 2)
    fail(ErrorKind::format, "tensor ", name, " in ", ck.path().string(), " has shape ", v.shape_string(),
         ": expected a matrix");
  if (v.dtype != DType::f32 && v.dtype != DType::f16 && v.dtype != DType::bf16)
    fail(ErrorKind::format, "tensor ", name, " has dtype ", dtype_name(v.dtype), ": expected f32, f16 or bf16");
  return WeightMatrix::from_dense(v);
}

// Dequantizes a canonical layer into a dense f32 [N][K] matrix (exact).
WeightMatrix dequantize_layer(const formats::QuantizedLinear& q) {
  std::vector<float> values(static_cast<size_t>(q.N * q.K));
  for (int64_t k = 0; k < q.K; ++k)
    for (int64_t n = 0; n < q.N; ++n) values[static_cast<size_t>(n * q.K + k)] = q.dequant(k, n);
  return WeightMatrix::from_floats(q.N, q.K, std::move(values));
}

struct LinearLoader {
  const io::Checkpoint& ck;
  const LoadOptions& options;
  bool quantized_checkpoint;

  WeightMatrix operator()(const std::string& prefix) const {
    if (quantized_checkpoint && ck.find(prefix + ".qweight") != nullptr) {
      const formats::PackedLinear packed = checkpoint::read_packed_linear(ck, prefix, ck.quantization());
      const formats::QuantizedLinear q = formats::unpack(packed);
      // Act-order layers (g_idx) have no w4 CPU layout: dequantized exactly.
      if (options.weights == WeightMode::dense || !q.has_trivial_g_idx() || q.K % kW4BlockCols != 0 ||
          (q.group_size != -1 && q.group_size % kW4BlockCols != 0))
        return dequantize_layer(q);
      return WeightMatrix::from_quantized(q);
    }
    const std::string name = prefix + ".weight";
    if (options.weights == WeightMode::w4) {
      const TensorView v = ck.view(name);
      if (v.rank != 2) fail(ErrorKind::format, "tensor ", name, " has shape ", v.shape_string(), ": expected a matrix");
      return WeightMatrix::quantize_w4(v, options.w4_group_size);
    }
    return dense_matrix(ck, name);
  }
};

}  // namespace

Model load_hf_model(const std::filesystem::path& path, const LoadOptions& options) {
  const io::Checkpoint ck = io::Checkpoint::open(path);
  if (!ck.config())
    fail(ErrorKind::format, "checkpoint ", path.string(), " has no config.json: the engine needs the model's sizes");
  Model model;
  model.config = config_from_hf(*ck.config());
  model.source = path;
  const io::QuantizationInfo& quant = ck.quantization();
  const bool quantized = quant.method != io::QuantMethod::none;
  model.source_format = quantized ? io::quant_method_name(quant.method) : "safetensors";
  const ModelConfig& c = model.config;
  const LinearLoader linear{ck, options, quantized};
  const int64_t total = c.num_layers + 2;
  const auto progress = [&](int64_t done, const std::string& what) {
    if (options.progress) options.progress(done, total, what);
  };

  model.weights.embed = dense_matrix(ck, "model.embed_tokens.weight");
  progress(1, "embeddings");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = read_vector(ck, p + "input_layernorm.weight", c.hidden);
    L.ffn_norm = read_vector(ck, p + "post_attention_layernorm.weight", c.hidden);
    if (c.qk_norm) {
      L.q_norm = read_vector(ck, p + "self_attn.q_norm.weight", c.head_dim);
      L.k_norm = read_vector(ck, p + "self_attn.k_norm.weight", c.head_dim);
    }
    if (c.attention_bias) {
      L.q_bias = read_vector(ck, p + "self_attn.q_proj.bias", c.q_dim());
      L.k_bias = read_vector(ck, p + "self_attn.k_proj.bias", c.kv_dim());
      L.v_bias = read_vector(ck, p + "self_attn.v_proj.bias", c.kv_dim());
    }
    L.wq = linear(p + "self_attn.q_proj");
    L.wk = linear(p + "self_attn.k_proj");
    L.wv = linear(p + "self_attn.v_proj");
    L.wo = linear(p + "self_attn.o_proj");
    L.w_gate = linear(p + "mlp.gate_proj");
    L.w_up = linear(p + "mlp.up_proj");
    L.w_down = linear(p + "mlp.down_proj");
    model.weights.layers.push_back(std::move(L));
    progress(l + 2, "layer " + std::to_string(l));
  }
  model.weights.final_norm = read_vector(ck, "model.norm.weight", c.hidden);
  // lm_head stays in full precision (as GPTQ/AWQ leave it) unless --weights w4.
  if (ck.find("lm_head.weight") != nullptr) {
    model.weights.lm_head = options.weights == WeightMode::w4
                                ? WeightMatrix::quantize_w4(ck.view("lm_head.weight"), options.w4_group_size)
                                : dense_matrix(ck, "lm_head.weight");
    model.config.tied_embeddings = false;
  } else {
    model.config.tied_embeddings = true;
  }
  progress(total, "output");
  model.weights.check(model.config);
  return model;
}

}  // namespace lowbit::engine
