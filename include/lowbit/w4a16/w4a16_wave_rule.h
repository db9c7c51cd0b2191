// How the wgmma strategy of w4a16_gemm.h spreads the last, partly filled
// wave of a grid of output tiles over the SMs by splitting its tiles along
// K. Plain C++ header, so that the rule is tested on the CPU.
#pragma once

#include <cstdint>

namespace lowbit {

// The last tail_tiles output tiles are split along K tail_split ways; every
// other tile is computed whole by one CTA. tail_tiles == 0: no tail split.
struct WgmmaTailSplit {
  int64_t tail_tiles = 0;
  int tail_split = 1;
};

// Why: with T tiles and W CTAs resident at once (CTAs per SM x SMs), a grid
// of whole tiles takes ceil(T / W) rounds of iters k-iterations each, and
// when T % W is small the last round runs a few tiles on a few SMs while the
// rest idle (Qwen3-14B's gate/up layer at 256 rows: 272 tiles of 256 x 128 on
// 132 SMs, 3 rounds for 2.06 rounds of work). Splitting the T % W leftover
// tiles S ways lets their CTAs run beside the whole tiles of the first
// round, and the grid ends after floor(T / W) rounds plus the tail.
//
// The tail's cost, in k-iterations of a whole tile: ceil(iters / S) for its
// K range plus kTailFixupIters * S for the partials that each split writes
// and that the tile's last CTA reads back and sums. S is the cheapest among
// 2 .. min(iters / 4, kMaxTailSplit, W / (T % W)) (one round of tail CTAs;
// fewer splits on a tie), and the tail is taken only when it costs less than
// the round it removes (iters). No tail when T is a multiple of W, or when
// T <= W: the caller then splits every tile by its own rule. (Splitting
// every tile of such grids with the tail's fix-up, in one or two rounds of
// split CTAs, measured mixed on the H100: docs/w4a16-gemm.md, v14.)
//
// forced >= 2: that split (at most iters), whatever it costs, wherever there
// is a leftover; forced == 1: never a tail; forced == 0: the rule.
// Error(invalid_argument) for tiles, wave or iters < 1 or forced < 0.
WgmmaTailSplit choose_wgmma_tail(int64_t tiles, int64_t wave, int iters, int forced = 0);

// Stream-K for grids of less than one wave (T < W tiles): the T x iters
// k-iterations, tile after tile, are cut into G contiguous ranges of equal
// length (to one iteration), one per CTA, so every SM does the same work
// whatever T / W is. A CTA's range then covers the end of one tile and the
// start of the next (G >= T: at most two pieces); the CTA holding a tile's
// first piece finishes it last and sums the others' partials.
//
// Why: the uniform split gives every tile S = floor(W / T) CTAs, so a grid
// of 80 tiles on 132 SMs (the 5120-column layers at 512 rows) runs 80 CTAs
// of a whole tile each and leaves 52 SMs idle: 272 k-iterations per CTA for
// Qwen3-14B's down projection where stream-K needs ceil(80 x 272 / 132) =
// 165. Where the uniform split already divides the work evenly (T x S close
// to W) stream-K only adds fix-up, so it is taken only when its cost,
// ceil(T x iters / W) + 2 kTailFixupIters (a partial written, partials read),
// is at most kStreamKGain of the uniform split's ceil(iters / uniform_split).
//
// And only while x (x_bytes, M x K in 16 bits) takes at most half of L2
// (l2_bytes): the uniform split's CTAs run in split-major order, all at the
// same k at once, so each x tile is fetched once and read by every column
// tile from L2; stream-K spreads the CTAs over all of K, and a larger x is
// then re-read from HBM. (Forced stream-K on Llama-70B's down projection at
// 512 rows, 29 MB of x, took 485 us against the uniform split's 320 on the
// H100; the 5120-column layers of Qwen3-14B at 512 rows, 5 and 18 MB of x,
// gained 0-8% (o) and 3-15% (down) over three machines: docs/w4a16-gemm.md,
// v15.)
//
// Short K (iters <= kStreamKShortIters) with a uniform split S >= 2: the
// same split run as stream-K, G = T x S' CTAs with S' = S, or ceil(S / 2)
// from S = 6 on, so that every CTA holds exactly one piece (the pieces are
// the uniform split's, or pairs of them). What changes is the fix-up: the
// uniform split's last CTA stores its own partial too and reads all S back
// (a fixed order whichever CTA comes last), stream-K's CTA of a tile's first
// piece keeps its accumulators and reads the S - 1 others; on short K that
// fix-up is a large part of the call. Measured on the H100 (docs/w4a16-gemm.md,
// v15): sq4096 at 128 rows 31.2 -> 22.4 us, qwen3-o at 128 rows 33.5 -> 29.4,
// qwen3-qkv 37.9 -> 34.5; K of 256+ k-iterations lost 1-6% the same way. S =
// 2 on an H200 (v45, one lease): sq8192 at 256 rows 60.7 -> 56.6 us,
// qwen3-qkv 43.2 -> 40.5, 5-9% at 160-256 rows on both.
//
// On short K both kinds of stream-K need the grid's last row tile (rows,
// M, in tiles of tile_rows) at least three quarters full when there are
// two or more, for tiles of fewer than 256 rows (since v46): on an H200 (v45) qwen3-o's 80 tiles of 80 k-iterations ran
// stream-K over the wave in 74.7 / 72.0 / 62-70 / 62.4 us at 257 / 288 /
// 320 / 384 rows against 57.5-58.0 for the uniform split, and in 52.3 /
// 49.2 / 49.7 us at 448 / 480 / 512 rows; sq4096's S = 2 lost at 257 / 288
// rows (49.1, 47.3 against 39.6, 39.0) and gained from 448 (35.4 against
// 37.9). The emptier the last row tile, the slower stream-K, although its
// CTAs do the same work. v46 found the same slowdown in the uniform split,
// from the copy engine's box of x mostly past M, and gave the last row tile
// a box of its real rows. With it, 256-row tiles at 400 / 447 rows gained
// from stream-K (qwen3-o over the wave 49.8 / 50.8 against 57.7 / 58.0 us;
// sq4096's S = 2 35.1 / 35.1 against 38.2 / 38.9), so the fill no longer
// applies to them; the cost test still keeps qwen3-qkv's 112 tiles off it
// (it lost there: 63.9 / 64.4 against 58.4 / 58.8). 128-row tiles at 288 /
// 320 rows still lost it (qwen3-o 69.8 / 70.0 against 42.6 / 43.8 us) and
// keep the condition; at 257-384 rows the thin grids run on those
// (choose_wgmma_tile_rows). One row tile (M up to tile_rows) was not affected. Long K (Qwen3-14B's down projection, 272
// k-iterations, where stream-K cuts each CTA's range from 272 to 165) was
// not measured so and keeps stream-K.
//
// Where the uniform split's K splits share their fix-up (split_shares_fixup:
// W4A16Plan::shared_fixup on 64- and 128-row tiles, since v48), the short-K
// clause keeps the uniform split: its CTAs then sum the tile's partials a
// part each, and on an H200 (v48, one lease, three rounds, medians) that beat
// this clause's stream-K on 128-row tiles by 0.5-10% (sq4096 21.0 -> 20.9 us,
// sq8192 40.8 -> 38.1, qwen3-qkv 32.0 -> 28.8, qwen3-o 27.5 -> 24.9) and on
// 64-row tiles by -2..+5% (sq4096 16.7 -> 17.0, sq8192 31.3 -> 30.0,
// qwen3-qkv 23.9 -> 22.8, qwen3-o 20.1 -> 20.2). On 256-row tiles, which
// hold the shared fix-up too, stream-K stayed ahead at S = 2-3 (sq8192 56.0
// against 58.7 us, qwen3-qkv 40.5 against 42.5, qwen3-o 34.3 against 34.9;
// sq4096's S = 4 27.4 against 28.1), so their callers pass false.
//
// uniform_split: wgmma_uniform_split below. Returns G (the CTAs), or 0 for none. forced >= 2: that many CTAs, at
// most T x iters (at least one k-iteration per CTA), whatever T against W, the
// size of x or the last row tile's fill (fewer CTAs than tiles: ranges longer
// than a tile, whole tiles between their first and last pieces); forced ==
// 1: never; forced == 0: the rule, which takes stream-K only for T < W. Error(invalid_argument)
// for tiles, wave, iters, uniform_split, rows or tile_rows < 1, more row
// tiles than tiles, forced < 0, x_bytes < 0 or l2_bytes < 1.
int64_t choose_wgmma_stream_k(int64_t tiles, int64_t wave, int iters, int64_t uniform_split, int64_t rows,
                              int tile_rows, int64_t forced, int64_t x_bytes, int64_t l2_bytes,
                              bool split_shares_fixup);
inline constexpr double kStreamKGain = 0.85;
inline constexpr int kStreamKShortIters = 128;

// The uniform K split of a grid of fewer tiles than a wave: the largest S
// with tiles x S <= wave (at least 1), but at least 4 k-iterations per CTA
// (S <= max(1, iters / 4)), so that a split's pipeline fill and partials do
// not outweigh its K range. The first split the wgmma plan tries for 64+-row
// tiles, and the baseline choose_wgmma_stream_k weighs stream-K against.
// Error(invalid_argument) for tiles, wave or iters < 1.
int64_t wgmma_uniform_split(int64_t tiles, int64_t wave, int iters);

// The wgmma plan's rows per tile for M rows: the smallest of 16 / 32 / 64 /
// 128 / 256 that holds M, and 256 above, except at 257-384 rows where
// 256-row tiles would leave the wave poorly filled: there the 128-row tile.
// col_tiles: column tiles of 128 outputs; wave_of_256: resident CTAs of the
// 256-row tile (one per SM).
//
// Why: 257-511 rows on 256-row tiles run two row tiles, the second with
// M - 256 real rows, at the cost of two full ones. Where that grid
// (2 x col_tiles tiles) also fills less than three quarters of the wave, no
// split of it helps much: short K keeps off stream-K there (a last row tile
// under three quarters full, choose_wgmma_stream_k), and a uniform split of
// 2 would take a second round. Up to 384 rows three 128-row tiles hold M, at
// 3/4 of the rows computed and two CTAs per SM. Measured on an H200
// (docs/w4a16-gemm.md, v46), us, 256-row / 128-row tiles at 257 / 320 / 384
// rows: Qwen3-14B's o projection (40 column tiles) 58.0 / 57.8 / 58.0
// against 48.6 / 43.1 / 46.3, its down projection 153.6 / 154.0 / 134.9
// against 111.2 / 112.4 / 114.8, sq4096 (32) 40.0 / 37.6 / 37.7 against
// 37.2 / 35.9 / 38.1. At 447 rows four 128-row tiles lost (o 57.8 against
// 63.2, down 137.1 against 197.2). Where the 256-row grid fills the wave,
// 128-row tiles lost at 320-384 rows: qwen3-qkv (56 column tiles, 112 of
// 132) 57.8 / 58.2 against 63.4 / 68.0, sq8192 (64) 86.2 / 87.3 against
// 97.9 / 115.8, Llama-70B's down projection (64) 346.6 / 282.1 against
// 371.1 / 379.0. Error(invalid_argument) for M, col_tiles or wave_of_256 < 1.
int choose_wgmma_tile_rows(int64_t M, int64_t col_tiles, int64_t wave_of_256);

// Whether the 64-row wgmma tile runs its three-CTA build (80 registers, 6
// warpgroups per SM) rather than its two-CTA one: when K is longer than
// kStreamKShortIters k-iterations or the grid fills a three-CTA wave
// (tiles >= 1.5 x wave_of_two, the two-CTA build's CTAs per SM times the
// SMs). Measured on the H100 at 48 and 64 rows, both builds in one run
// (docs/w4a16-gemm.md, v16): Llama-70B gate/up +18-21% (448 tiles), down
// +7%, sq16384 +7%, Qwen3-14B down +4-5%; the short-K grids of fewer tiles
// than a wave, which run the short-K stream-K split sized for two CTAs per
// SM, lost: sq8192 -16%, sq4096 -10%. Since the two-CTA build has a
// producer warp (v17), it also wins on Qwen3-14B gate/up (272 tiles, 80
// k-iterations: 68.0 against 73.9 us in one run, 67.0 against 72.8 in
// another), a grid of just over a two-CTA wave that the three-CTA build
// fills to two thirds; v16's rule (a two-CTA wave of tiles) took the
// three-CTA build there. Error(invalid_argument) for tiles, wave_of_two or
// iters < 1.
bool choose_wgmma_dense(int64_t tiles, int64_t wave_of_two, int iters);

// The order in which a wgmma grid's whole tiles are handed out: groups of G
// row tiles, and in a group each column tile with its G row tiles in turn
// (row tiles fastest; the group's last may have fewer). G = row_tiles is the
// plain row-major order (row tiles fastest over the whole grid).
//
// Why: the resident CTAs (one per SM at 256 rows) work on neighbouring tiles
// of this order at once. In the plain order they cover every row tile of a
// few column tiles, so all of x (M x K, 16-bit) streams through L2 again for
// every few column tiles: at M = 16384, Qwen3-14B's gate/up (168 MB of x, 272
// column tiles) re-read ~23 GB of x from HBM and took 15.7 ms, 372 TFLOP/s
// against 685 at M = 1024 (`lowbit bench model --breakdown`, batch 16 / 1k
// prefill, H100). With groups, a group's x (G x x_tile_bytes, x_tile_bytes
// = rows per tile x K x 2) is fetched once and read from L2 by every column
// tile, and the weights are read once per group (row_tiles / G times). The
// plain order at M = 16384 ran at 0.54-0.64x cuBLAS FP16 on five large
// layers, groups at 0.91-1.13x (`lowbit bench gemm --wgmma-group-rows`,
// docs/w4a16-gemm.md, v19).
//
// The rule: the plain order while the whole of x fits in a quarter of L2 (no
// re-reads to save); else the most row tiles whose x fits in a quarter of L2
// (at least 1). A quarter, not a half: at M = 4096 Qwen3-14B's gate/up ran
// groups of 10 row tiles (26 MB of x) at 0.90x cuBLAS and groups of 4 or 8
// at 1.08x in the same run; the weights and the outputs stream through the
// same L2. forced >= 1: that many (at most row_tiles); forced == 0: the
// rule. Error(invalid_argument) for row_tiles, x_tile_bytes or l2_bytes < 1,
// or forced < 0.
int64_t choose_wgmma_group_rows(int64_t row_tiles, int64_t x_tile_bytes, int64_t l2_bytes, int64_t forced = 0);

// The tile at position t (0 .. row_tiles x col_tiles - 1) of that order: t
// runs through groups of group_rows row tiles, in a group through the column
// tiles, and for each column tile through the group's row tiles. group_rows
// <= 0 or >= row_tiles: the plain order (row = t % row_tiles). constexpr, so
// that the wgmma kernel calls this same function (nvcc's relaxed constexpr)
// and the CPU tests check the order it uses.
struct WgmmaTileCoord {
  int row, col;
};
constexpr WgmmaTileCoord wgmma_grouped_tile(int t, int row_tiles, int col_tiles, int group_rows) {
  const int g = group_rows > 0 && group_rows < row_tiles ? group_rows : row_tiles;
  const int first_row = t / (g * col_tiles) * g;
  const int in_group = t - first_row * col_tiles;
  const int rows = g < row_tiles - first_row ? g : row_tiles - first_row;
  return {first_row + in_group % rows, in_group / rows};
}

// Rows past the last whole 256-row tile as a GEMM of their own: for M > 256
// rows, the remainder r = M % 256 (0 < r <= kMaxRemainderRows) runs as a
// second call after the first M - r rows, each with its own plan (gemv up to
// 4 rows, smaller wgmma tiles above). Returns r, or 0 for one call.
//
// Why: a grid of row tiles computes its last, thin row tile at the cost of a
// whole one, so M = 256 q + r costs about q + 1 rows of tiles. The second
// call reads every weight again, at about a GEMM of r rows' time. Measured on
// an H200 (docs/w4a16-gemm.md, v47), one call against two, us: Llama-70B's
// gate/up at 257 rows 596.9 against 398.1, at 769 rows 1251.2 against
// 1026.4; sq16384 at 257 rows 343.5 against 223.3; Qwen3-14B's down
// projection at 1025 rows 354.2 against 269.3. Small layers can lose: sq4096
// at 769 rows 47.8 against 62.7 (768 and 769 rows both run one round of
// tiles), Qwen3-14B's o projection at 600 rows 58.4 against 83.3.
//
// The estimate, in microseconds. The remainder's: kRemainderFixedUs +
// weight_bytes / kRemainderBytesPerUs (the one-row GEMM over the nine
// benchmark layers, within -10..+25%), times 1 + r / 96 for its rows. What
// the split saves, in k-iterations of a 256 x 128 tile at kTileIterUs each
// (~0.69 us on one H200 SM: 55 us for K = 5120):
// - q = 1 (257-384 rows): one row of tiles spread over the SMs, col_tiles x
//   iters / wave_of_256, halved where M's own plan runs 128-row tiles
//   (tile_rows < 256, choose_wgmma_tile_rows: its padded row tile is a
//   128-row one); split at kRemainderGain times the remainder.
// - q >= 2: the critical paths of the grids of q + 1 and of q rows of tiles
//   (wgmma_grid_iters: their rounds, tail splits and stream-K), which is
//   where 768 / 769 rows cost the same; split at kRemainderGainOverTwoRows.
// The constants were fitted to the 117 points of v47's two sweeps (257-2049
// rows, nine layers; not checked on others): where the rule splits it gained
// 6.0 ms in all and lost 32 us (the worst: Qwen3-14B's down projection at 600
// rows, 15 us; o at 1152, 9 us); where it does not it forwent 53 us (qkv at
// 1040 rows, 19 us).
//
// Only for `auto`'s wgmma plans: the decoupled GEMM (cuBLAS after a
// dequantization) takes any M without padding. forced == 2: split off
// M % 256 whenever it is not 0 (any size); forced == 1: never; forced == 0:
// the rule. wave_of_256: resident CTAs of the 256-row tile (one per SM).
// Error(invalid_argument) for M, tile_rows, col_tiles, iters or wave_of_256
// < 1, weight_bytes < 0, or forced outside 0..2.
int64_t choose_row_remainder(int64_t M, int tile_rows, int64_t col_tiles, int iters, int64_t wave_of_256,
                             int64_t weight_bytes, int forced = 0);
inline constexpr int kMaxRemainderRows = 128;
inline constexpr double kTileIterUs = 0.69;
inline constexpr double kRemainderFixedUs = 8.0;
inline constexpr double kRemainderBytesPerUs = 3.3e6;
inline constexpr double kRemainderGain = 1.25;
inline constexpr double kRemainderGainOverTwoRows = 1.0;

// The critical path of a wgmma grid of `tiles` 256-row tiles on `wave`
// resident CTAs, in k-iterations of a whole tile, as the plan runs it: whole
// rounds of iters plus the last round's tail split (choose_wgmma_tail; iters
// without one); under a wave, the cheaper of the uniform split
// (wgmma_uniform_split) and stream-K (ceil(tiles x iters / wave) + 2
// kTailFixupIters). An estimate (fixed costs left out), for
// choose_row_remainder. Error(invalid_argument) for tiles, wave or iters < 1.
double wgmma_grid_iters(int64_t tiles, int64_t wave, int iters);

// Per split, what its partials cost in k-iterations of a whole tile (an
// estimate: ~1.2 us to move one 256 x 128 fp32 partial through L2, ~0.8-0.9
// us per k-iteration of the 256-row tile on the H100).
inline constexpr double kTailFixupIters = 1.5;
inline constexpr int kMaxTailSplit = 16;

}  // namespace lowbit
