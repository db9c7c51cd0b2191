// Device helpers shared by the W4A16 kernels (w4a16_gemm.cu: the mma.sync
// kernels; w4a16_wgmma.cu: the sm_90a wgmma kernel): cp.async, the LOP3 /
// magic-number dequantization of the tiled layout's words, ldmatrix and
// mma.sync. Included only by .cu files of this module.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace lowbit::w4a16_detail {

template <typename T> struct Vec2;
template <> struct Vec2<half> { using type = half2; };
template <> struct Vec2<__nv_bfloat16> { using type = __nv_bfloat162; };

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 fills the destination with zeros (rows past M, columns past K).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// (a & b) | c in one instruction.
template <uint32_t kMask, uint32_t kOr>
__device__ __forceinline__ uint32_t mask_or(uint32_t a) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "n"(kMask), "n"(kOr));
  return r;
}

template <typename V> __device__ __forceinline__ uint32_t as_u32(V v) { return *reinterpret_cast<uint32_t*>(&v); }
template <typename V> __device__ __forceinline__ V from_u32(uint32_t u) { return *reinterpret_cast<V*>(&u); }

// The 16-bit scale s and zero term (z, or m for float zero-point) of one
// column, with the constants its dequantization subtracts computed once per
// column and k-iteration rather than once per word.
template <typename T>
struct ColumnDequant {
  typename Vec2<T>::type scale;   // (s, s)
  typename Vec2<T>::type zterm;   // (z, z) or (m, m)
  typename Vec2<T>::type lo_sub;  // fp16: 1024 + z (or 1024); bf16: 128 + z (or 128)
  typename Vec2<T>::type hi_sub;  // fp16: -(64 + z) (or -64); unused for bf16
};

template <typename T, bool kFloatZero>
__device__ __forceinline__ ColumnDequant<T> column_dequant(uint32_t packed) {
  using V = typename Vec2<T>::type;
  const uint32_t s = packed & 0xFFFFu, z = packed >> 16;
  ColumnDequant<T> c;
  c.scale = from_u32<V>(s | (s << 16));
  c.zterm = from_u32<V>(z | (z << 16));
  if constexpr (std::is_same_v<T, half>) {
    const V k1024 = __float2half2_rn(1024.0f), kneg64 = __float2half2_rn(-64.0f);
    c.lo_sub = kFloatZero ? k1024 : __hadd2(k1024, c.zterm);
    c.hi_sub = kFloatZero ? kneg64 : __hsub2(kneg64, c.zterm);
  } else {
    const V k128 = __float2bfloat162_rn(128.0f);
    c.lo_sub = kFloatZero ? k128 : __hadd2(k128, c.zterm);
    c.hi_sub = c.lo_sub;
  }
  return c;
}

// The four register pairs of one 32-bit word (8 codes, see the layout header)
// as exact 16-bit values q - z (lo_sub/hi_sub carry z; for float zero-point
// they carry no z and the pairs are q). Pairs 0, 1 belong to column c0, pairs
// 2, 3 to column c1.
__device__ __forceinline__ void word_pairs(uint32_t w, const ColumnDequant<half>& c0, const ColumnDequant<half>& c1,
                                           half2 (&p)[4]) {
  // (code | 0x6400) is the fp16 number 1024 + q; a code in bits 4..7 gives
  // 1024 + 16q. Subtracting (1024 + z), or scaling by 1/16 and subtracting
  // (64 + z), leaves q - z exactly, with one LOP3 and one HSUB2/HFMA2 per pair.
  const half2 k1_16 = __float2half2_rn(1.0f / 16.0f);
  const uint32_t w_hi = w >> 8;
  p[0] = __hsub2(from_u32<half2>(mask_or<0x000F000Fu, 0x64006400u>(w)), c0.lo_sub);
  p[1] = __hfma2(from_u32<half2>(mask_or<0x00F000F0u, 0x64006400u>(w)), k1_16, c0.hi_sub);
  p[2] = __hsub2(from_u32<half2>(mask_or<0x000F000Fu, 0x64006400u>(w_hi)), c1.lo_sub);
  p[3] = __hfma2(from_u32<half2>(mask_or<0x00F000F0u, 0x64006400u>(w_hi)), k1_16, c1.hi_sub);
}

__device__ __forceinline__ void word_pairs(uint32_t w, const ColumnDequant<__nv_bfloat16>& c0,
                                           const ColumnDequant<__nv_bfloat16>& c1, __nv_bfloat162 (&p)[4]) {
  // bf16 keeps only 7 explicit mantissa bits, so a code in bits 4..7 would
  // spill into the exponent: each pair is shifted down to bits 0..3 first.
  // (code | 0x4300) is the bf16 number 128 + q; lo_sub is 128 + z (or 128).
#pragma unroll
  for (int j = 0; j < 4; ++j)
    p[j] = __hsub2(from_u32<__nv_bfloat162>(mask_or<0x000F000Fu, 0x43004300u>(w >> (4 * j))),
                   (j < 2 ? c0 : c1).lo_sub);
}

// The codes of one word as exact 16-bit values with no zero point or scale
// applied, in the register order of word_pairs: fp16 pairs 0 and 2 are
// kCodeBias + q and pairs 1 and 3 (the codes in bits 4..7 of each byte)
// kCodeBias + 16 q; bf16 pairs are all 128 + q. For kernels that apply the
// zero point and the scale after the dot product (w4a16_gemv.cu): one SHF and
// four LOP3 per eight codes, where dequant_word adds four subtractions and
// four multiplies.
template <typename T>
inline constexpr float kCodeBias = std::is_same_v<T, half> ? 1024.0f : 128.0f;

template <typename T>
__device__ __forceinline__ void raw_word_pairs(uint32_t w, uint32_t (&p)[4]) {
  if constexpr (std::is_same_v<T, half>) {
    const uint32_t w_hi = w >> 8;
    p[0] = mask_or<0x000F000Fu, 0x64006400u>(w);
    p[1] = mask_or<0x00F000F0u, 0x64006400u>(w);
    p[2] = mask_or<0x000F000Fu, 0x64006400u>(w_hi);
    p[3] = mask_or<0x00F000F0u, 0x64006400u>(w_hi);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = mask_or<0x000F000Fu, 0x43004300u>(w >> (4 * j));
  }
}

// A column's scale and zero term in fp32 for kernels that scale after the
// dot product: w = s * q + offset, offset = -s * z (integer zero point) or m.
template <typename T, bool kFloatZero>
__device__ __forceinline__ void column_scale_offset(uint32_t packed, float& scale, float& offset) {
  float2 sz;
  if constexpr (std::is_same_v<T, half>) sz = __half22float2(from_u32<half2>(packed));
  else sz = __bfloat1622float2(from_u32<__nv_bfloat162>(packed));
  scale = sz.x;
  offset = kFloatZero ? sz.y : -sz.x * sz.y;
}

// Dequantizes one word into the B registers of two mma tiles: b0 for
// n-subtile 0 (column c0) and b1 for n-subtile 1 (column c1). One multiply
// (or, for float zero-point, one fma with m) rounds each weight once.
template <typename T, bool kFloatZero>
__device__ __forceinline__ void dequant_word(uint32_t w, const ColumnDequant<T>& c0, const ColumnDequant<T>& c1,
                                             uint32_t (&b0)[2], uint32_t (&b1)[2]) {
  typename Vec2<T>::type p[4];
  word_pairs(w, c0, c1, p);
  if constexpr (kFloatZero) {
    b0[0] = as_u32(__hfma2(p[0], c0.scale, c0.zterm));
    b0[1] = as_u32(__hfma2(p[1], c0.scale, c0.zterm));
    b1[0] = as_u32(__hfma2(p[2], c1.scale, c1.zterm));
    b1[1] = as_u32(__hfma2(p[3], c1.scale, c1.zterm));
  } else {
    b0[0] = as_u32(__hmul2(p[0], c0.scale));
    b0[1] = as_u32(__hmul2(p[1], c0.scale));
    b1[0] = as_u32(__hmul2(p[2], c1.scale));
    b1[1] = as_u32(__hmul2(p[3], c1.scale));
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(smem_address(p)));
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ half from_float<half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The split-K sums: element-wise float4 accumulation.
__device__ __forceinline__ void add_to(float4& sum, const float4& p) {
  sum.x += p.x;
  sum.y += p.y;
  sum.z += p.z;
  sum.w += p.w;
}
// acc[i .. i + 3] += p: a float4 of split-K partials added to the four
// accumulators it was stored from.
template <int N>
__device__ __forceinline__ void add_quad(float (&acc)[N], int i, const float4& p) {
  acc[i] += p.x;
  acc[i + 1] += p.y;
  acc[i + 2] += p.z;
  acc[i + 3] += p.w;
}
// The split-K count. Thread 0's add is a release (after the barrier that
// follows every thread's partial stores, it publishes them device-wide) and
// an acquire (with the barrier after it, the last CTA's loads of the other
// partials come after every CTA's stores), as CUTLASS's split-K semaphore
// does. It replaces a __threadfence by every thread before the count and
// another after it in the last CTA: fences on the critical path of every
// K-split call (the count and the last CTA's sum took ~2.5-3.5 us of a
// decode step's GEMM, measured with per-CTA timer stamps). Used by the gemv
// kernel's split-K paths and the wgmma kernel's K splits and tail tiles.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// The wgmma kernel's stream-K flags: a CTA that stored the partial of a
// piece of a tile publishes it with a release add (thread 0, after the
// barrier that follows every thread's stores); the CTA that sums the tile
// polls with acquire loads (thread 0, then a barrier before every thread
// reads the partials).
__device__ __forceinline__ void red_add_release_gpu(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// The shared fix-up's departure count: a release (the CTA's reads of the
// arrival counter come before it) whose result is used only after the sum,
// so that its round trip overlaps the sum; the last CTA to leave then
// fences (acquire side) before it zeroes the counters.
__device__ __forceinline__ int atomic_add_release_gpu(int* p, int v) {
  int old;
  asm volatile("atom.release.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
// The device's nanosecond clock (%globaltimer; it advances in steps of up to
// a microsecond): the wgmma kernel's shared fix-up bounds its waits with it.
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace lowbit::w4a16_detail
