// The randomized Hadamard rotation (rotation.h: M = diag(s) H / sqrt(d)) of
// one head vector held by one warp, in registers: lane l holds coordinates
// l, l + 32, ... (D / 32 of them).
//
// Why a warp and registers: a 128 x 128 rotation as a dense product reads
// 64 KB of M per use, which at a batch-1 decode step is a kernel's worth of
// L2 round trips (the query rotation and the merge each had one); the
// Walsh-Hadamard transform needs only the d signs and 7 butterfly stages,
// 5 of them lane shuffles. Every butterfly is b0 + b1 / b0 - b1 in fp32 in
// the order of the stride-1, 2, 4, ... loop of the host code and of the KV
// write kernel (device_cache.cu), so the results are bit-identical to both.
// Device code; include from .cu files.
#pragma once

#include <cuda_runtime.h>

namespace lowbit::kv {

// v <- H v (unnormalized Sylvester Hadamard) over the D coordinates a warp holds.
template <int D>
__device__ __forceinline__ void walsh_hadamard_warp(float (&v)[D / 32]) {
  static_assert(D == 64 || D == 128, "head dimensions 64 and 128");
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 1; h < 32; h *= 2) {
    const bool low = (lane & h) == 0;  // this lane holds the b0 of each pair
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const float other = __shfl_xor_sync(0xffffffffu, v[u], h);
      v[u] = low ? __fadd_rn(v[u], other) : __fsub_rn(other, v[u]);
    }
  }
#pragma unroll
  for (int h = 1; h < kPer; h *= 2) {  // strides 32, 64: within the lane
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      if ((u & h) != 0) continue;
      const float b0 = v[u], b1 = v[u + h];
      v[u] = __fadd_rn(b0, b1);
      v[u + h] = __fsub_rn(b0, b1);
    }
  }
}

__device__ __forceinline__ float hadamard_norm(int d) { return static_cast<float>(1.0 / sqrt(static_cast<double>(d))); }

// The signs of the lane's coordinates (lane_signs[u] = signs[lane + 32u]),
// loaded apart so that callers can issue the loads early.
template <int D>
__device__ __forceinline__ void load_lane_signs(const float* signs, float* lane_signs) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int u = 0; u < D / 32; ++u) lane_signs[u] = __ldg(signs + lane + 32 * u);
}

// y = x M = H (x * s) / sqrt(d), then times `scale` (the query rotation of
// the decode attention: scale = softmax_scale * log2(e)). Rounded as
// Rotation::rotate rounds it, then once more for the scale.
template <int D>
__device__ __forceinline__ void hadamard_rotate_warp(float (&v)[D / 32], const float* lane_signs, float scale) {
#pragma unroll
  for (int u = 0; u < D / 32; ++u) v[u] = __fmul_rn(v[u], lane_signs[u]);
  walsh_hadamard_warp<D>(v);
  const float norm = hadamard_norm(D);
#pragma unroll
  for (int u = 0; u < D / 32; ++u) v[u] = __fmul_rn(__fmul_rn(v[u], norm), scale);
}

// x = y M^T = (H y) / sqrt(d) * s, as Rotation::unrotate rounds it.
template <int D>
__device__ __forceinline__ void hadamard_unrotate_warp(float (&v)[D / 32], const float* lane_signs) {
  walsh_hadamard_warp<D>(v);
  const float norm = hadamard_norm(D);
#pragma unroll
  for (int u = 0; u < D / 32; ++u) v[u] = __fmul_rn(__fmul_rn(v[u], norm), lane_signs[u]);
}

}  // namespace lowbit::kv
