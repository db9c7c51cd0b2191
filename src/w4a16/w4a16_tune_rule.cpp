#include "lowbit/w4a16/w4a16_tune_rule.h"

#include <algorithm>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit {

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
