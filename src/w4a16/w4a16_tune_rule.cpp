#include "lowbit/w4a16/w4a16_tune_rule.h"

#include <algorithm>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit {

int gemv_split_rule(int iters, int64_t col_blocks, int sms, int ctas_per_sm, int64_t rows) {
  LOWBIT_CHECK_ARG(iters >= 1, "iters", iters, "at least 1");
  LOWBIT_CHECK_ARG(col_blocks >= 1, "col_blocks", col_blocks, "at least 1");
  LOWBIT_CHECK_ARG(sms >= 1, "sms", sms, "at least 1");
  LOWBIT_CHECK_ARG(ctas_per_sm >= 1, "ctas_per_sm", ctas_per_sm, "at least 1");
  LOWBIT_CHECK_ARG(rows >= 1, "rows", rows, "at least 1");
  int split = std::clamp((iters + 8) / 16, 1, 16);
  if (2 * col_blocks * split < sms) {
    const int64_t fill = (sms + col_blocks - 1) / col_blocks;
    split = static_cast<int>(std::max<int64_t>(split, std::min<int64_t>(fill, std::max(1, iters / 4))));
  }
  split = std::min(split, iters);
  // At one row, a grid of more CTAs than fit at once whose last round would
  // hold less than a quarter of them: one split fewer, when that fills the
  // last round better (Qwen3-14B's gate/up, 272 blocks: 1360 CTAs at split 5
  // on 660 resident are 2 rounds and 40 CTAs; at 4, 1.65 rounds). Measured
  // in whole decode steps only: at 2-3 rows it lost (the header).
  const int64_t resident = int64_t{sms} * ctas_per_sm;
  auto last_round = [&](int s) {
    const int64_t left = col_blocks * s % resident;
    return left == 0 ? resident : left;
  };
  if (rows == 1 && split > 1 && col_blocks * split > resident && 4 * last_round(split) < resident &&
      last_round(split - 1) > last_round(split))
    --split;
  return split;
}

int choose_gemv_split(std::span<const TimedGemvSplit> timed, double margin) {
  LOWBIT_CHECK_ARG(!timed.empty(), "timed", "empty", "at least one timed split");
  LOWBIT_CHECK_ARG(margin >= 0.0 && margin < 1.0, "margin", margin, "in [0, 1)");
  std::vector<TimedGemvSplit> by_split(timed.begin(), timed.end());
  for (const TimedGemvSplit& t : by_split) LOWBIT_CHECK_ARG(t.split >= 1, "split", t.split, "at least 1");
  std::stable_sort(by_split.begin(), by_split.end(),
                   [](const TimedGemvSplit& a, const TimedGemvSplit& b) { return a.split < b.split; });
  TimedGemvSplit taken = by_split.front();
  for (const TimedGemvSplit& t : by_split)
    if (t.us < taken.us * (1.0 - margin)) taken = t;
  return taken.split;
}

}  // namespace lowbit
