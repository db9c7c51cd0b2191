// One K or V vector quantized and stored into the paged cache by one warp
// (KvAppendTarget, append_target.h): the decode attention stores each row's
// newest token itself (DeviceDecodeOptions::append_k), so a decode step
// needs no KV append kernel before it.
//
// The arithmetic is the KV write kernel's (device_cache.cu), operation for
// operation, so the stored bytes are the same: both sum their double
// squares with sum_double_over_lanes below, the write kernel after
// gathering its one-coordinate-per-thread values into one warp's layout.
// Only the Hadamard rotation is done here (hadamard_warp.cuh): a Haar
// rotation is a 64 KB matrix, which is the append kernel's job.
//
// The work is split in three so that a caller can issue the loads first and
// hide their latency (the attention issues them before it waits for the
// kernel that made the vector): append_plan_begin (the row's length, the
// codebook, the signs), append_plan_slot (the page: it needs the length)
// and append_vector_warp.
// Device code; include from .cu files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "lowbit/kv/append_target.h"
#include "lowbit/kv/hadamard_warp.cuh"

namespace lowbit::kv {

// The sum of D doubles held by a warp (lane l: coordinates l + 32u): each
// lane adds its own in increasing u, then a 32-lane xor butterfly; every lane
// returns lane 0's result. The KV write kernel and the warp append both sum
// this way, which is what makes their norms, and so their bytes, the same.
template <int D>
__device__ __forceinline__ double sum_double_over_lanes(const double (&x)[D / 32]) {
  double s = x[0];
#pragma unroll
  for (int u = 1; u < D / 32; ++u) s += x[u];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return __shfl_sync(0xffffffffu, s, 0);
}

// What the append of one vector needs besides the vector, loaded ahead.
struct KvAppendPlan {
  int part;               // 0 = K, 1 = V
  int row, kv_head;
  int32_t length;         // the row's length: the token goes to length - 1
  int32_t page;           // append_plan_slot
  float bounds[15];       // the part's boundaries (+inf past nbounds)
  float lane_centroid;    // centroid `lane` (lanes 0..15), for a shuffle per lookup
  float signs[4];         // the Hadamard signs of the lane's coordinates (D / 32 used)
};

template <int D>
__device__ __forceinline__ KvAppendPlan append_plan_begin(const KvAppendTarget& t, int part, int row, int kv_head) {
  const int lane = threadIdx.x % 32;
  const KvAppendPart& f = t.part[part];
  KvAppendPlan p;
  p.part = part;
  p.row = row;
  p.kv_head = kv_head;
  p.page = 0;
  p.length = __ldg(t.lengths + row);
  const bool quantized = f.bits != 16;
#pragma unroll
  for (int b = 0; b < 15; ++b) p.bounds[b] = quantized && b < f.nbounds ? __ldg(f.bounds + b) : INFINITY;
  p.lane_centroid = quantized && lane < 16 ? __ldg(f.centroids + lane) : 0.0f;
#pragma unroll
  for (int u = 0; u < 4; ++u) p.signs[u] = quantized && u < D / 32 ? __ldg(t.signs + lane + 32 * u) : 1.0f;
  return p;
}

// The page of the row's newest token (a load that needs the length).
__device__ __forceinline__ void append_plan_slot(const KvAppendTarget& t, KvAppendPlan& p) {
  const int64_t pos = p.length - 1;
  p.page = __ldg(t.tables + p.row * t.table_stride + pos / t.page_size);
}

// Quantizes x (this warp's D coordinates of the planned vector): the
// indices into `scratch` (D bytes of shared memory for this warp), and
// returns the scale to store (the same in every lane). An fp16 part needs
// neither: it returns 0.
template <int D>
__device__ __forceinline__ float quantize_vector_warp(const KvAppendTarget& t, const KvAppendPlan& p,
                                                      const float (&x)[D / 32], uint8_t* scratch) {
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x % 32;
  const KvAppendPart& f = t.part[p.part];
  if (f.bits == 16) return 0.0f;
  double sq[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) sq[u] = static_cast<double>(x[u]) * x[u];
  const double gamma_exact = sqrt(sum_double_over_lanes<D>(sq));
  const float gamma = static_cast<float>(gamma_exact);
  float y[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) y[u] = gamma > 0.0f ? x[u] / gamma : 0.0f;
  hadamard_rotate_warp<D>(y, p.signs, 1.0f);
  int idx[kPer];
  double c2[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    idx[u] = 0;
#pragma unroll
    for (int b = 0; b < 15; ++b) idx[u] += (y[u] >= p.bounds[b]) ? 1 : 0;
    const double c = f.bits <= 4 ? static_cast<double>(__shfl_sync(0xffffffffu, p.lane_centroid, idx[u])) : 0.0;
    c2[u] = c * c;
  }
  const double cn2 = sum_double_over_lanes<D>(c2);
#pragma unroll
  for (int u = 0; u < kPer; ++u) scratch[lane + 32 * u] = static_cast<uint8_t>(idx[u]);
  __syncwarp();
  return t.renormalize && gamma > 0.0f ? static_cast<float>(gamma_exact / sqrt(cn2)) : gamma;
}

// Stores what quantize_vector_warp made (or x itself, for an fp16 part) as
// the cache lays out a slot: the row's bytes at `row`, the scale at `scale`
// (quantized parts). Global or shared memory alike. `row_byte_xor`: a 4-bit
// row's byte j goes to j ^ row_byte_xor (a staged tile's swizzled V rows,
// stage_v_byte_xor in device_attention.cu; 0 for the cache's own layout).
template <int D>
__device__ __forceinline__ void store_vector_warp(const KvAppendTarget& t, const KvAppendPlan& p,
                                                  const float (&x)[D / 32], const uint8_t* scratch, float scale_value,
                                                  uint8_t* row, std::byte* scale, int row_byte_xor = 0) {
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x % 32;
  const KvAppendPart& f = t.part[p.part];
  if (f.bits == 16) {
    __half* dst = reinterpret_cast<__half*>(row);
#pragma unroll
    for (int u = 0; u < kPer; ++u) dst[lane + 32 * u] = __float2half_rn(x[u]);
    return;
  }
  if (lane == 0) {
    if (t.scale_f32) *reinterpret_cast<float*>(scale) = scale_value;
    else *reinterpret_cast<__half*>(scale) = __float2half_rn(scale_value);
  }
  if (f.bits == 4) {
    for (int j = lane; j < D / 2; j += 32)
      row[j ^ row_byte_xor] = static_cast<uint8_t>(scratch[2 * j] | (scratch[2 * j + 1] << 4));
  } else {
    // The 2-bit plane (the whole index for tq2, the low bits for tq3), then tq3's high bits.
    for (int j = lane; j < D / 4; j += 32)
      row[j] = static_cast<uint8_t>((scratch[4 * j] & 3) | ((scratch[4 * j + 1] & 3) << 2) |
                                    ((scratch[4 * j + 2] & 3) << 4) | ((scratch[4 * j + 3] & 3) << 6));
    if (f.bits == 3 && lane < D / 8) {
      uint8_t hb = 0;
      for (int k = 0; k < 8; ++k) hb = static_cast<uint8_t>(hb | (((scratch[8 * lane + k] >> 2) & 1) << k));
      row[D / 4 + lane] = hb;
    }
  }
}

// Quantizes x (this warp's D coordinates of the planned vector) and stores
// it into its cache slot. `scratch`: D bytes of shared memory for this
// warp, holding the indices afterwards.
template <int D>
__device__ __forceinline__ void append_vector_warp(const KvAppendTarget& t, const KvAppendPlan& p,
                                                   const float (&x)[D / 32], uint8_t* scratch, float* scale_out = nullptr) {
  const KvAppendPart& f = t.part[p.part];
  const int slot = static_cast<int>((p.length - 1) % t.page_size);
  std::byte* slab = t.pool + (static_cast<int64_t>(p.page) * t.num_kv_heads + p.kv_head) * t.slab_bytes;
  const float scale = quantize_vector_warp<D>(t, p, x, scratch);
  if (scale_out != nullptr) *scale_out = scale;
  store_vector_warp<D>(t, p, x, scratch, scale,
                       reinterpret_cast<uint8_t*>(slab + f.rows_offset + static_cast<int64_t>(slot) * f.row_bytes),
                       slab + f.scales_offset + static_cast<int64_t>(slot) * f.scale_bytes);
  __syncwarp();  // scratch may be reused by the caller
}

}  // namespace lowbit::kv
