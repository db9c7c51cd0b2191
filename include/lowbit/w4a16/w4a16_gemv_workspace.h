// The split-K workspace of the W4A16 decode kernel (strategy `gemv`,
// src/w4a16/w4a16_gemv.cu). Plain C++ header, so that its sizes are tested
// on the CPU (tests/w4a16/test_w4a16_gemv_workspace.cpp).
#pragma once

#include <cstddef>

namespace lowbit::w4a16_detail {

// Rows of x one pass of the kernel serves: the n of mma.m16n8k16.
inline constexpr int kGemvRowsPerPass = 8;
// Output columns of one CTA: 8 warps of 16.
inline constexpr int kGemvBlockColumns = 128;

// Column blocks of the grid (one CTA each per K split). N_pad is a multiple
// of 64 (w4a16_padded_n), so the last block may hold 64 columns of the layer
// and 64 that no warp computes.
inline constexpr int gemv_col_blocks(int N_pad) { return (N_pad + kGemvBlockColumns - 1) / kGemvBlockColumns; }

// After the partials, the last block's sum may read this many floats more.
// The last CTA of a column block loads all kGemvBlockColumns columns of
// every split's rows. Where N_pad is an odd multiple of 64, the upper 64
// columns of the last block run into the next row's partials, and after row 8
// of the last split past the partials. Their sums are never written to y.
// (Skipping those loads instead, by testing the column against N_pad in the
// load predicate, cost a decode step 0.9%: docs/w4a16-gemm.md v24.)
inline constexpr size_t kGemvPartialSlackFloats = kGemvBlockColumns / 2;

// The partials: [split][kGemvRowsPerPass rows][N_pad] fp32, then the slack.
inline constexpr size_t gemv_partial_floats(int split_k, int N_pad) {
  return static_cast<size_t>(split_k) * kGemvRowsPerPass * static_cast<size_t>(N_pad) + kGemvPartialSlackFloats;
}

}  // namespace lowbit::w4a16_detail
