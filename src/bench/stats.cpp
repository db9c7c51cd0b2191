#include "lowbit/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lowbit/core/error.h"

namespace lowbit::bench {
namespace {

// Value at fractional rank q*(n-1) of sorted data, interpolated linearly.
double quantile_sorted(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

}  // namespace

TimingStats summarize_us(std::vector<double> samples_us) {
  LOWBIT_CHECK_ARG(!samples_us.empty(), "samples_us.size()", 0, "at least one timing sample");
  for (size_t i = 0; i < samples_us.size(); ++i) {
    if (!std::isfinite(samples_us[i]))
      fail_argument("samples_us[" + std::to_string(i) + "]", samples_us[i], "a finite time");
  }
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  TimingStats s;
  s.reps = static_cast<int>(n);
  s.min_us = samples_us.front();
  s.max_us = samples_us.back();
  s.median_us = n % 2 == 1 ? samples_us[n / 2] : 0.5 * (samples_us[n / 2 - 1] + samples_us[n / 2]);
  s.p10_us = quantile_sorted(samples_us, 0.10);
  s.p90_us = quantile_sorted(samples_us, 0.90);
  s.mean_us = std::accumulate(samples_us.begin(), samples_us.end(), 0.0) / static_cast<double>(n);
  return s;
}

}  // namespace lowbit::bench
