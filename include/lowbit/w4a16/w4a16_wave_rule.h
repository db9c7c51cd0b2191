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

// Per split, what its partials cost in k-iterations of a whole tile (an
// estimate: ~1.2 us to move one 256 x 128 fp32 partial through L2, ~0.8-0.9
// us per k-iteration of the 256-row tile on the H100).
inline constexpr double kTailFixupIters = 1.5;
inline constexpr int kMaxTailSplit = 16;

}  // namespace lowbit
