// The rule w4a16_tune uses to pick among timed gemv K splits
// (w4a16_tune_rule.h): a larger split only when it is clearly faster; and
// the split used untimed.
#include <gtest/gtest.h>

#include <vector>

#include "error_matchers.h"
#include "lowbit/w4a16/w4a16_tune_rule.h"

namespace lowbit {
namespace {

TEST(W4A16TuneRule, LargerSplitsMustBeatTheMarginToBeTaken) {
  // Qwen3-14B's gate/up projection as one H100 run timed it alone (us):
  // split 8 within 1% of split 4 keeps split 4.
  const std::vector<TimedGemvSplit> gate_up = {{1, 58.1}, {2, 54.4}, {4, 51.0}, {8, 50.6}, {12, 53.5}, {16, 56.5}};
  EXPECT_EQ(choose_gemv_split(gate_up, kGemvSplitMargin), 4);
  // The o projection: split 8 is 5% faster than split 4, so it is taken.
  const std::vector<TimedGemvSplit> o = {{1, 25.9}, {2, 17.8}, {4, 15.8}, {8, 15.0}, {12, 16.0}, {16, 16.8}};
  EXPECT_EQ(choose_gemv_split(o, kGemvSplitMargin), 8);
  // With no margin it is the fastest; ties go to the smaller split.
  EXPECT_EQ(choose_gemv_split(gate_up, 0.0), 8);
  EXPECT_EQ(choose_gemv_split(std::vector<TimedGemvSplit>{{4, 10.0}, {2, 10.0}}, 0.0), 2);
}

TEST(W4A16TuneRule, OrderOfTheListDoesNotMatter) {
  const std::vector<TimedGemvSplit> sorted = {{1, 30.0}, {2, 20.0}, {4, 19.5}, {8, 19.0}, {16, 25.0}};
  const std::vector<TimedGemvSplit> shuffled = {{8, 19.0}, {1, 30.0}, {16, 25.0}, {4, 19.5}, {2, 20.0}};
  // 2 beats 1 by 33%; 4 is within 3% of 2; 8 is 5% faster than 2.
  EXPECT_EQ(choose_gemv_split(sorted, kGemvSplitMargin), 8);
  EXPECT_EQ(choose_gemv_split(shuffled, kGemvSplitMargin), 8);
  // The same split timed twice is still that split.
  EXPECT_EQ(choose_gemv_split(std::vector<TimedGemvSplit>{{4, 20.0}, {4, 10.0}}, kGemvSplitMargin), 4);
}

TEST(W4A16TuneRule, RejectsEmptyListsAndBadSplits) {
  EXPECT_TRUE(test::throws_error([] { choose_gemv_split({}, kGemvSplitMargin); }, ErrorKind::invalid_argument,
                                 "timed"));
  EXPECT_TRUE(test::throws_error(
      [] { choose_gemv_split(std::vector<TimedGemvSplit>{{0, 1.0}}, kGemvSplitMargin); },
      ErrorKind::invalid_argument, "split"));
  EXPECT_TRUE(test::throws_error(
      [] { choose_gemv_split(std::vector<TimedGemvSplit>{{1, 1.0}}, 1.5); }, ErrorKind::invalid_argument,
      "margin"));
}

// The untimed split (gemv_split_rule): ~16 k-iterations per CTA, at most
// 16 ways, more for grids that would leave most SMs idle, one fewer (at one
// row) where a grid of several rounds of resident CTAs would end on a nearly
// empty round.
// The nine benchmark shapes on an H100 (132 SMs, 5 resident CTAs per SM at
// one row and group 128), with the splits the M = 1 sweeps measured best in
// parentheses (docs/w4a16-gemm.md, v26).
TEST(W4A16TuneRule, UntimedSplitGivesAboutSixteenIterationsPerCta) {
  struct Shape { int iters; int64_t blocks; int split; };
  for (const Shape s : {Shape{64, 32, 4},      // 4096 x 4096 (split 4 best)
                        Shape{128, 64, 8},     // 8192 x 8192 (8)
                        Shape{256, 128, 15},   // 16384 x 16384 (16; 2-8 within 1%): 16 is 3 rounds + 68 CTAs
                        Shape{80, 56, 5},      // Qwen3-14B qkv (4; 5 is 7% slower)
                        Shape{80, 40, 5},      // o (5)
                        Shape{80, 272, 4},     // gate/up (4; 5 within 3%): 5 is 2 rounds + 40 CTAs
                        Shape{272, 40, 16},    // down (16)
                        Shape{128, 448, 8},    // Llama-70B gate/up (8): its last round 43% full
                        Shape{448, 64, 16}}) { // Llama-70B down (16)
    EXPECT_EQ(gemv_split_rule(s.iters, s.blocks, 132, 5, 1), s.split) << s.iters << " x " << s.blocks;
  }
  // The last-round check is made at one row only: at 2-4 rows the gate/up
  // GEMM keeps split 5 (split 4 made those decode steps slower, v29), and so
  // does 16384 x 16384.
  for (const int64_t rows : {2, 3, 4, 8}) {
    EXPECT_EQ(gemv_split_rule(80, 272, 132, 5, rows), 5) << rows << " rows";
    EXPECT_EQ(gemv_split_rule(256, 128, 132, 5, rows), 16) << rows << " rows";
  }
  // The last-round check follows the resident CTAs: at 4 per SM (528) split
  // 5 of the gate/up GEMM is 2 rounds + 304 CTAs, and split 4 stays at 5.
  EXPECT_EQ(gemv_split_rule(80, 272, 132, 4, 1), 5);
  // One round or less: no change (the down GEMM, 640 CTAs of 660).
  EXPECT_EQ(gemv_split_rule(272, 40, 132, 5, 1), 16);
  // A narrow layer: one 128-column block would be 4 CTAs; it takes up to an
  // SM each while 4 k-iterations per CTA remain.
  EXPECT_EQ(gemv_split_rule(64, 1, 132, 5, 1), 16);
  EXPECT_EQ(gemv_split_rule(8, 1, 132, 5, 1), 2);
  // Short K: never more parts than k-iterations.
  EXPECT_EQ(gemv_split_rule(1, 1, 132, 5, 1), 1);
  EXPECT_EQ(gemv_split_rule(3, 2, 132, 5, 1), 1);
  EXPECT_TRUE(test::throws_error([] { gemv_split_rule(0, 1, 132, 5, 1); }, ErrorKind::invalid_argument, "iters"));
  EXPECT_TRUE(test::throws_error([] { gemv_split_rule(8, 0, 132, 5, 1); }, ErrorKind::invalid_argument, "col_blocks"));
  EXPECT_TRUE(test::throws_error([] { gemv_split_rule(8, 1, 0, 5, 1); }, ErrorKind::invalid_argument, "sms"));
  EXPECT_TRUE(test::throws_error([] { gemv_split_rule(8, 1, 132, 0, 1); }, ErrorKind::invalid_argument, "ctas_per_sm"));
  EXPECT_TRUE(test::throws_error([] { gemv_split_rule(8, 1, 132, 5, 0); }, ErrorKind::invalid_argument, "rows"));
}

}  // namespace
}  // namespace lowbit
