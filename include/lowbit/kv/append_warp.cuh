// One K or V vector quantized and stored into the paged cache by one warp
// (KvAppendTarget, append_target.h), for kernels that make the vector
// themselves: the W4A16 QKV GEMM's epilogue at a decode step, which then
// needs no KV append kernel after it.
//
// The arithmetic is the KV write kernel's (device_cache.cu), operation for
// operation, so the stored bytes are the same: that kernel runs one thread
// per coordinate and sums over its CTA as a 32-lane xor butterfly per warp
// of coordinates followed by the warps' sums in order; here lane l holds
// coordinates l + 32u and does the same butterfly once per u, then adds the
// u's in order. Only the Hadamard rotation is done here (hadamard_warp.cuh):
// a Haar rotation is a 64 KB matrix, which is the append kernel's job.
// Device code; include from .cu files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lowbit/kv/append_target.h"
#include "lowbit/kv/hadamard_warp.cuh"

namespace lowbit::kv {

// The write kernel's block_sum_double over D coordinates: per warp of 32
// coordinates (here: per u) the xor butterfly, lane 0's result, then the
// sum of those in increasing order. Every lane returns the total.
template <int D>
__device__ __forceinline__ double warp_sum_double_as_block(const double (&x)[D / 32]) {
  double total = 0.0;
#pragma unroll
  for (int u = 0; u < D / 32; ++u) {
    double s = x[u];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    total += __shfl_sync(0xffffffffu, s, 0);
  }
  return total;
}

// Quantizes x (this warp's D coordinates of one vector: row `row`'s KV head
// `kv_head`, part 0 = K, 1 = V) and stores it at the row's newest position
// (lengths[row] - 1). `scratch`: D bytes of shared memory for this warp.
template <int D>
__device__ __noinline__ void append_vector_warp(const KvAppendTarget& t, int part_index, int row, int kv_head,
                                   const float (&x)[D / 32], uint8_t* scratch) {
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x % 32;
  const KvAppendPart& f = t.part[part_index];
  const int64_t pos = t.lengths[row] - 1;
  const int32_t page = t.tables[row * t.table_stride + pos / t.page_size];
  const int slot = static_cast<int>(pos % t.page_size);
  std::byte* slab = t.pool + (static_cast<int64_t>(page) * t.num_kv_heads + kv_head) * t.slab_bytes;
  std::byte* dst = slab + f.rows_offset + static_cast<int64_t>(slot) * f.row_bytes;
  if (f.bits == 16) {
#pragma unroll
    for (int u = 0; u < kPer; ++u) reinterpret_cast<__half*>(dst)[lane + 32 * u] = __float2half_rn(x[u]);
    return;
  }
  double sq[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) sq[u] = static_cast<double>(x[u]) * x[u];
  const double gamma_exact = sqrt(warp_sum_double_as_block<D>(sq));
  const float gamma = static_cast<float>(gamma_exact);
  float y[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) y[u] = gamma > 0.0f ? x[u] / gamma : 0.0f;
  hadamard_rotate_warp<D>(y, t.signs, 1.0f);
  // The boundaries in registers (at most 15, those past nbounds never
  // counted): one fixed loop instead of a runtime trip count per coordinate.
  float bounds[15];
#pragma unroll
  for (int b = 0; b < 15; ++b) bounds[b] = b < f.nbounds ? f.bounds[b] : INFINITY;
  int idx[kPer];
  double c2[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    idx[u] = 0;
#pragma unroll
    for (int b = 0; b < 15; ++b) idx[u] += (y[u] >= bounds[b]) ? 1 : 0;
    const double c = f.bits <= 4 ? static_cast<double>(f.centroids[idx[u]]) : 0.0;
    c2[u] = c * c;
  }
  const double cn2 = warp_sum_double_as_block<D>(c2);
  if (lane == 0) {
    float value = gamma;
    if (t.renormalize && gamma > 0.0f) value = static_cast<float>(gamma_exact / sqrt(cn2));
    std::byte* s = slab + f.scales_offset + static_cast<int64_t>(slot) * f.scale_bytes;
    if (t.scale_f32) *reinterpret_cast<float*>(s) = value;
    else *reinterpret_cast<__half*>(s) = __float2half_rn(value);
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) scratch[lane + 32 * u] = static_cast<uint8_t>(idx[u]);
  __syncwarp();
  uint8_t* out = reinterpret_cast<uint8_t*>(dst);
  if (f.bits == 4) {
    for (int j = lane; j < D / 2; j += 32) out[j] = static_cast<uint8_t>(scratch[2 * j] | (scratch[2 * j + 1] << 4));
  } else {
    // The 2-bit plane (the whole index for tq2, the low bits for tq3), then tq3's high bits.
    for (int j = lane; j < D / 4; j += 32)
      out[j] = static_cast<uint8_t>((scratch[4 * j] & 3) | ((scratch[4 * j + 1] & 3) << 2) |
                                    ((scratch[4 * j + 2] & 3) << 4) | ((scratch[4 * j + 3] & 3) << 6));
    if (f.bits == 3 && lane < D / 8) {
      uint8_t hb = 0;
      for (int k = 0; k < 8; ++k) hb = static_cast<uint8_t>(hb | (((scratch[8 * lane + k] >> 2) & 1) << k));
      out[D / 4 + lane] = hb;
    }
  }
  __syncwarp();  // scratch may be reused by the caller
}

}  // namespace lowbit::kv
