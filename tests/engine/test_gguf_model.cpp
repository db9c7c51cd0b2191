// GGUF models built in the test from the golden checkpoints, the way
// llama.cpp's converter writes them: metadata under llama.* / qwen3.*, ggml
// tensor names; for llama the rows of attn_q/attn_k permuted so that RoPE
// pairs are adjacent and llama3 scaling as a rope_freqs tensor of
// per-frequency divisors. With F32
// tensors the logits must equal transformers' (the golden file); with Q8_0,
// Q4_0 and F16 tensors each layer must load exactly as the gguf module's
// reference dequantizer reads it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "lowbit/core/half.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/weights.h"
#include "lowbit/gguf/gguf_file.h"
#include "lowbit/io/safetensors.h"
#include "tolerances.h"

namespace lowbit::test {
namespace {

namespace fs = std::filesystem;
using gguf::GgmlType;

// A minimal GGUF v3 writer (alignment 32).
class GgufWriter {
 public:
  void kv_string(const std::string& k, const std::string& v) {
    key(k, 8);
    str(meta_, v);
    ++n_kv_;
  }
  void kv_u32(const std::string& k, uint32_t v) {
    key(k, 4);
    pod(meta_, v);
    ++n_kv_;
  }
  void kv_f32(const std::string& k, float v) {
    key(k, 6);
    pod(meta_, v);
    ++n_kv_;
  }
  // values: [rows][cols] row-major floats, stored as `type` with ne = [cols, rows] (or [cols] when rows == 0).
  void tensor(const std::string& name, const std::vector<float>& values, int64_t rows, int64_t cols, GgmlType type) {
    std::vector<uint8_t> data = encode(values, type);
    while (data_.size() % 32 != 0) data_.push_back(0);
    str(infos_, name);
    pod(infos_, static_cast<uint32_t>(rows == 0 ? 1 : 2));
    pod(infos_, static_cast<uint64_t>(cols));
    if (rows != 0) pod(infos_, static_cast<uint64_t>(rows));
    pod(infos_, static_cast<uint32_t>(type));
    pod(infos_, static_cast<uint64_t>(data_.size()));
    data_.insert(data_.end(), data.begin(), data.end());
    ++n_tensors_;
  }
  void write(const fs::path& path) const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    pod(out, uint32_t{3});
    pod(out, n_tensors_);
    pod(out, n_kv_);
    out.insert(out.end(), meta_.begin(), meta_.end());
    out.insert(out.end(), infos_.begin(), infos_.end());
    while (out.size() % 32 != 0) out.push_back(0);
    out.insert(out.end(), data_.begin(), data_.end());
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  }

 private:
  template <typename T>
  static void pod(std::vector<uint8_t>& b, T v) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    b.insert(b.end(), bytes, bytes + sizeof(T));
  }
  static void str(std::vector<uint8_t>& b, const std::string& s) {
    pod(b, static_cast<uint64_t>(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) {
    str(meta_, k);
    pod(meta_, type);
  }
  static std::vector<uint8_t> encode(const std::vector<float>& v, GgmlType type) {
    std::vector<uint8_t> out;
    if (type == GgmlType::F32) {
      for (float x : v) pod(out, x);
    } else if (type == GgmlType::F16) {
      for (float x : v) pod(out, float_to_f16(x).bits);
    } else {
      for (size_t b = 0; b < v.size() / 32; ++b) {
        const float* x = v.data() + b * 32;
        float amax = 0.0f, signed_max = 0.0f;
        for (int j = 0; j < 32; ++j)
          if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            signed_max = x[j];
          }
        if (type == GgmlType::Q8_0) {  // d = amax / 127, q = round(x / d)
          const f16 d = float_to_f16(amax / 127.0f);
          const float id = amax > 0 ? 1.0f / f16_to_float(d) : 0.0f;
          pod(out, d.bits);
          for (int j = 0; j < 32; ++j) pod(out, static_cast<int8_t>(std::nearbyint(x[j] * id)));
        } else {  // Q4_0: d = max / -8, q = clamp(round(x / d) + 8, 0, 15), nibbles j | j+16
          const f16 d = float_to_f16(signed_max / -8.0f);
          const float id = signed_max != 0 ? 1.0f / f16_to_float(d) : 0.0f;
          pod(out, d.bits);
          for (int j = 0; j < 16; ++j) {
            const auto q = [&](int i) {
              return static_cast<uint8_t>(std::clamp(std::nearbyint(x[i] * id) + 8.0f, 0.0f, 15.0f));
            };
            pod(out, static_cast<uint8_t>(q(j) | (q(j + 16) << 4)));
          }
        }
      }
    }
    return out;
  }

  std::vector<uint8_t> meta_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

std::vector<float> read_floats(const io::SafetensorsFile& f, const std::string& name) {
  const TensorView v = f.view(name);
  return std::vector<float>(v.as<const float>(), v.as<const float>() + v.numel());
}

// llama.cpp's permutation of Wq/Wk rows: within each head, row 2i <- i and
// row 2i + 1 <- i + d/2, so that RoPE pairs (2i, 2i+1) are HF's (i, i + d/2).
std::vector<float> permute_rows(const std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t cols) {
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < head_dim / 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int64_t dst = h * head_dim + 2 * i + j, src = h * head_dim + j * head_dim / 2 + i;
        std::memcpy(&out[static_cast<size_t>(dst * cols)], &w[static_cast<size_t>(src * cols)],
                    static_cast<size_t>(cols) * sizeof(float));
      }
  return out;
}

// A golden model as a GGUF file whose linear layers are of type `linear`.
// llama: Wq/Wk rows permuted, llama3 scaling as rope_freqs; qwen3: neither
// (llama.cpp runs qwen3 with half-style RoPE), q/k norms as attn_{q,k}_norm.
fs::path write_golden_gguf(const std::string& name, GgmlType linear) {
  const engine::Model hf = engine::load_model(golden_dir(name));
  const engine::ModelConfig& c = hf.config;
  const bool llama = name == "llama";
  const io::SafetensorsFile f = io::SafetensorsFile::open(golden_dir(name) / "model.safetensors");
  GgufWriter w;
  const std::string a = name + ".";
  w.kv_string("general.architecture", name);
  w.kv_u32(a + "block_count", static_cast<uint32_t>(c.num_layers));
  w.kv_u32(a + "embedding_length", static_cast<uint32_t>(c.hidden));
  w.kv_u32(a + "feed_forward_length", static_cast<uint32_t>(c.intermediate));
  w.kv_u32(a + "attention.head_count", static_cast<uint32_t>(c.num_heads));
  w.kv_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  w.kv_u32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.kv_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_eps));
  w.kv_f32(a + "rope.freq_base", static_cast<float>(c.rope_theta));
  w.kv_u32(a + "context_length", 512);
  if (c.rope_scaling.llama3) {
    // llama3 scaling as llama.cpp stores it: divisors of the plain frequencies.
    engine::ModelConfig plain = c;
    plain.rope_scaling = {};
    const std::vector<float> base = engine::rope_inv_freq(plain), scaled = engine::rope_inv_freq(c);
    std::vector<float> factors(base.size());
    for (size_t i = 0; i < base.size(); ++i) factors[i] = base[i] / scaled[i];
    w.tensor("rope_freqs.weight", factors, 0, static_cast<int64_t>(factors.size()), GgmlType::F32);
  }
  w.tensor("token_embd.weight", read_floats(f, "model.embed_tokens.weight"), c.vocab, c.hidden, GgmlType::F32);
  if (!c.tied_embeddings) w.tensor("output.weight", read_floats(f, "lm_head.weight"), c.vocab, c.hidden, linear);
  w.tensor("output_norm.weight", read_floats(f, "model.norm.weight"), 0, c.hidden, GgmlType::F32);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", b = "blk." + std::to_string(l) + ".";
    w.tensor(b + "attn_norm.weight", read_floats(f, p + "input_layernorm.weight"), 0, c.hidden, GgmlType::F32);
    w.tensor(b + "ffn_norm.weight", read_floats(f, p + "post_attention_layernorm.weight"), 0, c.hidden, GgmlType::F32);
    if (c.qk_norm) {
      w.tensor(b + "attn_q_norm.weight", read_floats(f, p + "self_attn.q_norm.weight"), 0, c.head_dim, GgmlType::F32);
      w.tensor(b + "attn_k_norm.weight", read_floats(f, p + "self_attn.k_norm.weight"), 0, c.head_dim, GgmlType::F32);
    }
    std::vector<float> wq = read_floats(f, p + "self_attn.q_proj.weight"), wk = read_floats(f, p + "self_attn.k_proj.weight");
    if (llama) {
      wq = permute_rows(wq, c.num_heads, c.head_dim, c.hidden);
      wk = permute_rows(wk, c.num_kv_heads, c.head_dim, c.hidden);
    }
    w.tensor(b + "attn_q.weight", wq, c.q_dim(), c.hidden, linear);
    w.tensor(b + "attn_k.weight", wk, c.kv_dim(), c.hidden, linear);
    w.tensor(b + "attn_v.weight", read_floats(f, p + "self_attn.v_proj.weight"), c.kv_dim(), c.hidden, linear);
    w.tensor(b + "attn_output.weight", read_floats(f, p + "self_attn.o_proj.weight"), c.hidden, c.q_dim(), linear);
    w.tensor(b + "ffn_gate.weight", read_floats(f, p + "mlp.gate_proj.weight"), c.intermediate, c.hidden, linear);
    w.tensor(b + "ffn_up.weight", read_floats(f, p + "mlp.up_proj.weight"), c.intermediate, c.hidden, linear);
    w.tensor(b + "ffn_down.weight", read_floats(f, p + "mlp.down_proj.weight"), c.hidden, c.intermediate, linear);
  }
  const fs::path path = fs::temp_directory_path() /
                        ("lowbit_engine_golden_" + name + "_" + gguf::ggml_type_name(linear) + "_" + std::to_string(::getpid()) + ".gguf");
  w.write(path);
  return path;
}

class GgufModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufModel, F32MatchesTransformers) {
  const fs::path path = write_golden_gguf(GetParam(), GgmlType::F32);
  const engine::Model m = engine::load_model(path);
  EXPECT_EQ(m.source_format, "gguf");
  const bool llama = GetParam() == "llama";
  EXPECT_EQ(m.config.rope_style, llama ? engine::RopeStyle::interleaved : engine::RopeStyle::half);
  EXPECT_EQ(m.config.tied_embeddings, !llama);
  EXPECT_EQ(m.config.qk_norm, !llama);
  const io::SafetensorsFile g = io::SafetensorsFile::open(golden_dir(GetParam()) / "golden.safetensors");
  const TensorView t = g.view("tokens");
  const std::vector<int32_t> tokens(t.as<const int32_t>(), t.as<const int32_t>() + t.numel());
  engine::CpuBackendOptions o;
  o.kv.k = o.kv.v = engine::KvStorage::fp32;
  o.kv.max_tokens = 64;
  auto b = engine::make_cpu_backend(m, o);
  const std::vector<float> ours = run_positions(*b, tokens, 10);
  EXPECT_LE(max_relative_error(ours, read_floats(g, "logits")), kEngineLogitsMaxRelError) << GetParam();
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Models, GgufModel, ::testing::Values("llama", "qwen3"),
                         [](const auto& param_info) { return std::string(param_info.param); });

class GgufTypes : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgufTypes, LayersLoadExactlyAsTheReferenceDequantizerReadsThem) {
  const fs::path path = write_golden_gguf("llama", GetParam());
  const engine::Model m = engine::load_model(path);
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const engine::MatrixFormat want = GetParam() == GgmlType::Q8_0   ? engine::MatrixFormat::q8
                                    : GetParam() == GgmlType::Q4_0 ? engine::MatrixFormat::w4
                                                                   : engine::MatrixFormat::f16;
  const auto check = [&](const engine::WeightMatrix& w, const std::string& name) {
    EXPECT_EQ(w.format, want) << name;
    const std::vector<float> ref = gguf::dequantize_to_f32(file, file.tensor(name));
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      w.dequant_row(r, row.data());
      // Equal values (Q4_0's d*(q - 8) may be -0 where our s*q + m is +0).
      for (int64_t c = 0; c < w.cols; ++c)
        ASSERT_EQ(row[static_cast<size_t>(c)], ref[static_cast<size_t>(r * w.cols + c)]) << name << " [" << r << ", " << c << "]";
    }
  };
  for (size_t l = 0; l < m.weights.layers.size(); ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    check(m.weights.layers[l].wq, b + "attn_q.weight");
    check(m.weights.layers[l].w_down, b + "ffn_down.weight");
    check(m.weights.layers[l].w_up, b + "ffn_up.weight");
  }
  check(*m.weights.lm_head, "output.weight");
  // And the model still computes roughly the same function (8-bit: close; 4-bit: near).
  const io::SafetensorsFile g = io::SafetensorsFile::open(golden_dir("llama") / "golden.safetensors");
  const TensorView t = g.view("tokens");
  const std::vector<int32_t> tokens(t.as<const int32_t>(), t.as<const int32_t>() + t.numel());
  auto backend = engine::make_cpu_backend(m);
  const double err = max_relative_error(run_positions(*backend, tokens, 10), read_floats(g, "logits"));
  EXPECT_LT(err, GetParam() == GgmlType::Q4_0 ? 0.5 : 0.05) << gguf::ggml_type_name(GetParam());
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Types, GgufTypes, ::testing::Values(GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16),
                         [](const auto& param_info) { return gguf::ggml_type_name(param_info.param); });

}  // namespace
}  // namespace lowbit::test
