// The device-agnostic description of a decoder-only transformer of the Llama
// family (Llama 1/2/3, SmolLM, Mistral without sliding windows) and Qwen3.
// Every backend (CPU today, CUDA later) runs the same arithmetic from it:
//
//   x = embed[token]
//   per layer:  h = rmsnorm(x) * attn_norm
//               q, k, v = h Wq^T, h Wk^T, h Wv^T        (+ bias when present)
//               Qwen3:  q, k = rmsnorm_per_head(q) * q_norm, rmsnorm_per_head(k) * k_norm
//               q, k = rope(q, k, position)
//               x += attention(q, K cache, V cache) Wo^T   (GQA: q head g reads kv head
//                                                          g / (num_heads / num_kv_heads))
//               h = rmsnorm(x) * ffn_norm
//               x += (silu(h Wg^T) * (h Wu^T)) Wd^T        (SwiGLU)
//   logits = (rmsnorm(x) * final_norm) Wlm^T             (Wlm = embed when tied)
//
// RoPE pairs: Hugging Face checkpoints rotate coordinate i with i + head_dim/2
// ("half" style, rotate_half); llama.cpp's converter permutes the rows of
// Wq and Wk of Llama-architecture GGUF files so that adjacent coordinates
// (2i, 2i+1) form the pairs ("interleaved"). Both describe the same model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lowbit/io/hf_config.h"
#include "lowbit/ops/layer_ops_ref.h"

namespace lowbit::engine {

enum class Architecture : uint8_t { llama, qwen3 };
const char* architecture_name(Architecture a);  // "llama", "qwen3"

// The layer ops' RoPE pairing, one type for the model description and the
// kernels: half = pairs (i, i + d/2), Hugging Face rotate_half; interleaved =
// pairs (2i, 2i + 1), Llama GGUF files (Wq/Wk rows permuted by the converter).
using RopeStyle = ops::RopeStyle;

// rope_scaling of config.json. Only "llama3" changes the frequencies here;
// "default" (or absent) is plain RoPE. Other types are rejected on load.
struct RopeScaling {
  bool llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::llama;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  int64_t max_position = 0;  // the trained context (0: unknown)
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeStyle rope_style = RopeStyle::half;
  RopeScaling rope_scaling;
  // Per-frequency divisors of the inverse frequencies (GGUF's rope_freqs
  // tensor, how llama.cpp stores Llama 3.1 scaling); empty: none.
  std::vector<float> rope_freq_factors;
  bool tied_embeddings = false;
  bool qk_norm = false;         // Qwen3: per-head RMSNorm of q and k before RoPE
  bool attention_bias = false;  // q/k/v projections carry a bias
  int64_t bos_token = -1;       // -1: unknown
  int64_t eos_token = -1;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Throws Error(format) naming the first inconsistent field.
  void validate() const;
  // "llama: 30 layers, hidden 576, heads 9/3 x 64, ffn 1536, vocab 49152, ..."
  std::string describe() const;
};

// From a parsed config.json. model_type "llama", "mistral" (no sliding
// window), "smollm"... (anything with LlamaForCausalLM/MistralForCausalLM)
// maps to llama, "qwen3" to qwen3 (qk_norm on). Throws Error(unsupported) for
// other architectures and rope_scaling types, naming them.
ModelConfig config_from_hf(const io::HfConfig& hf);

// The RoPE inverse frequencies (head_dim / 2 of them), llama3 scaling applied,
// computed as transformers does (fp32 powers of theta) so logits match it.
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace lowbit::engine
