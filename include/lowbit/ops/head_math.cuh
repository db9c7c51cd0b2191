// The fp32 steps of the per-head RMSNorm and of RoPE, with every rounding
// spelled out by intrinsics that the compiler may not contract or
// reassociate (plain `a * b + c` may or may not become an fma depending on
// what the code is inlined into). ops::head_rms_norm, ops::rope, the fused
// ops::qkv_to_attention_inputs kernel and the W4A16 decode GEMM's
// attention-inputs epilogue use them, which is what makes those reproduce
// each other bit for bit. The fma choices are those nvcc made for the plain
// expressions these replaced (checked in the SASS). Device code; include
// from .cu files.
#pragma once

#include <cuda_runtime.h>

namespace lowbit::ops {

__device__ __forceinline__ float sum_sq_step(float acc, float v) { return __fmaf_rn(v, v, acc); }
__device__ __forceinline__ float head_inv_rms(float sum_sq, int head_dim, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(sum_sq, static_cast<float>(head_dim)), eps));
}
__device__ __forceinline__ float norm_scale(float v, float inv_rms, float w) {
  return __fmul_rn(__fmul_rn(v, inv_rms), w);
}
// The angle is pos * inv_freq in fp32 as HF transformers computes it; sincosf
// (not the fast __sincosf) keeps full accuracy for the large angles of long
// contexts.
__device__ __forceinline__ void rope_cos_sin(float pos, float inv_freq, float* c, float* s) {
  sincosf(__fmul_rn(pos, inv_freq), s, c);
}
// (x0, x1) rotated by the angle of (c, s): y0 = x0 c - x1 s, y1 = x1 c + x0 s.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
  *y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

}  // namespace lowbit::ops
