// The decode W4A16 kernel (w4a16_gemv.cu), internal to the module: the
// strategy W4A16Strategy::gemv of w4a16_gemm.h. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "lowbit/w4a16/w4a16_gemv_workspace.h"
#include "w4a16_kernel_args.h"

namespace lowbit::w4a16_detail {

// kGemvRowsPerPass rows of x per launch (larger M runs in passes);
// gemv_col_blocks and gemv_partial_floats: lowbit/w4a16/w4a16_gemv_workspace.h.

// split_k is the K split: a grid of gemv_col_blocks(N_pad) x split_k CTAs.
// With split_k > 1, partial holds gemv_partial_floats(split_k, N_pad) floats
// and counters gemv_col_blocks(N_pad) ints, zero between calls.
using GemvArgs = TiledGemmArgs;

// W4A16Options::residual_row_sq's layout: per row, kGemvRowSqCopies copies
// of the row's per-block sums, each padded to whole 128-byte lines; the
// GEMM that reads them (x_norm_weight) takes copy blockIdx.x % copies, so
// that its ~1000 CTAs do not all load the same two L2 lines at once.
inline constexpr int kGemvRowSqCopies = 16;
inline constexpr int gemv_row_sq_copy_stride(int blocks) { return (blocks + 31) / 32 * 32; }
// The least K split whose share of x fits in a CTA's shared memory.
int gemv_min_split(int64_t M, int iters, int device);
// The K split `auto` (at 1-4 rows) and an unset W4A16Options::split_k use:
// gemv_split_rule (lowbit/w4a16/w4a16_tune_rule.h) on this device's SMs and
// the kernel's resident CTAs per SM at M rows (two_groups: group size 32).
int gemv_choose_split(int64_t M, int N_pad, int iters, bool two_groups, int device);
// Compute capability 8.0 or later (cp.async, mma.sync).
void launch_gemv(const GemvArgs& args, bool bf16, bool float_zero, int device, cudaStream_t stream);

}  // namespace lowbit::w4a16_detail
