// The decode W4A16 kernel (w4a16_gemv.cu), internal to the module: the
// strategy W4A16Strategy::gemv of w4a16_gemm.h. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "w4a16_kernel_args.h"

namespace lowbit::w4a16_detail {

// Rows of x one pass of the kernel serves: the n of mma.m16n8k16. Larger M
// runs in passes, one launch each.
inline constexpr int kGemvRowsPerPass = 8;

// split_k is the number of CTAs of the persistent grid; partial holds
// gemv_partial_floats(split_k) floats and counters gemv_tiles(N_pad) ints,
// zero between calls.
using GemvArgs = TiledGemmArgs;

// Column tiles (512 columns each) and units of work (tiles x 64-row k-iterations).
int gemv_tiles(int N_pad);
int64_t gemv_units(int N_pad, int iters);
size_t gemv_partial_floats(int ctas);
// CTAs per SM the kernel keeps resident (occupancy query, cached).
int gemv_ctas_per_sm(bool bf16);
// Needs a compute capability 9.0 device (the copy engine's bulk copies).
void launch_gemv(const GemvArgs& args, bool bf16, bool float_zero, cudaStream_t stream);

}  // namespace lowbit::w4a16_detail
