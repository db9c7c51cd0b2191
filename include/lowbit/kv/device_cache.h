// The paged TurboQuant KV cache on a CUDA device, and the kernels that write
// it (quantize + append) and attend over it (decode, causal prefill).
//
// Layout: byte for byte the layout of PagedKvCache (paged_cache.h): one pool
// per layer of num_pages * num_kv_heads slabs, the same PageLayout, the same
// packed indices and scales, the same rotation per layer. So a host pool can
// be uploaded and a device pool downloaded and compared with memcmp.
// Pages are still allocated on the host (PagedKvCache or the caller's own
// allocator); the device gets the block tables (DeviceBlockTables) of the
// sequences a call works on.
//
// What the kernels do (docs/kv-cache.md has the why):
//  - write: one CTA of 128 threads (one per coordinate) quantizes batches of 8
//    K/V vectors with the layer's rotation in shared memory, with the host
//    quantizer's arithmetic (fp32 products and sums in the same order, IEEE
//    division, double norms), so indices and scales match the CPU's.
//  - decode: q is rotated once per query head (a small kernel), one CTA per
//    (sequence, KV head, KV chunk) streams the chunk's pages with cp.async
//    and scores all query heads of the KV head together on tensor cores
//    (mma.m16n8k16, fp16 operands, fp32 accumulation): the packed indices
//    become fp16 centroid pairs through a 256-entry table in shared memory,
//    scores stay in the rotated domain, values are accumulated rotated; a
//    merge kernel combines the chunks (exact log-sum-exp merge) and
//    un-rotates each output once.
//  - prefill: the decode kernel with one row per query token, each attending
//    causally to the tokens up to its own position (correct, not fast: the
//    K/V of the block are re-read per query token, mostly from L2).
// Restrictions of the device path: head_dim 64 or 128, at most 8 query heads per KV
// head. The write kernel does not validate values (that would need a device
// to host round trip per step): a non-finite K/V or a scale beyond f16's
// range stores a non-finite scale, which attention turns into NaN outputs
// (visible, never a plausible wrong number).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/kv/append_target.h"
#include "lowbit/kv/device_window.h"
#include "lowbit/kv/paged_cache.h"

namespace lowbit::kv {

// The head dimensions the CUDA kernels are compiled for: 128 (Llama, Qwen3)
// and 64 (SmolLM2 and other small models).
constexpr bool device_head_dim_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }
inline constexpr int kDeviceMaxGroup = 8;

class DeviceKvCache {
 public:
  // Allocates and zeroes the pools on the current device, uploads the
  // rotations. Throws Error(invalid_argument) for a config the device path
  // does not support (head_dim other than 64 or 128).
  explicit DeviceKvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  const PageLayout& layout() const { return layout_; }
  int64_t pool_bytes() const { return pool_bytes_; }  // one layer
  std::byte* pool(int layer) const;
  // The layer's rotation M (row-major fp32, rotation.h) and its transpose.
  const float* rotation(int layer) const;
  const float* rotation_t(int layer) const;
  // Hadamard signs (d floats) of the layer; nullptr for haar.
  const float* hadamard_signs(int layer) const;
  const VectorQuantizer* quantizer(KvPart part) const {
    return part == KvPart::key ? k_quantizer_.get() : v_quantizer_.get();
  }
  // The part's codebook on the device: 16 fp32 boundaries (the first
  // 2^bits - 1 used), then 16 centroids. Zeros for an fp16 part.
  const float* device_codebook(KvPart part) const;

  // Copies every layer's pool from / to a host cache of the same config.
  void upload(const PagedKvCache& host);
  std::vector<std::byte> download_pool(int layer) const;

 private:
  KvCacheConfig config_;
  PageLayout layout_;
  int64_t pool_bytes_ = 0;
  std::vector<Buffer> pools_, rotations_, rotations_t_, signs_;
  std::unique_ptr<VectorQuantizer> k_quantizer_, v_quantizer_;
  Buffer codebooks_;  // per part: 16 boundaries, then 16 centroids (fp32)
};

// Block tables and lengths of the sequences (rows) of one call, on the device.
struct DeviceBlockTables {
  Buffer tables;   // int32 [rows][stride]
  Buffer lengths;  // int32 [rows]
  int rows = 0;
  int64_t stride = 0;
  std::vector<int64_t> host_lengths;
  int64_t max_length = 0;

  // The tables and lengths of `seqs` of a host cache.
  static DeviceBlockTables from_cache(const PagedKvCache& cache, std::span<const int> seqs);
  // From explicit tables (each at least ceil(length / page_size) pages);
  // the device copies are complete when it returns.
  static DeviceBlockTables from_host(std::span<const std::vector<int32_t>> tables,
                                     std::span<const int64_t> lengths, int page_size);
  // The same, in place: keeps the device buffers when they are large enough
  // (no allocation, so no implicit synchronization, per decode step) and
  // copies on `stream`, ordered after the kernels that read the old values.
  void assign(std::span<const std::vector<int32_t>> tables, std::span<const int64_t> lengths, int page_size,
              cudaStream_t stream);
};

// Which kernel quantizes and stores K/V (device_append_tokens,
// device_write_tokens). Both store the same bytes (tested):
//  - automatic: one warp per vector (append_warp.cuh, the decode attention's
//    own append) wherever the rotation allows it, i.e. Hadamard rotations or
//    fp16 parts only; else the per-coordinate kernel;
//  - per_coordinate: one thread per coordinate, eight vectors per CTA (the
//    only one that applies a Haar rotation's 64 KB matrix).
enum class KvWriteKernel { automatic, per_coordinate };

// Quantizes and stores one token per row: row b's k/v ([rows][num_kv_heads]
// [head_dim] fp32, device) go to position lengths[b] - 1 of row b (the caller
// extended the sequence first, as with PagedKvCache::write_token).
void device_append_tokens(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables,
                          const float* k, const float* v, cudaStream_t stream = nullptr,
                          KvWriteKernel kernel = KvWriteKernel::automatic);
// What device_append_tokens does, for a kernel that quantizes and stores the
// K/V vectors itself, one warp per vector (append_warp.cuh; the decode
// attention with DeviceDecodeOptions::append_k): the layer's pool and
// codebooks and the tables' device pointers (valid while `tables` keeps its
// buffers). Only the Hadamard rotation can be applied there:
// Error(unsupported) for a cache with quantized parts and Haar rotations.
KvAppendTarget device_append_target(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables);

// Quantizes and stores tokens first_pos .. first_pos + n_tokens - 1 of row
// `row` (k, v: [n_tokens][num_kv_heads][head_dim] fp32, device).
void device_write_tokens(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int row,
                         int64_t first_pos, int64_t n_tokens, const float* k, const float* v,
                         cudaStream_t stream = nullptr, KvWriteKernel kernel = KvWriteKernel::automatic);

// Scratch memory of the attention calls (rotated queries, split partials).
// Grows on demand; one per stream.
class AttentionWorkspace {
 public:
  float* q_rotated(size_t floats);
  float* partial_out(size_t floats);
  float* partial_lse(size_t floats);

 private:
  Buffer q_, out_, lse_;
};

struct DeviceDecodeOptions {
  float softmax_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  int64_t split_tokens = 0;    // KV chunk per CTA, a multiple of 16; 0: chosen by decode_split_tokens
  // CTA layout when K and V are both packed (tq2/3/4): 0 chooses (by the
  // work per call), 8 or 16 warps force one (tests). Ignored with fp16 K or V.
  int cta_warps = 0;
  // When set, the output is written here as fp16 (same layout, each value the
  // fp32 result rounded once) and `out` is not used (it may be null): the
  // engine's next GEMM reads fp16, and a separate conversion kernel per layer
  // costs more launch time than it moves bytes.
  void* out_f16 = nullptr;
  // Decode only: plan the chunks (and size the launches) for rows of this
  // many tokens instead of the tables' longest row, when it is longer. Chunks
  // past a row's end exit at once. A caller that rounds the length up (the
  // engine: to a multiple of 256 tokens) gets the same launches, argument for
  // argument, for many consecutive steps: what a CUDA graph replay needs.
  int64_t plan_length = 0;
  // Decode with quantized K only: q is already rotated and scaled, q @ M *
  // softmax_scale * log2(e) (the rotation kernel's output; kv/hadamard_warp.cuh
  // hadamard_rotate_warp for a Hadamard cache), so the queries are not
  // rotated here. The chunk holding each row's newest token is then read
  // only after the kernel before this call completed (the kernel that made
  // q may have been launched right after the append).
  bool queries_rotated = false;
  // Decode only: each row's newest token (at lengths[r] - 1, the sequence
  // already extended) is not in the cache yet; its K and V are here
  // ([rows][num_kv_heads][head_dim] fp32, device, as device_append_tokens
  // takes them), and the attention stores them, with device_append_tokens's
  // bytes, before it reads them: the CTA holding a row's last chunk, one warp
  // for K and one for V (append_warp.cuh). One kernel fewer on a decode
  // step's critical path. Hadamard rotations or fp16 parts only
  // (device_append_target): Error(unsupported) with Haar.
  const float* append_k = nullptr;
  const float* append_v = nullptr;
  // When a row has at most 8 chunks (short rows, or many rows) on an sm_90
  // device, V is not Haar-rotated and every cluster of the call fits on the
  // device at once (cudaOccupancyMaxActiveClusters), the CTAs of one (row,
  // KV head) run as a cluster and merge their chunks through distributed
  // shared memory, with the merge kernel's arithmetic (the same bits): one
  // kernel fewer on a decode step's critical path. False: always the merge
  // kernel (tests, benchmarks).
  bool cluster_merge = true;
  // Prefill only: the tiled kernel, which decodes each key tile once per
  // block of query tokens (src/kv/prefill_attention.cu). False: the decode
  // kernel with one row per query token (the earlier path; tests and
  // benchmarks compare the two).
  bool prefill_tiled = true;
  // The decode kernel (decode, and prefill with prefill_tiled false) reads
  // the layer's pool through an L2 streaming window (cuda::L2StreamSpan in
  // lowbit/cuda/pdl.cuh): its pages are read once per call, and with normal
  // eviction they push out lines that other kernels read again and write
  // back dirty ones. Only a cache hint: the same bits either way (tests
  // compare). LOWBIT_L2_STREAMING=0 in the environment turns every such
  // window off.
  bool l2_streaming = true;
  // KvOptions::fp16_window on the device (device_window.h): a query at
  // position p (a decode row's newest token, or a prefill token) reads
  // positions p - window + 1 .. p from the window's fp16 copies and only the
  // older ones from the cache's codes. The window's part is attended by a
  // kernel of its own, one CTA per (row, KV head), before the code chunks;
  // its result is one more chunk for the merge kernel (no cluster merge; the
  // tiled prefill kernel shifts its causal mask by the window). The caller
  // stores each position's copies (device_window_write) before a call reads
  // them, or passes a decode step's newest K/V in window_k / window_v; with
  // append_k / append_v set to the same pointers the window's kernel also
  // stores their codes (else device_append_tokens does, before the call).
  const DeviceKvWindow* window = nullptr;
  // Device, [table rows]: each row's sequence slot in the window.
  const int32_t* window_slots = nullptr;
  // Decode only: each row's newest K/V ([rows][num_kv_heads][head_dim] fp32,
  // device), stored into the window by the window kernel before it reads
  // them. Null: stored already.
  const float* window_k = nullptr;
  const float* window_v = nullptr;
};

// What the decode attention multiplies the rotated queries by (its query
// rotation kernel's factor): softmax_scale (or 1 / sqrt(head_dim)) * log2(e),
// the softmax running on exp2. For callers that rotate the queries
// themselves (DeviceDecodeOptions::queries_rotated).
float decode_query_scale(const KvCacheConfig& config, const DeviceDecodeOptions& options);

// The chunk length the decode kernel uses when none is given (a multiple of
// 16): the split count that minimises waves x (tiles per CTA + a CTA's fixed
// cost) for rows * num_kv_heads * splits CTAs in waves of 2 CTAs per SM (1
// for 16-warp CTAs or when K or V is fp16), among the splits that give each
// warp of a CTA at least 4 tiles of 16 tokens or make at most one CTA per two
// SMs (16-warp CTAs: in one wave); a chunk longer than a page is a whole
// number of pages. CTAs have 4 warps when K or V is fp16; for packed K and V
// (head_dim 128), 16 when rows * num_kv_heads fit one wave of SMs with at
// least 16 tiles per SM over the call, and rows of at least 2048 tokens or
// more pairs than half the SMs; else 8.
// cta_warps: as DeviceDecodeOptions::cta_warps (0: the layout chosen as above).
int64_t decode_split_tokens(const KvCacheConfig& config, int rows, int64_t max_length, int sm_count,
                            int cta_warps = 0);

// Decode attention (attention_ref.h's paged_decode_attention_ref): q, out
// [rows][num_q_heads][head_dim] fp32 on the device. Every row's length >= 1.
void device_decode_attention(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables,
                             int num_q_heads, const float* q, float* out, AttentionWorkspace& workspace,
                             const DeviceDecodeOptions& options = {}, cudaStream_t stream = nullptr);

// Causal prefill attention (paged_prefill_attention_ref) for tokens
// first_pos .. first_pos + n_tokens - 1 of row `row`, already written.
// q, out [n_tokens][num_q_heads][head_dim] fp32 on the device.
void device_prefill_attention(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int row,
                              int64_t first_pos, int64_t n_tokens, int num_q_heads, const float* q, float* out,
                              AttentionWorkspace& workspace, const DeviceDecodeOptions& options = {},
                              cudaStream_t stream = nullptr);

}  // namespace lowbit::kv
