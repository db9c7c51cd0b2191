// GGUF (v2/v3) models of the Llama and Qwen3 architectures, through the gguf
// module's reader.
//
// Metadata (A = general.architecture, "llama" or "qwen3"):
//   A.block_count, A.embedding_length, A.feed_forward_length,
//   A.attention.head_count, A.attention.head_count_kv (default head_count),
//   A.attention.key_length (head_dim; default embedding / heads),
//   A.attention.layer_norm_rms_epsilon, A.rope.freq_base (default 10000),
//   A.context_length, A.vocab_size (default: rows of token_embd),
//   A.rope.scaling.type (only "none" is accepted), tokenizer.ggml.bos/eos_token_id.
// Tensors: token_embd, output_norm, output (absent: tied), rope_freqs
// (optional: per-frequency divisors, llama.cpp's Llama 3.1 scaling), and per
// block N: blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
// ffn_gate, ffn_up, ffn_down}.weight, blk.N.attn_{q,k}_norm.weight (Qwen3),
// blk.N.attn_{q,k,v}.bias (optional).
// RoPE: llama.cpp's converter permutes the rows of attn_q/attn_k of the llama
// architecture so that adjacent pairs rotate together (RopeStyle::interleaved);
// qwen3 files are not permuted (half style).
//
// Weight conversion (--weights auto):
//   Q4_1 -> w4 group 32, exactly: the 16 code bytes of a block are copied (our
//           w4 nibble order is Q4_1's), scale = d, min = m (f16 -> f32).
//   Q4_0 -> w4 group 32, exactly: scale = d, min = -8 d.
//   Q8_0 -> q8, exactly: codes copied, scale = d.
//   F32, F16, BF16 -> dense; every other type the reader can dequantize (Q5_*,
//   K-quants) -> dense f32.
// --weights fp16 dequantizes every linear to f32; --weights w4 re-quantizes
// non-4-bit linears (and an untied output matrix) with RTN (group 128, or 64/32
// when in_features needs it), leaving Q4_0/Q4_1 layers as they are.
#include <cstring>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/engine/weights.h"
#include "lowbit/gguf/gguf_file.h"

namespace lowbit::engine {

namespace {

using gguf::GgmlType;

struct Q4Block {  // Q4_0 without the min
  uint16_t d;
  uint8_t qs[16];
};
struct Q41Block {
  uint16_t d, m;
  uint8_t qs[16];
};
struct Q8Block {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(Q4Block) == 18 && sizeof(Q41Block) == 20 && sizeof(Q8Block) == 34,
              "ggml block layouts are packed");

// The matrix [rows = ne1][cols = ne0] of a 2-D tensor.
void matrix_shape(const gguf::TensorInfo& info, int64_t& rows, int64_t& cols) {
  if (info.shape.size() != 2)
    fail(ErrorKind::format, "GGUF tensor ", info.describe(), ": expected a 2-D weight");
  cols = info.shape[0];
  rows = info.shape[1];
}

WeightMatrix from_blocks(const gguf::GgufFile& file, const gguf::TensorInfo& info) {
  int64_t rows = 0, cols = 0;
  matrix_shape(info, rows, cols);
  const std::span<const std::byte> bytes = file.tensor_bytes(info);
  const int64_t blocks = rows * cols / 32;
  const int64_t block_bytes = info.type == GgmlType::Q8_0 ? 34 : info.type == GgmlType::Q4_1 ? 20 : 18;
  if (cols % 32 != 0 || bytes.size() != static_cast<size_t>(blocks * block_bytes))
    fail(ErrorKind::format, "GGUF tensor ", info.describe(), " has ", bytes.size(), " bytes, expected ", blocks,
         " blocks of ", block_bytes);
  WeightMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.group_size = 32;
  const auto f16v = [](uint16_t b) { return f16_to_float(f16::from_bits(b)); };
  if (info.type == GgmlType::Q8_0) {
    m.format = MatrixFormat::q8;
    m.codes.resize(static_cast<size_t>(rows * cols));
    m.scales.resize(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      Q8Block blk;
      std::memcpy(&blk, bytes.data() + b * 34, sizeof blk);
      m.scales[static_cast<size_t>(b)] = f16v(blk.d);
      std::memcpy(m.codes.data() + b * 32, blk.qs, 32);
    }
  } else {
    const bool q41 = info.type == GgmlType::Q4_1;
    const int64_t bsz = q41 ? 20 : 18;
    m.format = MatrixFormat::w4;
    m.codes.resize(static_cast<size_t>(rows * cols / 2));
    m.scales.resize(static_cast<size_t>(blocks));
    m.mins.resize(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      const std::byte* src = bytes.data() + b * bsz;
      if (q41) {
        Q41Block blk;
        std::memcpy(&blk, src, sizeof blk);
        m.scales[static_cast<size_t>(b)] = f16v(blk.d);
        m.mins[static_cast<size_t>(b)] = f16v(blk.m);
        std::memcpy(m.codes.data() + b * 16, blk.qs, 16);
      } else {
        Q4Block blk;
        std::memcpy(&blk, src, sizeof blk);
        const float d = f16v(blk.d);
        m.scales[static_cast<size_t>(b)] = d;
        m.mins[static_cast<size_t>(b)] = -8.0f * d;  // w = d (q - 8), exact in f32
        std::memcpy(m.codes.data() + b * 16, blk.qs, 16);
      }
    }
  }
  m.check();
  return m;
}

WeightMatrix dequantized(const gguf::GgufFile& file, const gguf::TensorInfo& info) {
  int64_t rows = 0, cols = 0;
  matrix_shape(info, rows, cols);
  return WeightMatrix::from_floats(rows, cols, gguf::dequantize_to_f32(file, info));
}

bool is_exact_4bit(GgmlType t) { return t == GgmlType::Q4_0 || t == GgmlType::Q4_1; }

// A weight as stored (exact formats kept, dense types dense, others dequantized).
WeightMatrix as_stored(const gguf::GgufFile& file, const gguf::TensorInfo& info) {
  if (is_exact_4bit(info.type) || info.type == GgmlType::Q8_0) {
    int64_t rows = 0, cols = 0;
    matrix_shape(info, rows, cols);
    if (cols % 32 == 0) return from_blocks(file, info);
  }
  if (info.type == GgmlType::F16) {
    int64_t rows = 0, cols = 0;
    matrix_shape(info, rows, cols);
    const std::span<const std::byte> bytes = file.tensor_bytes(info);
    const TensorView v = TensorView::contiguous(const_cast<std::byte*>(bytes.data()), DType::f16, {rows, cols});
    return WeightMatrix::from_dense(v);
  }
  return dequantized(file, info);
}

WeightMatrix linear(const gguf::GgufFile& file, const std::string& name, const LoadOptions& options) {
  const gguf::TensorInfo& info = file.tensor(name);
  switch (options.weights) {
    case WeightMode::as_stored: return as_stored(file, info);
    case WeightMode::dense: return dequantized(file, info);
    case WeightMode::w4: {
      if (is_exact_4bit(info.type)) return as_stored(file, info);
      WeightMatrix dense = dequantized(file, info);
      const TensorView v = TensorView::contiguous(dense.f32.data(), DType::f32, {dense.rows, dense.cols});
      return WeightMatrix::quantize_w4(v, options.w4_group_size);
    }
  }
  fail(ErrorKind::internal, "bad weight mode");
}

std::vector<float> vector_tensor(const gguf::GgufFile& file, const std::string& name, int64_t expected) {
  const gguf::TensorInfo& info = file.tensor(name);
  if (info.numel() != expected)
    fail(ErrorKind::format, "GGUF tensor ", info.describe(), ": expected ", expected, " elements");
  return gguf::dequantize_to_f32(file, info);
}

}  // namespace

Model load_gguf_model(const std::filesystem::path& path, const LoadOptions& options) {
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const std::string arch = file.architecture();
  Model model;
  model.source = path;
  model.source_format = "gguf";
  ModelConfig& c = model.config;
  if (arch == "llama") {
    c.arch = Architecture::llama;
    c.rope_style = RopeStyle::interleaved;
  } else if (arch == "qwen3") {
    c.arch = Architecture::qwen3;
    c.qk_norm = true;
    c.rope_style = RopeStyle::half;
  } else {
    fail(ErrorKind::unsupported, "GGUF file ", path.string(), ": general.architecture '", arch,
         "': the engine runs llama and qwen3");
  }
  const std::string a = arch + ".";
  c.num_layers = file.get_int(a + "block_count");
  c.hidden = file.get_int(a + "embedding_length");
  c.intermediate = file.get_int(a + "feed_forward_length");
  c.num_heads = file.get_int(a + "attention.head_count");
  c.num_kv_heads = file.get_int_or(a + "attention.head_count_kv", c.num_heads);
  c.head_dim = file.get_int_or(a + "attention.key_length", c.num_heads > 0 ? c.hidden / c.num_heads : 0);
  c.rms_eps = file.get_float(a + "attention.layer_norm_rms_epsilon");
  c.rope_theta = file.get_float_or(a + "rope.freq_base", 10000.0);
  c.max_position = file.get_int_or(a + "context_length", 0);
  const std::string scaling = file.get_string_or(a + "rope.scaling.type", "none");
  if (scaling != "none")
    fail(ErrorKind::unsupported, "GGUF file ", path.string(), ": rope scaling type '", scaling, "' is not supported");
  const gguf::TensorInfo& embd = file.tensor("token_embd.weight");
  c.vocab = file.get_int_or(a + "vocab_size", embd.shape.size() == 2 ? embd.shape[1] : 0);
  c.bos_token = file.get_int_or("tokenizer.ggml.bos_token_id", -1);
  c.eos_token = file.get_int_or("tokenizer.ggml.eos_token_id", -1);
  c.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  c.attention_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  if (file.find_tensor("rope_freqs.weight") != nullptr)
    c.rope_freq_factors = vector_tensor(file, "rope_freqs.weight", c.head_dim / 2);
  c.validate();

  const int64_t total = c.num_layers + 2;
  const auto progress = [&](int64_t done, const std::string& what) {
    if (options.progress) options.progress(done, total, what);
  };
  ModelWeights& W = model.weights;
  W.embed = as_stored(file, embd);
  progress(1, "embeddings");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = vector_tensor(file, p + "attn_norm.weight", c.hidden);
    L.ffn_norm = vector_tensor(file, p + "ffn_norm.weight", c.hidden);
    if (c.qk_norm) {
      L.q_norm = vector_tensor(file, p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = vector_tensor(file, p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.attention_bias) {
      L.q_bias = vector_tensor(file, p + "attn_q.bias", c.q_dim());
      L.k_bias = vector_tensor(file, p + "attn_k.bias", c.kv_dim());
      L.v_bias = vector_tensor(file, p + "attn_v.bias", c.kv_dim());
    }
    L.wq = linear(file, p + "attn_q.weight", options);
    L.wk = linear(file, p + "attn_k.weight", options);
    L.wv = linear(file, p + "attn_v.weight", options);
    L.wo = linear(file, p + "attn_output.weight", options);
    L.w_gate = linear(file, p + "ffn_gate.weight", options);
    L.w_up = linear(file, p + "ffn_up.weight", options);
    L.w_down = linear(file, p + "ffn_down.weight", options);
    W.layers.push_back(std::move(L));
    progress(l + 2, "layer " + std::to_string(l));
  }
  W.final_norm = vector_tensor(file, "output_norm.weight", c.hidden);
  if (!c.tied_embeddings) W.lm_head = linear(file, "output.weight", options);
  progress(total, "output");
  W.check(c);
  return model;
}

}  // namespace lowbit::engine
