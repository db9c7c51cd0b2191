// The decode W4A16 kernel (w4a16_gemv.cu), internal to the module: the
// strategy W4A16Strategy::gemv of w4a16_gemm.h. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "w4a16_kernel_args.h"

namespace lowbit::w4a16_detail {

// Rows of x one pass of the kernel serves: the n of mma.m16n8k16.
inline constexpr int kGemvRowsPerPass = 8;
// Activation elements (rows x K range) a CTA stages in shared memory; the
// K split is raised until a CTA's range fits.
inline constexpr int kGemvMaxStagedElements = 8192;

using GemvArgs = TiledGemmArgs;  // counters: one per (pass, 64-column block)

// The smallest K split whose per-CTA activation slice fits the staging
// buffer for passes of min(M, 8) rows.
int gemv_min_split(int64_t M, int iters);
// CTAs per SM the kernel keeps resident (occupancy query, cached).
int gemv_ctas_per_sm(bool bf16, int device);
// grid = (N_pad / 64, split_k, ceil(M / 8)).
void launch_gemv(const GemvArgs& args, bool bf16, bool float_zero, cudaStream_t stream);

}  // namespace lowbit::w4a16_detail
