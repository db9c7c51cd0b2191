// Summary statistics of repeated timings. Every benchmark in lowbit reports
// the median (robust to the occasional slow rep: a clock change, another
// process, a page fault) and the 10th/90th percentiles as its spread.
#pragma once

#include <vector>

namespace lowbit::bench {

struct TimingStats {
  int reps = 0;
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
  double p10_us = 0;  // percentiles with linear interpolation between order statistics
  double p90_us = 0;
  double mean_us = 0;
};

// Summarises samples in microseconds. The median of an even count is the mean
// of the two middle samples; percentile p lies at rank p*(n-1) of the sorted
// samples, interpolated linearly (numpy's default). Throws
// Error(invalid_argument) when `samples_us` is empty or holds a value that is
// not finite.
TimingStats summarize_us(std::vector<double> samples_us);

}  // namespace lowbit::bench
