// What the sm_90a wgmma kernel (w4a16_wgmma.cu) needs to use the copy
// engine: the host-side tensor map that describes x to it, and the
// primitives of lowbit/cuda/async_copy.cuh. (The decode kernel of
// w4a16_gemv.cu used them until v7; it now streams with per-thread cp.async.)
// Included only by .cu files of this module.
//
// Why the copy engine: one thread can put kilobytes in flight with a handful
// of instructions, where per-thread cp.async spends issue slots on address
// arithmetic (the H100 profile of the first wgmma kernel: ~900 issued
// instructions per warp and k-iteration at M = 1, docs/w4a16-gemm.md).
#pragma once

#include <cuda.h>  // CUtensorMap (the encoder is fetched through the runtime: no libcuda link)

#include <cstdint>

#include "lowbit/cuda/async_copy.cuh"
#include "w4a16_kernel_args.h"

namespace lowbit::w4a16_detail {

// The tensor map of x for one call: [M rows, K columns] of 16-bit values,
// row pitch ldx, box 64 columns (128 bytes: the swizzle span) x `rows`,
// stored in shared memory with the 128-byte swizzle (16-byte chunk c of row r
// at chunk c ^ (r % 8)); box rows past M and columns past K arrive as zeros.
CUtensorMap encode_x_tensor_map(const TiledGemmArgs& a, int rows, bool bf16);

// The copy-engine primitives (lowbit/cuda/async_copy.cuh) under the names
// the kernels of this module use.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
using cuda::bulk_load;
using cuda::mbar_arrive;
using cuda::mbar_arrive_expect_tx;
using cuda::mbar_init;
using cuda::mbar_wait;
using cuda::tma_load_2d;
#endif

}  // namespace lowbit::w4a16_detail
