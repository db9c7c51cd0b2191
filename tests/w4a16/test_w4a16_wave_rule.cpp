// The rule that splits the leftover tiles of a wgmma grid's last wave along K
// (w4a16_wave_rule.h). The cases are layers of the W4A16 benchmark on an
// H100 (132 SMs; one CTA per SM for the 256-row tile, two for 64 and 128).
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

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

// The H100's L2 (50 MB) and x of the 5120-row layers at 512 rows (5 MB).
constexpr int64_t kL2 = 50 << 20, kX = 512 * 5120 * 2;

TEST(W4A16WaveRule, StreamKWhereTheUniformSplitLeavesTheWaveIdle) {
  // The 5120-column layers at 512 rows: 80 tiles of 256 x 128 on 132 SMs.
  // The uniform split is 1 (132 / 80), one whole tile per CTA: 80 of 132
  // SMs busy. Stream-K gives every SM ceil(80 x 80 / 132) = 49 k-iterations
  // of Qwen3-14B's o projection (+3 for its fix-up, against 80), and 165 of
  // the down projection's 272 (x: 512 x 17408 in 16 bits, 18 MB).
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 80, 1, 512, 256, 0, kX, kL2, false), 132);
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 272, 1, 512, 256, 0, 512 * 17408 * 2, kL2, false), 132);
  // Where the uniform split already fills the wave, no spreading over the
  // wave: 112 tiles (qwen3-qkv at 512 rows): 68 + 3 against 80, 89%, not
  // enough. (64 tiles split 2, sq4096 at 512 rows, 32 against 32 + 3, run
  // their split as stream-K: short K, below.)
  EXPECT_EQ(choose_wgmma_stream_k(112, 132, 80, 1, 512, 256, 0, kX, kL2, false), 0);
  // Long K (256+ k-iterations): the uniform split stays (sq16384 at 64 rows,
  // qwen3-down at 128, llama70-down at 64).
  EXPECT_EQ(choose_wgmma_stream_k(128, 264, 256, 2, 128, 128, 0, kX, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(40, 264, 272, 6, 128, 128, 0, kX, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(64, 264, 448, 4, 128, 128, 0, kX, kL2, false), 0);
}

TEST(W4A16WaveRule, ShortKRunsTheUniformSplitAsStreamK) {
  // The same pieces, one per CTA (S < 6), or pairs of them (S >= 6):
  // qwen3-o at 256 rows (40 tiles, S = 3), sq8192 at 128 rows (64 tiles of
  // 128 k-iterations, S = 4), sq4096 at 128 rows (32 tiles, S = 8 -> 4),
  // qwen3-o at 128 rows (40 tiles, S = 6 -> 3).
  EXPECT_EQ(choose_wgmma_stream_k(40, 132, 80, 3, 256, 256, 0, kX, kL2, false), 120);
  EXPECT_EQ(choose_wgmma_stream_k(64, 264, 128, 4, 128, 128, 0, kX, kL2, false), 256);
  EXPECT_EQ(choose_wgmma_stream_k(32, 264, 64, 8, 128, 128, 0, kX, kL2, false), 128);
  EXPECT_EQ(choose_wgmma_stream_k(40, 264, 80, 6, 128, 128, 0, kX, kL2, false), 120);
  // Where the uniform split shares its fix-up (64- and 128-row tiles, since
  // v48) this clause keeps the uniform split: the three 128-row points
  // above, and qwen3-qkv at 64 rows (56 tiles on the two-CTA build's 264,
  // S = 4).
  EXPECT_EQ(choose_wgmma_stream_k(64, 264, 128, 4, 128, 128, 0, kX, kL2, true), 0);
  EXPECT_EQ(choose_wgmma_stream_k(32, 264, 64, 8, 128, 128, 0, kX, kL2, true), 0);
  EXPECT_EQ(choose_wgmma_stream_k(40, 264, 80, 6, 128, 128, 0, kX, kL2, true), 0);
  EXPECT_EQ(choose_wgmma_stream_k(56, 264, 80, 4, 64, 64, 0, kX, kL2, true), 0);
  // It does not touch the other clauses: stream-K over the wave where the
  // cost test says so, and forced counts.
  EXPECT_EQ(choose_wgmma_stream_k(3, 132, 10, 1, 256, 256, 0, kX, kL2, true), 30);
  EXPECT_EQ(choose_wgmma_stream_k(64, 264, 128, 4, 128, 128, 100, kX, kL2, true), 100);
  // S = 2 (since v45): sq8192 at 256 rows (64 tiles of 128 k-iterations),
  // qwen3-qkv at 160 rows (56 tiles of 80), sq4096 at 512 rows (64 tiles of
  // 64).
  EXPECT_EQ(choose_wgmma_stream_k(64, 132, 128, 2, 256, 256, 0, kX, kL2, false), 128);
  EXPECT_EQ(choose_wgmma_stream_k(56, 132, 80, 2, 160, 256, 0, kX, kL2, false), 112);
  EXPECT_EQ(choose_wgmma_stream_k(64, 132, 64, 2, 512, 256, 0, kX, kL2, false), 128);
  // S = 1 keeps the uniform split (no fix-up at all); so does K of 129+
  // k-iterations at any S.
  EXPECT_EQ(choose_wgmma_stream_k(120, 132, 80, 1, 768, 256, 0, kX, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(32, 264, 129, 8, 128, 128, 0, kX, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(64, 132, 129, 2, 256, 256, 0, kX, kL2, false), 0);
  // x beyond half of L2: none.
  EXPECT_EQ(choose_wgmma_stream_k(32, 264, 64, 8, 128, 128, 0, kL2, kL2, false), 0);
  // A wave or more: the tail rule's domain.
  EXPECT_EQ(choose_wgmma_stream_k(132, 132, 80, 1, 256, 256, 0, kX, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(160, 132, 80, 1, 1024, 256, 0, kX, kL2, false), 0);
  // Fewer k-iterations in all than the wave: one CTA per k-iteration.
  EXPECT_EQ(choose_wgmma_stream_k(3, 132, 10, 1, 256, 256, 0, kX, kL2, false), 30);
}

TEST(W4A16WaveRule, ShortKNoStreamKWhenTheLastOfSeveralSmallRowTilesIsLessThanThreeQuartersFull) {
  // 256-row tiles (since v46, with the last row tile's box of real rows):
  // qwen3-o's 80 tiles take stream-K over the wave however full the second
  // row tile, sq4096's S = 2 runs as stream-K.
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 80, 1, 448, 256, 0, kX, kL2, false), 132);
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 80, 1, 447, 256, 0, kX, kL2, false), 132);
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 80, 1, 400, 256, 0, kX, kL2, false), 132);
  EXPECT_EQ(choose_wgmma_stream_k(64, 132, 64, 2, 400, 256, 0, kX, kL2, false), 128);
  EXPECT_EQ(choose_wgmma_stream_k(64, 132, 64, 2, 480, 256, 0, kX, kL2, false), 128);
  // The cost test still keeps qwen3-qkv's 112 tiles off it.
  EXPECT_EQ(choose_wgmma_stream_k(112, 132, 80, 1, 400, 256, 0, kX, kL2, false), 0);
  // 128-row tiles: not with a last row tile under three quarters full
  // (qwen3-o at 288 / 320 rows: three row tiles of 128, 120 tiles on a
  // two-CTA wave of 264), from there on yes.
  EXPECT_EQ(choose_wgmma_stream_k(120, 264, 80, 2, 288, 128, 0, kX, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(120, 264, 80, 2, 320, 128, 0, kX, kL2, false), 0);
  EXPECT_GT(choose_wgmma_stream_k(120, 264, 80, 2, 384, 128, 0, kX, kL2, false), 0);
  // One row tile, however full: stream-K (qwen3-o at 129 rows, S = 3).
  EXPECT_EQ(choose_wgmma_stream_k(40, 132, 80, 3, 129, 256, 0, kX, kL2, false), 120);
  // Forced stream-K ignores the fill; long K (qwen3-down, 272 k-iterations)
  // keeps stream-K whatever the fill.
  EXPECT_EQ(choose_wgmma_stream_k(120, 264, 80, 2, 288, 128, 264, kX, kL2, false), 264);
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 272, 1, 320, 256, 0, 320 * 17408 * 2, kL2, false), 132);
}

TEST(W4A16WaveRule, NoStreamKWhenXOutgrowsHalfOfL2) {
  // The same 80 tiles with x of 29 MB (K = 28672 at 512 rows): the
  // CTAs spread over K would re-read x from HBM.
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 448, 1, 512, 256, 0, int64_t{512} * 28672 * 2, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 400, 1, 512, 256, 0, kL2 / 2, kL2, false), 132);
  // Forcing ignores the size of x.
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 448, 1, 512, 256, 132, int64_t{512} * 28672 * 2, kL2, false), 132);
}

TEST(W4A16WaveRule, ForcedStreamK) {
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 80, 1, 512, 256, 1, kX, kL2, false), 0);
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 80, 1, 512, 256, 100, kX, kL2, false), 100);
  // Fewer CTAs than tiles (ranges of several tiles); at most one CTA per
  // k-iteration.
  EXPECT_EQ(choose_wgmma_stream_k(80, 132, 80, 1, 512, 256, 2, kX, kL2, false), 2);
  EXPECT_EQ(choose_wgmma_stream_k(3, 132, 10, 1, 256, 256, 1000, kX, kL2, false), 30);
  // Even where the rule says no, a wave or more of tiles included, which
  // the rule never runs as stream-K.
  EXPECT_EQ(choose_wgmma_stream_k(64, 132, 64, 2, 512, 256, 132, kX, kL2, false), 132);
  EXPECT_EQ(choose_wgmma_stream_k(160, 132, 80, 1, 1024, 256, 132, kX, kL2, false), 132);
  EXPECT_EQ(choose_wgmma_stream_k(160, 132, 80, 1, 1024, 256, 0, kX, kL2, false), 0);
}

TEST(W4A16WaveRule, TileRowsHoldMAndTake128RowsForThinGridsUpTo384) {
  // The smallest tile that holds M, then 256 rows.
  EXPECT_EQ(choose_wgmma_tile_rows(5, 40, 132), 16);
  EXPECT_EQ(choose_wgmma_tile_rows(17, 40, 132), 32);
  EXPECT_EQ(choose_wgmma_tile_rows(64, 40, 132), 64);
  EXPECT_EQ(choose_wgmma_tile_rows(65, 40, 132), 128);
  EXPECT_EQ(choose_wgmma_tile_rows(256, 40, 132), 256);
  EXPECT_EQ(choose_wgmma_tile_rows(1024, 40, 132), 256);
  // Qwen3-14B's o / down projections (40 column tiles, 80 tiles of 256 rows
  // on 132 SMs) at 257-384 rows: 128-row tiles; from 385 rows (four row
  // tiles of 128) 256.
  EXPECT_EQ(choose_wgmma_tile_rows(257, 40, 132), 128);
  EXPECT_EQ(choose_wgmma_tile_rows(384, 40, 132), 128);
  EXPECT_EQ(choose_wgmma_tile_rows(385, 40, 132), 256);
  EXPECT_EQ(choose_wgmma_tile_rows(447, 40, 132), 256);
  EXPECT_EQ(choose_wgmma_tile_rows(448, 40, 132), 256);
  EXPECT_EQ(choose_wgmma_tile_rows(511, 40, 132), 256);
  EXPECT_EQ(choose_wgmma_tile_rows(512, 40, 132), 256);
  // Grids of 256-row tiles that fill three quarters of the wave keep them:
  // qwen3-qkv (56 column tiles: 112 of 132), sq8192 (64); 49 column tiles is
  // the last that does not (98 < 99).
  EXPECT_EQ(choose_wgmma_tile_rows(384, 56, 132), 256);
  EXPECT_EQ(choose_wgmma_tile_rows(384, 64, 132), 256);
  EXPECT_EQ(choose_wgmma_tile_rows(384, 49, 132), 128);
  EXPECT_EQ(choose_wgmma_tile_rows(384, 50, 132), 256);
  // Wide layers fill the wave whatever M.
  EXPECT_EQ(choose_wgmma_tile_rows(300, 136, 132), 256);
}

TEST(W4A16WaveRule, TileRowsRejectBadArguments) {
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_tile_rows(0, 40, 132); }, ErrorKind::invalid_argument, "M"));
  EXPECT_TRUE(
      test::throws_error([] { choose_wgmma_tile_rows(300, 0, 132); }, ErrorKind::invalid_argument, "col_tiles"));
  EXPECT_TRUE(
      test::throws_error([] { choose_wgmma_tile_rows(300, 40, 0); }, ErrorKind::invalid_argument, "wave_of_256"));
}

// Weight bytes of the benchmark's layers at group 128 (4-bit codes plus an
// fp16 scale and zero per group and column).
int64_t w4_bytes(int64_t K, int64_t N) { return K * N / 2 + K / 128 * N * 4; }

TEST(W4A16WaveRule, RowRemainderWhereARowOfTilesCostsWellMoreThanReadingTheWeights) {
  // Qwen3-14B's gate/up (272 column tiles of 80 k-iterations, 256-row tiles
  // at every M): a row of tiles ~114 us on 132 SMs, the weights' re-read ~37
  // us at one row, ~86 us at 128: every remainder up to kMaxRemainderRows.
  const int64_t gateup = w4_bytes(5120, 34816);
  EXPECT_EQ(choose_row_remainder(257, 256, 272, 80, 132, gateup), 1);
  EXPECT_EQ(choose_row_remainder(320, 256, 272, 80, 132, gateup), 64);
  EXPECT_EQ(choose_row_remainder(384, 256, 272, 80, 132, gateup), 128);
  EXPECT_EQ(choose_row_remainder(385, 256, 272, 80, 132, gateup), 0);
  // Whole row tiles, or no more than one: nothing to split off.
  EXPECT_EQ(choose_row_remainder(512, 256, 272, 80, 132, gateup), 0);
  EXPECT_EQ(choose_row_remainder(256, 256, 272, 80, 132, gateup), 0);
  EXPECT_EQ(choose_row_remainder(200, 256, 272, 80, 132, gateup), 0);
  // Qwen3-14B's qkv projection (56 x 80; ~23 us a row, ~14 us the re-read
  // at one row): up to 33 rows.
  const int64_t qkv = w4_bytes(5120, 7168);
  EXPECT_EQ(choose_row_remainder(257, 256, 56, 80, 132, qkv), 1);
  EXPECT_EQ(choose_row_remainder(289, 256, 56, 80, 132, qkv), 33);
  EXPECT_EQ(choose_row_remainder(290, 256, 56, 80, 132, qkv), 0);
  // Plans on 128-row tiles pad a 128-row tile: half the row. Qwen3-14B's o
  // projection (40 x 80) and sq4096 stay whole at 257 rows; its down
  // projection (40 x 272) splits one row off, not four.
  EXPECT_EQ(choose_row_remainder(257, 128, 40, 80, 132, w4_bytes(5120, 5120)), 0);
  EXPECT_EQ(choose_row_remainder(257, 128, 32, 64, 132, w4_bytes(4096, 4096)), 0);
  EXPECT_EQ(choose_row_remainder(257, 128, 40, 272, 132, w4_bytes(17408, 5120)), 1);
  EXPECT_EQ(choose_row_remainder(260, 128, 40, 272, 132, w4_bytes(17408, 5120)), 0);
  // Fewer SMs make the row of tiles dearer.
  EXPECT_EQ(choose_row_remainder(257, 128, 40, 80, 66, w4_bytes(5120, 5120)), 1);
  // Above 512 rows, by the grids' critical paths (wgmma_grid_iters): sq4096
  // (32 column tiles of 64 k-iterations) at 769 rows runs 128 tiles in one
  // round, like 96 at 768, so nothing is saved; at 1025 rows 160 tiles take a
  // round and a tail split (64 + 16 + 6 iterations) where 128 take ~one.
  const int64_t sq4096 = w4_bytes(4096, 4096);
  EXPECT_EQ(choose_row_remainder(769, 256, 32, 64, 132, sq4096), 0);
  EXPECT_EQ(choose_row_remainder(1025, 256, 32, 64, 132, sq4096), 1);
  EXPECT_EQ(choose_row_remainder(1088, 256, 32, 64, 132, sq4096), 0);
  EXPECT_EQ(choose_row_remainder(520, 256, 32, 64, 132, sq4096), 8);
  EXPECT_EQ(choose_row_remainder(1152, 256, 272, 80, 132, gateup), 128);
  EXPECT_EQ(choose_row_remainder(1153, 256, 272, 80, 132, gateup), 0);
  EXPECT_EQ(choose_row_remainder(1025, 256, 272, 80, 132, gateup), 1);
  // Forced: always (any remainder) or never.
  EXPECT_EQ(choose_row_remainder(257, 128, 32, 64, 132, w4_bytes(4096, 4096), 2), 1);
  EXPECT_EQ(choose_row_remainder(511, 256, 32, 64, 132, w4_bytes(4096, 4096), 2), 255);
  EXPECT_EQ(choose_row_remainder(512, 256, 32, 64, 132, w4_bytes(4096, 4096), 2), 0);
  EXPECT_EQ(choose_row_remainder(257, 256, 272, 80, 132, gateup, 1), 0);
}

TEST(W4A16WaveRule, GridIterationsFollowTheRoundsTailAndStreamK) {
  // 160 tiles of 80 k-iterations on 132 SMs: a round, then the 28 left over
  // split 4 ways (20 iterations and 4 x 1.5 of fix-up).
  EXPECT_DOUBLE_EQ(wgmma_grid_iters(160, 132, 80), 80 + 20 + 6);
  EXPECT_DOUBLE_EQ(wgmma_grid_iters(264, 132, 80), 160);  // two whole rounds
  EXPECT_DOUBLE_EQ(wgmma_grid_iters(272, 132, 80), 160 + 22);  // the 8 left over split 8 ways
  // Under a wave: the uniform split (128 tiles: one round of 64) or stream-K
  // (96 tiles: ceil(96 x 64 / 132) = 47, + 3).
  EXPECT_DOUBLE_EQ(wgmma_grid_iters(128, 132, 64), 64);
  EXPECT_DOUBLE_EQ(wgmma_grid_iters(96, 132, 64), 50);
  EXPECT_TRUE(test::throws_error([] { wgmma_grid_iters(0, 132, 64); }, ErrorKind::invalid_argument, "tiles"));
  EXPECT_TRUE(test::throws_error([] { wgmma_grid_iters(1, 0, 64); }, ErrorKind::invalid_argument, "wave"));
  EXPECT_TRUE(test::throws_error([] { wgmma_grid_iters(1, 132, 0); }, ErrorKind::invalid_argument, "iters"));
}

TEST(W4A16WaveRule, RowRemainderRejectsBadArguments) {
  EXPECT_TRUE(
      test::throws_error([] { choose_row_remainder(0, 256, 4, 4, 132, 0); }, ErrorKind::invalid_argument, "M"));
  EXPECT_TRUE(test::throws_error([] { choose_row_remainder(300, 0, 4, 4, 132, 0); }, ErrorKind::invalid_argument,
                                 "tile_rows"));
  EXPECT_TRUE(test::throws_error([] { choose_row_remainder(300, 256, 0, 4, 132, 0); }, ErrorKind::invalid_argument,
                                 "col_tiles"));
  EXPECT_TRUE(
      test::throws_error([] { choose_row_remainder(300, 256, 4, 0, 132, 0); }, ErrorKind::invalid_argument, "iters"));
  EXPECT_TRUE(test::throws_error([] { choose_row_remainder(300, 256, 4, 4, 0, 0); }, ErrorKind::invalid_argument,
                                 "wave_of_256"));
  EXPECT_TRUE(test::throws_error([] { choose_row_remainder(300, 256, 4, 4, 132, -1); }, ErrorKind::invalid_argument,
                                 "weight_bytes"));
  EXPECT_TRUE(test::throws_error([] { choose_row_remainder(300, 256, 4, 4, 132, 0, 3); },
                                 ErrorKind::invalid_argument, "forced"));
}

TEST(W4A16WaveRule, StreamKRejectsBadArguments) {
  auto call = [](int64_t tiles, int64_t wave, int iters, int64_t uniform, int64_t rows, int tile_rows, int64_t forced,
                 int64_t x, int64_t l2) {
    return [=] { choose_wgmma_stream_k(tiles, wave, iters, uniform, rows, tile_rows, forced, x, l2, false); };
  };
  EXPECT_TRUE(test::throws_error(call(0, 132, 80, 1, 256, 256, 0, kX, kL2), ErrorKind::invalid_argument, "tiles"));
  EXPECT_TRUE(test::throws_error(call(10, 0, 80, 1, 256, 256, 0, kX, kL2), ErrorKind::invalid_argument, "wave"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 0, 1, 256, 256, 0, kX, kL2), ErrorKind::invalid_argument, "iters"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 8, 0, 256, 256, 0, kX, kL2), ErrorKind::invalid_argument, "uniform_split"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 8, 1, 0, 256, 0, kX, kL2), ErrorKind::invalid_argument, "rows"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 8, 1, 256, 0, 0, kX, kL2), ErrorKind::invalid_argument, "tile_rows"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 8, 1, 11 * 256, 256, 0, kX, kL2), ErrorKind::invalid_argument, "rows"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 8, 1, 256, 256, -1, kX, kL2), ErrorKind::invalid_argument, "forced"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 8, 1, 256, 256, 0, -1, kL2), ErrorKind::invalid_argument, "x_bytes"));
  EXPECT_TRUE(test::throws_error(call(10, 132, 8, 1, 256, 256, 0, kX, 0), ErrorKind::invalid_argument, "l2_bytes"));
}

// The nine anchor shapes at 64 rows on an H100 (two-CTA wave 264):
// long K or a two-CTA wave of tiles takes the three-CTA build, the short-K
// grids of fewer tiles do not.
TEST(W4A16WaveRule, UniformSplitFillsTheWaveWithFourIterationsPerCta) {
  // sq4096 at 128 rows: 32 tiles on a 264-CTA wave, 64 k-iterations: 8.
  EXPECT_EQ(wgmma_uniform_split(32, 264, 64), 8);
  // Qwen3-14B's down projection at 512 rows: 80 tiles, 132 CTAs: 1.
  EXPECT_EQ(wgmma_uniform_split(80, 132, 272), 1);
  // Short K caps it: 12 k-iterations allow 3 splits, not 264 / 8 = 33.
  EXPECT_EQ(wgmma_uniform_split(8, 264, 12), 3);
  // A full wave or more, or K of fewer than 8 k-iterations: no split.
  EXPECT_EQ(wgmma_uniform_split(300, 264, 64), 1);
  EXPECT_EQ(wgmma_uniform_split(1, 264, 3), 1);
  EXPECT_TRUE(test::throws_error([] { wgmma_uniform_split(0, 264, 64); }, ErrorKind::invalid_argument, "tiles"));
  EXPECT_TRUE(test::throws_error([] { wgmma_uniform_split(8, 0, 64); }, ErrorKind::invalid_argument, "wave"));
  EXPECT_TRUE(test::throws_error([] { wgmma_uniform_split(8, 264, 0); }, ErrorKind::invalid_argument, "iters"));
}

TEST(W4A16WaveRule, DenseBuildForLongKOrThreeCtaWaves) {
  constexpr int64_t kWave = 264;
  EXPECT_FALSE(choose_wgmma_dense(32, kWave, 64));    // sq4096
  EXPECT_FALSE(choose_wgmma_dense(64, kWave, 128));   // sq8192: 128 is still short
  EXPECT_TRUE(choose_wgmma_dense(128, kWave, 256));   // sq16384
  EXPECT_FALSE(choose_wgmma_dense(56, kWave, 80));    // Qwen3-14B qkv
  EXPECT_FALSE(choose_wgmma_dense(40, kWave, 80));    // o
  EXPECT_FALSE(choose_wgmma_dense(272, kWave, 80));   // gate/up: short K, less than a three-CTA wave
  EXPECT_TRUE(choose_wgmma_dense(40, kWave, 272));    // down
  EXPECT_TRUE(choose_wgmma_dense(448, kWave, 128));   // Llama-70B gate/up
  EXPECT_TRUE(choose_wgmma_dense(64, kWave, 448));    // down
  EXPECT_TRUE(choose_wgmma_dense(396, kWave, 8));     // exactly a three-CTA wave
  EXPECT_FALSE(choose_wgmma_dense(395, kWave, 128));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_dense(0, kWave, 8); }, ErrorKind::invalid_argument, "tiles"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_dense(8, 0, 8); }, ErrorKind::invalid_argument, "wave_of_two"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_dense(8, kWave, 0); }, ErrorKind::invalid_argument, "iters"));
}

TEST(W4A16WaveRule, TileGroupsKeepAGroupsXInAQuarterOfL2) {
  constexpr int64_t kMB = 1024 * 1024;
  // Qwen3-14B gate/up (K = 5120) at 256 rows: 2.5 MB of x per row tile; a
  // quarter of the 50 MB L2 holds 5.
  const int64_t x_tile = 256 * 5120 * 2;
  EXPECT_EQ(choose_wgmma_group_rows(4, x_tile, kL2), 4);    // M = 1024: all of x fits, the plain order
  EXPECT_EQ(choose_wgmma_group_rows(5, x_tile, kL2), 5);    // 12.5 MB: still the plain order
  EXPECT_EQ(choose_wgmma_group_rows(6, x_tile, kL2), 5);    // just over a quarter of L2
  EXPECT_EQ(choose_wgmma_group_rows(64, x_tile, kL2), 5);   // M = 16384 (batch 16 / 1k prefill)
  // Llama-70B gate/up (K = 8192): 4 MB per row tile, 3 of them.
  EXPECT_EQ(choose_wgmma_group_rows(32, 256 * 8192 * 2, kL2), 3);
  // The down projection (K = 17408): 8.5 MB per row tile, one at a time.
  EXPECT_EQ(choose_wgmma_group_rows(64, 256 * 17408 * 2, kL2), 1);
  // A row tile larger than a quarter of L2: one at a time too.
  EXPECT_EQ(choose_wgmma_group_rows(32, 30 * kMB, kL2), 1);
  // Forced: that many, at most the row tiles.
  EXPECT_EQ(choose_wgmma_group_rows(64, x_tile, kL2, 3), 3);
  EXPECT_EQ(choose_wgmma_group_rows(4, x_tile, kL2, 100), 4);
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_group_rows(0, 1, kL2); }, ErrorKind::invalid_argument,
                                 "row_tiles"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_group_rows(4, 0, kL2); }, ErrorKind::invalid_argument,
                                 "x_tile_bytes"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_group_rows(4, 1, 0); }, ErrorKind::invalid_argument, "l2_bytes"));
  EXPECT_TRUE(test::throws_error([] { choose_wgmma_group_rows(4, 1, kL2, -1); }, ErrorKind::invalid_argument,
                                 "forced"));
}

// The order the wgmma kernel hands its tiles out in (it calls this same
// function): every tile exactly once; in a group, the group's row tiles
// fastest, then the column tiles; the groups in turn; the last group may
// have fewer rows; groups of at least the row tile count are the plain
// order (row tiles fastest over the whole grid).
TEST(W4A16WaveRule, GroupedTileOrderVisitsEveryTileOnceGroupByGroup) {
  for (const auto& [rows, cols] : {std::pair{1, 1}, {3, 8}, {7, 5}, {64, 272}}) {
    for (int group : {0, 1, 2, 3, 5, 64, 100}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols << " tiles, groups of " << group);
      const int g = group > 0 && group < rows ? group : rows;
      std::vector<int> seen(static_cast<size_t>(rows * cols), 0);
      for (int t = 0; t < rows * cols; ++t) {
        const WgmmaTileCoord c = wgmma_grouped_tile(t, rows, cols, group);
        ASSERT_GE(c.row, 0);
        ASSERT_LT(c.row, rows);
        ASSERT_GE(c.col, 0);
        ASSERT_LT(c.col, cols);
        ++seen[static_cast<size_t>(c.col * rows + c.row)];
        // Which group the position is in, and where in it.
        const int first_row = t / (g * cols) * g, in_group = t - first_row * cols;
        const int group_rows = std::min(g, rows - first_row);
        EXPECT_EQ(c.row, first_row + in_group % group_rows);
        EXPECT_EQ(c.col, in_group / group_rows);
        if (g == rows) {
          EXPECT_EQ(c.row, t % rows);
          EXPECT_EQ(c.col, t / rows);
        }
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
  // Qwen3-14B gate/up at M = 16384 (64 x 272 tiles), groups of 5: the first
  // 132 positions (one wave of 256-row CTAs) cover row tiles 0-4 of column
  // tiles 0-26, and the 13th group is rows 60-63 only.
  EXPECT_EQ(wgmma_grouped_tile(131, 64, 272, 5).row, 1);
  EXPECT_EQ(wgmma_grouped_tile(131, 64, 272, 5).col, 26);
  EXPECT_EQ(wgmma_grouped_tile(12 * 5 * 272, 64, 272, 5).row, 60);
  EXPECT_EQ(wgmma_grouped_tile(12 * 5 * 272 + 5, 64, 272, 5).row, 61);
  EXPECT_EQ(wgmma_grouped_tile(12 * 5 * 272 + 5, 64, 272, 5).col, 1);
}

}  // namespace
}  // namespace lowbit
