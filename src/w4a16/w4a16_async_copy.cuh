// The Hopper copy-engine plumbing the sm_90 W4A16 kernels share (the wgmma
// kernel of w4a16_wgmma.cu, the decode kernel of w4a16_gemv.cu): mbarriers,
// 1-D bulk copies and the TMA tile load of x, plus the host-side tensor map
// that describes x to the copy engine. Included only by .cu files of this
// module.
//
// Why the copy engine: one thread can put kilobytes in flight with a handful
// of instructions, where per-thread cp.async spends issue slots on address
// arithmetic (the H100 profile of the first wgmma kernel: ~900 issued
// instructions per warp and k-iteration at M = 1, docs/w4a16-gemm.md).
#pragma once

#include <cuda.h>  // CUtensorMap (the encoder is fetched through the runtime: no libcuda link)

#include <cstdint>

#include "w4a16_device.cuh"
#include "w4a16_kernel_args.h"

namespace lowbit::w4a16_detail {

// The tensor map of x for one call: [M rows, K columns] of 16-bit values,
// row pitch ldx, box 64 columns (128 bytes: the swizzle span) x `rows`,
// stored in shared memory with the 128-byte swizzle (16-byte chunk c of row r
// at chunk c ^ (r % 8)); rows past M and columns past K arrive as zeros.
CUtensorMap encode_x_tensor_map(const TiledGemmArgs& a, int rows, bool bf16);

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// Spins until the phase with parity `parity` of the barrier has completed.
// The overloads on a 32-bit shared-memory address let a loop convert its
// barriers' addresses once (each generic-to-shared conversion reads a special
// register on sm_90).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait(smem_address(bar), parity); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(smem_address(bar)); }
// Arrives once and adds `bytes` to the transactions the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// TMA: the box {64 columns, rows} of x at (k0, m0) into dst, completing on bar.
__device__ __forceinline__ void tma_load_x(void* dst, const CUtensorMap* map, int k0, int m0, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(m0), "r"(smem_address(bar))
      : "memory");
}
// 1-D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}

#endif  // !__CUDA_ARCH__ || __CUDA_ARCH__ >= 900

}  // namespace lowbit::w4a16_detail
