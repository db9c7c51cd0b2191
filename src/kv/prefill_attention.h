// The tiled causal prefill kernel on the paged cache (prefill_attention.cu),
// as device_attention.cu's run_attention calls it. Internal to the kv module.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lowbit::kv::attention_mma {

// One call: query tokens 0 .. n_tokens - 1 of one row at positions
// first_pos .. first_pos + n_tokens - 1, every KV head, KV chunks of
// split_tokens. The outputs are what the decode kernel leaves for the merge
// kernel: per (token, query head, chunk) the chunk's normalized output (in
// V's rotated domain) and its log-sum-exp in log2 units.
struct TiledPrefillArgs {
  const std::byte* pool = nullptr;
  int64_t slab_bytes = 0;
  int64_t k_rows = 0, k_scales = 0, v_rows = 0, v_scales = 0;  // slab offsets
  int scale_bytes = 2;                                         // 2 (f16) or 4 (f32)
  int num_kv_heads = 0, group = 0, num_q_heads = 0, page_size = 0;
  const int32_t* table = nullptr;  // the row's block table
  int first_pos = 0;
  int n_tokens = 0;
  // DeviceDecodeOptions::window: query p attends the keys up to p - window
  // (the causal mask shifted; the newer ones are the window kernel's).
  int window = 0;
  const float* q = nullptr;  // [n_tokens][num_q_heads][d]
  // Hadamard-rotated K: the kernel rotates each query with these signs and
  // multiplies by q_rotate_scale. Otherwise (null) it multiplies q by
  // q_scale: 1 for queries rotated and scaled before, softmax_scale *
  // log2(e) for fp16 K.
  const float* q_signs = nullptr;
  float q_rotate_scale = 1.0f;
  float q_scale = 1.0f;
  int split_tokens = 0;  // a multiple of 16
  int max_splits = 0;
  float* part_out = nullptr;  // [n_tokens][num_q_heads][max_splits][d]
  float* part_lse = nullptr;  // [n_tokens][num_q_heads][max_splits]
  float k_centroids[16] = {}, v_centroids[16] = {};
};

// Warps per CTA for `group` query heads per KV head (each warp owns 16 rows
// of (query token, head) pairs), and the query tokens a CTA covers.
int tiled_prefill_warps(int group);
int tiled_prefill_tokens_per_cta(int group);

// The KV chunk a call uses when the caller gives none: enough CTAs for two
// waves, chunks of whole 64-key tiles.
int64_t tiled_prefill_split_tokens(int n_tokens, int64_t max_length, int num_kv_heads, int group, int sm_count);

// Whether the kernel's shared memory for these formats and group fits the
// current device's per-block opt-in limit (227 KB on sm_90, 163 KB on sm_80,
// ~99 KB on sm_86/89: there the prefill keeps the decode kernel).
bool tiled_prefill_fits(int kf, int vf, int head_dim, int group);

// kf, vf: device_attention.cu's Fmt codes; head_dim 64 or 128. Launched with
// programmatic dependent launch, grid (query blocks, KV heads, max_splits).
void launch_tiled_prefill(int kf, int vf, int head_dim, const TiledPrefillArgs& a, cudaStream_t stream);

}  // namespace lowbit::kv::attention_mma
