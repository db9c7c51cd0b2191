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
// and 64 past N_pad, whose warps compute on the last strip and store nothing
// into y.
inline constexpr int gemv_col_blocks(int N_pad) { return (N_pad + kGemvBlockColumns - 1) / kGemvBlockColumns; }

// The partials: [split][kGemvRowsPerPass rows][row of
// gemv_partial_row_floats(N_pad)] fp32. A row holds whole column blocks:
// N_pad is a multiple of 64, so the last block may hold 64 columns that are
// past N_pad; its warps for them store too (they computed on the last real
// strip, and nothing reads those sums into y), and the last CTA of a block
// loads all of its kGemvBlockColumns columns, each of them stored. (Until
// v25 rows were N_pad floats apart: those loads then read the next row's
// partials, values nobody had stored for this call, which compute-sanitizer
// initcheck reported, and ran 64 floats past the partials, which a slack
// covered. Skipping them by a load predicate instead cost a decode step 0.9%.)
inline constexpr size_t gemv_partial_row_floats(int N_pad) {
  return static_cast<size_t>(gemv_col_blocks(N_pad)) * kGemvBlockColumns;
}
inline constexpr size_t gemv_partial_floats(int split_k, int N_pad) {
  return static_cast<size_t>(split_k) * kGemvRowsPerPass * gemv_partial_row_floats(N_pad);
}

}  // namespace lowbit::w4a16_detail
