// One K or V vector stored into the fp16 window (device_window.h) by one
// warp: rotated as the cache rotates that part, rounded to fp16. Shared by
// device_window_write (a prefill block's tokens) and the decode attention's
// window kernel (each row's newest token, DeviceDecodeOptions::window_k).
// Device code; include from .cu files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/kv/hadamard_warp.cuh"

namespace lowbit::kv {

// What a kernel needs to store a part's copies: the layer's rotation, when
// the part is quantized (its copies live in the rotated domain), as Hadamard
// signs or a dense Haar matrix (row-major, y = x M).
struct WindowRotation {
  const float* signs = nullptr;   // Hadamard: head_dim signs
  const float* matrix = nullptr;  // Haar: head_dim x head_dim
};

// x: this warp's vector, lane l holding coordinates l + 32u. `stage`: D
// floats of shared memory for this warp (the Haar product reads every
// coordinate). dst: the ring slot's D halves.
template <int D>
__device__ __forceinline__ void store_window_vector_warp(float (&x)[D / 32], const WindowRotation& rot, float* stage,
                                                         __half* dst) {
  const int lane = threadIdx.x % 32;
  if (rot.signs != nullptr) {
    float lane_signs[D / 32];
    load_lane_signs<D>(rot.signs, lane_signs);
    hadamard_rotate_warp<D>(x, lane_signs, 1.0f);  // x @ M, as Rotation::rotate rounds it
  } else if (rot.matrix != nullptr) {
#pragma unroll
    for (int u = 0; u < D / 32; ++u) stage[lane + 32 * u] = x[u];
    __syncwarp();
    float y[D / 32] = {};
    for (int i = 0; i < D; ++i) {
      const float xi = stage[i];
#pragma unroll
      for (int u = 0; u < D / 32; ++u) y[u] = fmaf(xi, __ldg(rot.matrix + i * D + lane + 32 * u), y[u]);
    }
    __syncwarp();  // stage may be reused by the caller
#pragma unroll
    for (int u = 0; u < D / 32; ++u) x[u] = y[u];
  }
#pragma unroll
  for (int u = 0; u < D / 32; ++u) dst[lane + 32 * u] = __float2half_rn(x[u]);
}

}  // namespace lowbit::kv
