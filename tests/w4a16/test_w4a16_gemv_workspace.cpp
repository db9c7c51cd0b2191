// The gemv kernel's split-K workspace (w4a16_gemv_workspace.h) against the
// stores of its CTAs and the loads of the last CTA of each column block. The
// CTA of block b and split s stores rows < rows of the 16 columns of each of
// its 8 warps, b * kGemvBlockColumns + 16 * warp + j (the warps past N_pad
// too: store_partials in w4a16_gemv.cu), and the last CTA of block b loads
//   partial[(s * kGemvRowsPerPass + row) * gemv_partial_row_floats(N_pad)
//           + b * kGemvBlockColumns + c]
// for every split s, row < rows and c < kGemvBlockColumns (the sum loops at
// the end of w4a16_gemv_kernel and of its shared epilogue). A partial loaded
// but not stored in the call is a value of another call or another row
// (what compute-sanitizer initcheck reported until v25); two stores to one
// partial would race.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "lowbit/w4a16/w4a16_gemv_workspace.h"
#include "lowbit/w4a16/w4a16_layout.h"

namespace lowbit::w4a16_detail {
namespace {

// How often each partial is stored (+1) and loaded by a last CTA (-1): all
// zero when every stored partial is loaded exactly once and nothing else is;
// `inside` is false if an index falls outside the workspace.
std::vector<int> stores_minus_loads(int split_k, int rows, int N_pad, bool* inside) {
  std::vector<int> balance(gemv_partial_floats(split_k, N_pad), 0);
  const size_t stride = gemv_partial_row_floats(N_pad);
  *inside = true;
  auto touch = [&](size_t i, int delta) {
    if (i >= balance.size()) *inside = false;
    else balance[i] += delta;
  };
  for (int b = 0; b < gemv_col_blocks(N_pad); ++b)
    for (int s = 0; s < split_k; ++s)
      for (int row = 0; row < rows; ++row) {
        const size_t row_start = (static_cast<size_t>(s) * kGemvRowsPerPass + row) * stride;
        for (int warp = 0; warp < kGemvBlockColumns / 16; ++warp)
          for (int j = 0; j < 16; ++j) touch(row_start + b * kGemvBlockColumns + 16 * warp + j, +1);
        for (int c = 0; c < kGemvBlockColumns; ++c) touch(row_start + b * kGemvBlockColumns + c, -1);
      }
  return balance;
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

TEST(W4A16GemvWorkspace, TheLastCtaLoadsEveryStoredPartialOnceAndNothingElse) {
  for (int N_pad = 64; N_pad <= 1024; N_pad += 64)
    for (int split = 2; split <= 17; ++split)
      for (int rows = 1; rows <= kGemvRowsPerPass; ++rows) {
        bool inside = false;
        const std::vector<int> balance = stores_minus_loads(split, rows, N_pad, &inside);
        ASSERT_TRUE(inside) << "N_pad " << N_pad << " split " << split << " rows " << rows;
        for (size_t i = 0; i < balance.size(); ++i)
          ASSERT_EQ(balance[i], 0) << "partial " << i << ", N_pad " << N_pad << " split " << split << " rows " << rows;
      }
  // Not vacuous: over an odd multiple of 64 columns the last block's upper
  // 64 columns are past N_pad, and rows N_pad floats apart (the layout until
  // v25) would overlap: the next row's first columns stored twice and loaded
  // twice, and the last row's loads past the end.
  EXPECT_EQ(gemv_partial_row_floats(192), 256u);
  EXPECT_EQ(gemv_partial_row_floats(256), 256u);
  EXPECT_EQ(gemv_partial_floats(3, 192), 3u * kGemvRowsPerPass * 256u);
}

}  // namespace
}  // namespace lowbit::w4a16_detail
