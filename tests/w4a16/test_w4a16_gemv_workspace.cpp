// The gemv kernel's split-K workspace (w4a16_gemv_workspace.h) against the
// loads of its last CTA. That CTA of column block b reads
//   partial[(s * kGemvRowsPerPass + row) * N_pad + b * kGemvBlockColumns + c]
// for every split s, row < rows and c < kGemvBlockColumns (the sum loop at the
// end of w4a16_gemv_kernel and of its shared epilogue in w4a16_gemv.cu).
#include <gtest/gtest.h>

#include <cstddef>

#include "lowbit/w4a16/w4a16_gemv_workspace.h"
#include "lowbit/w4a16/w4a16_layout.h"

namespace lowbit::w4a16_detail {
namespace {

// One past the largest index the last CTA of the last column block loads.
size_t last_block_loads_end(int split_k, int rows, int N_pad) {
  const size_t last_row = static_cast<size_t>(split_k - 1) * kGemvRowsPerPass + static_cast<size_t>(rows - 1);
  const size_t block_col = static_cast<size_t>(gemv_col_blocks(N_pad) - 1) * kGemvBlockColumns;
  return last_row * static_cast<size_t>(N_pad) + block_col + kGemvBlockColumns;
}

TEST(W4A16GemvWorkspace, ColumnBlocksCoverThePaddedColumns) {
  EXPECT_EQ(gemv_col_blocks(64), 1);
  EXPECT_EQ(gemv_col_blocks(128), 1);
  EXPECT_EQ(gemv_col_blocks(192), 2);
  EXPECT_EQ(gemv_col_blocks(static_cast<int>(w4a16_padded_n(17408))), 136);  // Qwen3-14B down
  for (int N_pad = 64; N_pad <= 4096; N_pad += 64) {
    EXPECT_GE(gemv_col_blocks(N_pad) * kGemvBlockColumns, N_pad);
    EXPECT_LT((gemv_col_blocks(N_pad) - 1) * kGemvBlockColumns, N_pad);
  }
}

TEST(W4A16GemvWorkspace, PartialsHoldEveryLoadOfTheLastCta) {
  for (int N_pad = 64; N_pad <= 2048; N_pad += 64)
    for (int split = 1; split <= 64; ++split)
      for (int rows = 1; rows <= kGemvRowsPerPass; ++rows)
        ASSERT_LE(last_block_loads_end(split, rows, N_pad), gemv_partial_floats(split, N_pad))
            << "N_pad " << N_pad << " split " << split << " rows " << rows;
  // Not vacuous: without the slack, a full pass over an odd multiple of 64
  // columns loads past the partials (the layer of W4A16Gemm.GemvEveryRowCountAndSplit
  // with N = 136, N_pad = 192, at 8 rows).
  const size_t partials_only = static_cast<size_t>(3) * kGemvRowsPerPass * 192;
  EXPECT_EQ(gemv_partial_floats(3, 192) - partials_only, kGemvPartialSlackFloats);
  EXPECT_GT(last_block_loads_end(3, kGemvRowsPerPass, 192), partials_only);
  EXPECT_LE(last_block_loads_end(3, kGemvRowsPerPass - 1, 192), partials_only);
  EXPECT_LE(last_block_loads_end(3, kGemvRowsPerPass, 256), static_cast<size_t>(3) * kGemvRowsPerPass * 256);
}

}  // namespace
}  // namespace lowbit::w4a16_detail
