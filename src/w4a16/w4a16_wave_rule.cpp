#include "lowbit/w4a16/w4a16_wave_rule.h"

#include <algorithm>
#include <string>

#include "lowbit/core/error.h"

namespace lowbit {

WgmmaTailSplit choose_wgmma_tail(int64_t tiles, int64_t wave, int iters, int forced) {
  LOWBIT_CHECK_ARG(tiles >= 1, "tiles", tiles, "at least 1");
  LOWBIT_CHECK_ARG(wave >= 1, "wave", wave, "at least 1");
  LOWBIT_CHECK_ARG(iters >= 1, "iters", iters, "at least 1");
  LOWBIT_CHECK_ARG(forced >= 0, "forced", forced, "0 (the rule), 1 (no split) or a split >= 2");
  const int64_t leftover = tiles % wave;
  if (forced == 1 || tiles <= wave || leftover == 0) return {};
  if (forced >= 2) return {leftover, std::min(forced, iters)};
  double best_cost = static_cast<double>(iters);  // the round that a tail removes
  WgmmaTailSplit best;
  const int most = static_cast<int>(std::min<int64_t>({iters / 4, kMaxTailSplit, wave / leftover}));
  for (int s = 2; s <= most; ++s) {
    const double cost = static_cast<double>((iters + s - 1) / s) + kTailFixupIters * s;
    if (cost < best_cost) best_cost = cost, best = {leftover, s};
  }
  return best;
}

int64_t choose_wgmma_stream_k(int64_t tiles, int64_t wave, int iters, int64_t uniform_split, int64_t rows,
                              int tile_rows, int64_t forced, int64_t x_bytes, int64_t l2_bytes,
                              bool split_shares_fixup) {
  LOWBIT_CHECK_ARG(tiles >= 1, "tiles", tiles, "at least 1");
  LOWBIT_CHECK_ARG(wave >= 1, "wave", wave, "at least 1");
  LOWBIT_CHECK_ARG(iters >= 1, "iters", iters, "at least 1");
  LOWBIT_CHECK_ARG(uniform_split >= 1, "uniform_split", uniform_split, "at least 1");
  LOWBIT_CHECK_ARG(rows >= 1, "rows", rows, "at least 1");
  LOWBIT_CHECK_ARG(tile_rows >= 1, "tile_rows", tile_rows, "at least 1");
  const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows;
  LOWBIT_CHECK_ARG(row_tiles <= tiles, "rows", rows,
                   "at most tiles x tile_rows = " + std::to_string(tiles * tile_rows) + " (a row tile has column tiles)");
  LOWBIT_CHECK_ARG(forced >= 0, "forced", forced, "0 (the rule), 1 (none) or a CTA count >= 2");
  LOWBIT_CHECK_ARG(x_bytes >= 0, "x_bytes", x_bytes, ">= 0");
  LOWBIT_CHECK_ARG(l2_bytes >= 1, "l2_bytes", l2_bytes, "at least 1");
  const int64_t total = tiles * iters;
  if (forced >= 2) return std::min(forced, total);
  if (forced == 1 || tiles >= wave) return 0;
  const int64_t last_rows = rows - (row_tiles - 1) * tile_rows;
  if (iters <= kStreamKShortIters && tile_rows < 256 && row_tiles > 1 && 4 * last_rows < 3 * int64_t{tile_rows})
    return 0;
  if (x_bytes > l2_bytes / 2) return 0;
  const double stream_k = static_cast<double>((total + wave - 1) / wave) + 2.0 * kTailFixupIters;
  const double uniform = static_cast<double>((iters + uniform_split - 1) / uniform_split);
  if (stream_k <= kStreamKGain * uniform) return std::min(wave, total);
  if (iters <= kStreamKShortIters && uniform_split >= 2 && !split_shares_fixup)
    return tiles * (uniform_split >= 6 ? (uniform_split + 1) / 2 : uniform_split);
  return 0;
}

int64_t wgmma_uniform_split(int64_t tiles, int64_t wave, int iters) {
  LOWBIT_CHECK_ARG(tiles >= 1, "tiles", tiles, "at least 1");
  LOWBIT_CHECK_ARG(wave >= 1, "wave", wave, "at least 1");
  LOWBIT_CHECK_ARG(iters >= 1, "iters", iters, "at least 1");
  return std::min<int64_t>(std::max<int64_t>(1, wave / tiles), std::max(1, iters / 4));
}

int choose_wgmma_tile_rows(int64_t M, int64_t col_tiles, int64_t wave_of_256) {
  LOWBIT_CHECK_ARG(M >= 1, "M", M, "at least 1");
  LOWBIT_CHECK_ARG(col_tiles >= 1, "col_tiles", col_tiles, "at least 1");
  LOWBIT_CHECK_ARG(wave_of_256 >= 1, "wave_of_256", wave_of_256, "at least 1");
  if (M <= 128) return M <= 16 ? 16 : (M <= 32 ? 32 : (M <= 64 ? 64 : 128));
  if (M <= 256 || M > 384) return 256;
  const bool wave_thin = 4 * (2 * col_tiles) < 3 * wave_of_256;
  return wave_thin ? 128 : 256;
}

bool choose_wgmma_dense(int64_t tiles, int64_t wave_of_two, int iters) {
  LOWBIT_CHECK_ARG(tiles >= 1, "tiles", tiles, "at least 1");
  LOWBIT_CHECK_ARG(wave_of_two >= 1, "wave_of_two", wave_of_two, "at least 1");
  LOWBIT_CHECK_ARG(iters >= 1, "iters", iters, "at least 1");
  return iters > kStreamKShortIters || 2 * tiles >= 3 * wave_of_two;
}

int64_t choose_wgmma_group_rows(int64_t row_tiles, int64_t x_tile_bytes, int64_t l2_bytes, int64_t forced) {
  LOWBIT_CHECK_ARG(row_tiles >= 1, "row_tiles", row_tiles, "at least 1");
  LOWBIT_CHECK_ARG(x_tile_bytes >= 1, "x_tile_bytes", x_tile_bytes, "at least 1");
  LOWBIT_CHECK_ARG(l2_bytes >= 1, "l2_bytes", l2_bytes, "at least 1");
  LOWBIT_CHECK_ARG(forced >= 0, "forced", forced, "0 (the rule) or a count of row tiles >= 1");
  if (forced >= 1) return std::min(forced, row_tiles);
  const int64_t budget = l2_bytes / 4;
  if (row_tiles * x_tile_bytes <= budget) return row_tiles;
  return std::clamp<int64_t>(budget / x_tile_bytes, 1, row_tiles);
}

double wgmma_grid_iters(int64_t tiles, int64_t wave, int iters) {
  LOWBIT_CHECK_ARG(tiles >= 1, "tiles", tiles, "at least 1");
  LOWBIT_CHECK_ARG(wave >= 1, "wave", wave, "at least 1");
  LOWBIT_CHECK_ARG(iters >= 1, "iters", iters, "at least 1");
  if (tiles >= wave) {
    const WgmmaTailSplit tail = choose_wgmma_tail(tiles, wave, iters);
    const double last = tiles % wave == 0 ? 0.0
                        : tail.tail_tiles == 0
                            ? static_cast<double>(iters)
                            : static_cast<double>((iters + tail.tail_split - 1) / tail.tail_split) +
                                  kTailFixupIters * tail.tail_split;
    return static_cast<double>(tiles / wave * iters) + last;
  }
  const int64_t split = wgmma_uniform_split(tiles, wave, iters);
  const double uniform = static_cast<double>((iters + split - 1) / split);
  const double stream_k = static_cast<double>((tiles * iters + wave - 1) / wave) + 2.0 * kTailFixupIters;
  return std::min(uniform, stream_k);
}

int64_t choose_row_remainder(int64_t M, int tile_rows, int64_t col_tiles, int iters, int64_t wave_of_256,
                             int64_t weight_bytes, int forced) {
  LOWBIT_CHECK_ARG(M >= 1, "M", M, "at least 1");
  LOWBIT_CHECK_ARG(tile_rows >= 1, "tile_rows", tile_rows, "at least 1");
  LOWBIT_CHECK_ARG(col_tiles >= 1, "col_tiles", col_tiles, "at least 1");
  LOWBIT_CHECK_ARG(iters >= 1, "iters", iters, "at least 1");
  LOWBIT_CHECK_ARG(wave_of_256 >= 1, "wave_of_256", wave_of_256, "at least 1");
  LOWBIT_CHECK_ARG(weight_bytes >= 0, "weight_bytes", weight_bytes, ">= 0");
  LOWBIT_CHECK_ARG(forced >= 0 && forced <= 2, "forced", forced, "0 (the rule), 1 (never) or 2 (always)");
  const int64_t r = M % 256;
  if (M <= 256 || r == 0 || forced == 1) return 0;
  if (forced == 2) return r;
  if (r > kMaxRemainderRows) return 0;
  const double remainder_us = (kRemainderFixedUs + static_cast<double>(weight_bytes) / kRemainderBytesPerUs) *
                              (1.0 + static_cast<double>(r) / 96.0);
  const int64_t q = M / 256;
  if (q >= 2) {
    const double saved_us = (wgmma_grid_iters((q + 1) * col_tiles, wave_of_256, iters) -
                             wgmma_grid_iters(q * col_tiles, wave_of_256, iters)) *
                            kTileIterUs;
    return saved_us >= kRemainderGainOverTwoRows * remainder_us ? r : 0;
  }
  const double row_of_tiles_us = static_cast<double>(col_tiles) * static_cast<double>(iters) * kTileIterUs /
                                 static_cast<double>(wave_of_256) * (tile_rows < 256 ? 0.5 : 1.0);
  return row_of_tiles_us >= kRemainderGain * remainder_us ? r : 0;
}

}  // namespace lowbit
