// A paged KV cache that stores K and V quantized (TurboQuant tq4/tq3/tq2) or
// as fp16, with per-sequence block tables (vLLM-style paging).
//
// Layout facts (what a GPU kernel reads; all offsets in bytes):
//  - A page holds page_size consecutive tokens (P, a multiple of 16 in
//    [16, 256]) of one sequence, for every layer and KV head. Pages are
//    numbered 0 .. num_pages-1; a sequence's block table (int32) lists its
//    pages in token order: token t lives in page block_table[t / P], slot t % P.
//    The same table serves every layer.
//  - Each layer has its own pool, one contiguous buffer (64-byte aligned) of
//    num_pages * num_kv_heads slabs; the slab of (page p, KV head h) starts at
//    (p * num_kv_heads + h) * layout().bytes.
//  - A slab holds, in order (PageLayout gives the offsets):
//      K rows   [P][k_row_bytes]   packed indices (vector_quantizer.h) or fp16 values
//      K scales [P]                f16 or f32; absent (0 bytes) when K is fp16
//      V rows   [P][v_row_bytes]
//      V scales [P]
//    Every section is a multiple of 16 bytes (P % 16 == 0 and head_dim %
//    32 == 0), so every section starts 16-byte aligned and is read with
//    coalesced 16-byte loads: consecutive threads take consecutive 16-byte
//    vectors of the K rows (tq4, d = 128: 4 threads per token, 32
//    coordinates each), the scales of P tokens are 2P contiguous bytes, and
//    one page of one head (P * 132 bytes for tq4/f16 K+V) is a single
//    contiguous range, which a TMA bulk copy can fetch whole.
//  - Quantized rows are in the layer's rotated domain (rotation.h: one rotation
//    per layer, seed seed_base + 1000 * layer, shared by K, V and all heads);
//    fp16 rows are the original vectors.
//  - Memory: bytes_per_token() = num_layers * num_kv_heads * (K vector bytes +
//    V vector bytes); tq4 with f16 scales at d = 128 is 64 + 2 = 66 bytes per
//    vector (fp16: 256), 3.88x smaller.
//
// Writing: extend(seq, n) allocates slots for n more tokens (once per step,
// for all layers); then write() (prefill: many tokens, multithreaded) or
// write_token() (decode: one token) quantizes each layer's K/V into them.
// Not thread-safe for concurrent modification; reads may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/kv/codebook.h"
#include "lowbit/kv/rotation.h"
#include "lowbit/kv/vector_quantizer.h"

namespace lowbit::kv {

inline constexpr int kMinPageSize = 16;
inline constexpr int kMaxPageSize = 256;
inline constexpr int kPageSizeMultiple = 16;

struct KvCacheConfig {
  int num_layers = 1;
  int num_kv_heads = 8;
  int head_dim = 128;
  int page_size = 128;    // tokens per page: a multiple of 16 in [16, 256]
  int64_t num_pages = 0;  // pages in the pool, >= 1 (each: page_size tokens of every layer and head)
  KvFormat k_format = KvFormat::tq4;
  KvFormat v_format = KvFormat::tq4;
  ScaleDType scale_dtype = ScaleDType::f16;
  bool renormalize = true;  // see vector_quantizer.h, step 5
  CoordinateDistribution codebook = CoordinateDistribution::gaussian;
  RotationKind rotation = RotationKind::haar;
  uint64_t rotation_seed_base = kDefaultRotationSeedBase;  // layer l: base + 1000 * l

  // Throws Error(invalid_argument) naming the first bad field.
  void validate() const;
};

// Which half of the cache.
enum class KvPart : uint8_t { key, value };

// Offsets of the sections of one (page, KV head) slab, in bytes.
struct PageLayout {
  int64_t k_rows = 0, k_scales = 0, v_rows = 0, v_scales = 0;
  int64_t bytes = 0;  // the slab's size
  int64_t k_row_bytes = 0, v_row_bytes = 0;
  int64_t k_scale_bytes = 0, v_scale_bytes = 0;  // per token; 0 for fp16
};

class PagedKvCache {
 public:
  // Validates the config, builds one rotation per layer, allocates and zeroes
  // the pools (an unwritten slot decodes to the zero vector).
  explicit PagedKvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  const PageLayout& layout() const { return layout_; }
  const Rotation& rotation(int layer) const;
  KvFormat format(KvPart part) const { return part == KvPart::key ? config_.k_format : config_.v_format; }
  // The quantizer of K or V; nullptr when that part is fp16.
  const VectorQuantizer* quantizer(KvPart part) const;
  // True when the part is stored in the rotated domain (every tq format).
  bool stored_rotated(KvPart part) const { return is_quantized(format(part)); }

  // ---- sequences and pages ----
  int add_sequence();              // a new empty sequence; returns its id
  void release_sequence(int seq);  // returns its pages to the pool; the id may be reused
  // Grows `seq` by n_tokens (>= 1), taking pages from the pool as needed (all
  // or nothing); returns the position of the first new token.
  int64_t extend(int seq, int64_t n_tokens);
  int64_t length(int seq) const;
  std::span<const int32_t> block_table(int seq) const;
  int64_t free_pages() const { return static_cast<int64_t>(free_pages_.size()); }
  int64_t used_pages() const { return config_.num_pages - free_pages(); }

  // ---- writing ----
  // k, v: [n_tokens][num_kv_heads][head_dim] fp32, the tokens at positions
  // first_pos .. first_pos + n_tokens - 1 (< length(seq)) of layer `layer`.
  void write(int layer, int seq, int64_t first_pos, int64_t n_tokens, std::span<const float> k,
             std::span<const float> v);
  // One token (decode): k, v [num_kv_heads][head_dim].
  void write_token(int layer, int seq, int64_t pos, std::span<const float> k, std::span<const float> v) {
    write(layer, seq, pos, 1, k, v);
  }

  // ---- reading ----
  // The slab of (page, KV head) in layer `layer`.
  const std::byte* slab(int layer, int32_t page, int kv_head) const;
  // The layer's whole pool (what a device copy uploads).
  std::span<const std::byte> layer_pool(int layer) const;
  // Decodes slot `slot` of a slab into its stored domain: `unit` gets c[idx]
  // (the centroids, rotated domain) and the return value is the scale, so the
  // vector is scale * unit; for fp16 `unit` gets the values and the scale is 1.
  float decode_slot(KvPart part, const std::byte* slab, int slot, std::span<float> unit) const;
  // The vector of token `pos` of `seq`: in its stored domain (scale applied),
  // or in the original domain (quantized parts un-rotated).
  void read_stored(KvPart part, int layer, int seq, int64_t pos, int kv_head, std::span<float> out) const;
  void read_original(KvPart part, int layer, int seq, int64_t pos, int kv_head, std::span<float> out) const;

  // ---- memory ----
  int64_t bytes_per_token_per_layer() const;  // num_kv_heads * (K + V vector bytes)
  int64_t bytes_per_token() const;            // all layers
  int64_t page_bytes() const;                 // one page: every layer and head
  int64_t pool_bytes() const;                 // everything allocated: num_pages * page_bytes()

  // ---- argument checks shared with the attention references ----
  void check_layer(int layer) const;
  void check_sequence(int seq, std::string_view name = "seq") const;

 private:
  struct Sequence {
    bool active = false;
    int64_t length = 0;
    std::vector<int32_t> pages;
  };
  std::byte* mutable_slab(int layer, int32_t page, int kv_head);

  KvCacheConfig config_;
  PageLayout layout_;
  std::vector<Rotation> rotations_;
  std::unique_ptr<VectorQuantizer> k_quantizer_, v_quantizer_;
  std::vector<Buffer> pools_;
  std::vector<int32_t> free_pages_;  // a stack; the lowest page number on top
  std::vector<Sequence> sequences_;
};

}  // namespace lowbit::kv
