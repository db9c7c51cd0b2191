// Pieces shared by the attention kernels on the paged cache (the decode
// kernel in device_attention.cu, the tiled prefill kernel in
// prefill_attention.cu): the cache's row formats, the fp16 tensor-core
// instruction they use, cp.async, and the centroid pair tables.
// Device code; include from .cu files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace lowbit::kv::attention_mma {

constexpr int kTile = 16;  // tokens per warp iteration: the n of two m16n8 score tiles, the k of one PV mma
constexpr float kLog2e = 1.4426950408889634f;

enum Fmt : int { kTq4 = 0, kTq3 = 1, kTq2 = 2, kFp16 = 3 };

// Bytes of one cached vector of d coordinates (paged_cache.h's row layout).
__host__ __device__ constexpr int row_bytes(int f, int d) {
  return f == kTq4 ? d / 2 : f == kTq3 ? 3 * d / 8 : f == kTq2 ? d / 4 : 2 * d;
}
__host__ __device__ constexpr int lut_entries(int f) { return f == kTq4 ? 256 : f == kTq3 ? 64 : f == kTq2 ? 16 : 0; }
__host__ __device__ constexpr bool quantized(int f) { return f != kFp16; }

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  // Not volatile: a pure function of its registers, so the compiler may
  // schedule the table loads of the next mma ahead of it.
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 2^x on the SFU alone: exp2f's denormal handling costs 4 more instructions
// per call, and results below 2^-126 are zero weight here anyway.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The pair table of a packed format: entry e (a byte of two tq4 indices, a
// nibble of two tq2 ones, or idx_u | idx_(u+1) << 3 for tq3) holds the half2
// of the two coordinates' centroids. Each of the 32 lanes gets a copy of its
// own (entry e of lane l at word e * kRowWords + l), so that random indices
// do not collide in shared-memory banks.
template <int kRowWords>
__device__ __forceinline__ void fill_lut(uint32_t* lut, int f, const float* centroids) {
  const int entries = lut_entries(f);
  const int bits = f == kTq4 ? 4 : f == kTq3 ? 3 : 2;
  const int mask = (1 << bits) - 1;
  for (int i = threadIdx.x; i < entries * 32; i += blockDim.x) {
    const int e = i >> 5;
    lut[e * kRowWords + (i & 31)] = pack_half2(centroids[e & mask], centroids[e >> bits]);
  }
}

}  // namespace lowbit::kv::attention_mma
