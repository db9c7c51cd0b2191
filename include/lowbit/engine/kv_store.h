// The engine's KV cache, per sequence and layer, behind one interface:
//  - dense (K and V both fp32, or both fp16): contiguous per-sequence arrays
//    [token][kv_head][head_dim], attention computed here (fp32 accumulation);
//  - paged TurboQuant (K and/or V tq4/tq3/tq2, the other may be fp16): the kv
//    module's PagedKvCache (paged_cache.h). Attention follows its reference
//    kernels' arithmetic (attention_ref.h, which the GPU kernels mirror): the
//    query is rotated once and scored against the stored centroids, values
//    are summed in the rotated domain and the output un-rotated once; here
//    on the engine's thread pool, each K/V slot decoded once per query group.
// Attention is causal: the query at position p sees keys 0..p; query head g
// reads KV head g / (num_heads / num_kv_heads) (GQA).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "lowbit/engine/model_config.h"
#include "lowbit/engine/thread_pool.h"
#include "lowbit/kv/rotation.h"

namespace lowbit::engine {

enum class KvStorage : uint8_t { fp32, fp16, tq4, tq3, tq2 };
const char* kv_storage_name(KvStorage s);  // "fp32", "fp16", "tq4", "tq3", "tq2"
std::optional<KvStorage> parse_kv_storage(std::string_view name);

struct KvOptions {
  KvStorage k = KvStorage::fp16;
  KvStorage v = KvStorage::fp16;
  int64_t max_tokens = 4096;  // per sequence (prompt + generated)
  int max_sequences = 1;      // sequences alive at once
  int page_size = 32;         // tokens per page (paged formats)
  uint64_t rotation_seed = 42;  // TurboQuant rotations: seed + 1000 * layer
  // Haar (the seed's QR rotation) or randomized Hadamard (the signs and a
  // fast Walsh-Hadamard transform: cheaper, and on CUDA the decode step's
  // QKV GEMM then rotates the queries itself; head_dim a power of two).
  // Unset: kv_rotation_for below.
  std::optional<kv::RotationKind> rotation;
  // Paged formats: attend with the kv module's reference kernels
  // (attention_ref.h) instead of the engine's pooled loop (tests compare them).
  bool reference_attention = false;
  // Paged formats: the newest `fp16_window` tokens of each sequence are
  // attended from fp16 copies of their K/V, as an fp16 cache holds them,
  // instead of from their 4/3/2-bit codes (every token is still quantized
  // into the paged cache when written; it is read from there once it is
  // older than the window): the query at position pos reads positions
  // pos - fp16_window + 1 .. pos from the copies, so a prompt gives the same
  // result prefilled in one block or in several. The window costs 4 * kv_dim
  // bytes per token of it, per layer and sequence, whatever the context
  // length (and, while a prompt block is written and attended, its tokens').
  // Positions are written in order (KvStore::write throws otherwise).
  // Why: on SmolLM2-135M the greedy choice of tq4 K/V agrees with fp16 K/V
  // on 89.8% of 256 decode steps without it and on 98.4% with 64 tokens, and
  // over a 6k-token text tq4 K/V cost 8.4% perplexity without it and 0.7%
  // with 64 (docs/engine.md, "An fp16 window of recent tokens").
  // The CUDA backend keeps the copies in rings on the device
  // (kv/device_window.h, CudaEngineOptions::fp16_window).
  // 0: none. No effect when K and V are both dense (fp32 or fp16).
  int64_t fp16_window = 0;
  // Whether the window applies: a positive fp16_window and a tq K or V.
  bool has_fp16_window() const;

  // Throws Error(invalid_argument): fp32 mixed with another format, a
  // non-positive size, a negative window, a window with reference_attention
  // (the kv module's kernels have none).
  void validate() const;
  std::string describe() const;  // "K tq4, V fp16", then ", newest 64 tokens also fp16" with a window
};

class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual int add_sequence() = 0;
  virtual void release_sequence(int seq) = 0;
  // Makes room for n more tokens of seq; returns the position of the first.
  // Error(invalid_argument) past max_tokens.
  virtual int64_t extend(int seq, int64_t n) = 0;
  virtual int64_t length(int seq) const = 0;
  // k, v: [n][num_kv_heads][head_dim] for positions first_pos .. first_pos + n - 1.
  virtual void write(int layer, int seq, int64_t first_pos, int64_t n, std::span<const float> k,
                     std::span<const float> v) = 0;
  // q, out: [n][num_heads][head_dim], queries at positions first_pos.. (already written).
  virtual void attend(int layer, int seq, int64_t first_pos, int64_t n, std::span<const float> q, std::span<float> out,
                      ThreadPool* pool) const = 0;
  // Bytes one token takes over all layers, and bytes held for the tokens now stored.
  virtual int64_t bytes_per_token() const = 0;
  virtual int64_t bytes_used() const = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<KvStore> make_kv_store(const ModelConfig& config, const KvOptions& options);

// The rotation a cache of this head dimension uses: `chosen` when set, else
// Hadamard when head_dim is a power of two (on SmolLM2 it measured the
// lower perplexity of the two with tq4 K/V: docs/engine.md), else Haar.
kv::RotationKind kv_rotation_for(std::optional<kv::RotationKind> chosen, int64_t head_dim);

}  // namespace lowbit::engine
