// The rule that splits the leftover tiles of a wgmma grid's last wave along K
// (w4a16_wave_rule.h). The cases are layers of the W4A16 benchmark on an
// H100 (132 SMs; one CTA per SM for the 256-row tile, two for 64 and 128).
#include <gtest/gtest.h>

#include "error_matchers.h"
#include "lowbit/w4a16/w4a16_wave_rule.h"

namespace lowbit {
namespace {

TEST(W4A16WaveRule, LeftoverTilesOfAPartialLastWaveAreSplit) {
  // Qwen3-14B's gate/up layer at 256 rows: 272 tiles, 80 k-iterations. 8
  // leftover tiles; the cost ceil(80 / s) + 1.5 s is 23 at s = 6, 22 at
  // s = 8, 23 at s = 10 (more splits cost more fix-up than they save).
  EXPECT_EQ(choose_wgmma_tail(272, 132, 80).tail_tiles, 8);
  EXPECT_EQ(choose_wgmma_tail(272, 132, 80).tail_split, 8);
  // The 5120-column layers at 1024 rows: 160 tiles, 28 left over: at most
  // 132 / 28 = 4 splits fit in one round beside the whole tiles.
  EXPECT_EQ(choose_wgmma_tail(160, 132, 80).tail_tiles, 28);
  EXPECT_EQ(choose_wgmma_tail(160, 132, 80).tail_split, 4);
  // Llama-70B's gate/up at 256 rows: 448 tiles, 52 left over, 2 splits.
  EXPECT_EQ(choose_wgmma_tail(448, 132, 128).tail_split, 2);
}

TEST(W4A16WaveRule, NoSplitWhereItCannotHelp) {
  // One wave or less: every tile is split by the caller's own rule instead.
  EXPECT_EQ(choose_wgmma_tail(132, 132, 80).tail_tiles, 0);
  EXPECT_EQ(choose_wgmma_tail(40, 132, 80).tail_tiles, 0);
  // Whole waves.
  EXPECT_EQ(choose_wgmma_tail(264, 132, 80).tail_tiles, 0);
  // 100 leftover tiles on 132 slots: no room for a second split of each.
  EXPECT_EQ(choose_wgmma_tail(232, 132, 80).tail_tiles, 0);
  EXPECT_EQ(choose_wgmma_tail(232, 132, 80).tail_split, 1);
  // Short K: fewer than 8 k-iterations leave no two pieces of 4 or more.
  EXPECT_EQ(choose_wgmma_tail(140, 132, 7).tail_tiles, 0);
  // 8 iterations: split 2 costs 4 + 3 against the round's 8, so it is taken.
  EXPECT_EQ(choose_wgmma_tail(140, 132, 8).tail_split, 2);
}

TEST(W4A16WaveRule, ForcedSplits) {
  EXPECT_EQ(choose_wgmma_tail(272, 132, 80, 1).tail_tiles, 0);
  const WgmmaTailSplit forced = choose_wgmma_tail(272, 132, 80, 16);
  EXPECT_EQ(forced.tail_tiles, 8);
  EXPECT_EQ(forced.tail_split, 16);
  EXPECT_EQ(choose_wgmma_tail(272, 132, 3, 16).tail_split, 3);  // at most one split per k-iteration
  // Forcing does not invent leftover tiles where there are none.
  EXPECT_EQ(choose_wgmma_tail(264, 132, 80, 4).tail_tiles, 0);
  EXPECT_EQ(choose_wgmma_tail(80, 132, 80, 4).tail_tiles, 0);
}

TEST(W4A16WaveRule, RejectsBadArguments) {
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_tail(0, 132, 80); }, ErrorKind::invalid_argument, "tiles"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_tail(10, 0, 80); }, ErrorKind::invalid_argument, "wave"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_tail(10, 4, 0); }, ErrorKind::invalid_argument, "iters"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_tail(10, 4, 8, -1); }, ErrorKind::invalid_argument, "forced"));
}

}  // namespace
}  // namespace lowbit
