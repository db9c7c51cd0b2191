#include "lowbit/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit::engine {

void SamplingOptions::validate() const {
  LOWBIT_CHECK_ARG(temperature >= 0.0f && std::isfinite(temperature), "temperature", temperature,
                   "a finite value >= 0 (0 = greedy)");
  LOWBIT_CHECK_ARG(top_k >= 0, "top_k", top_k, "a count >= 0 (0 = no limit)");
  LOWBIT_CHECK_ARG(top_p > 0.0f && top_p <= 1.0f, "top_p", top_p, "a probability in (0, 1]");
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), state_(options.seed) { options.validate(); }

double Sampler::uniform() {
  // SplitMix64, then the top 53 bits as a double in [0, 1).
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) return -1;
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

int32_t Sampler::sample(std::span<const float> logits) {
  LOWBIT_CHECK_ARG(!logits.empty(), "logits", 0, "at least one value");
  for (const float v : logits)
    if (std::isnan(v)) fail(ErrorKind::invalid_argument, "sampling: the logits contain NaN");
  if (options_.temperature == 0.0f) return argmax(logits);
  // Candidates sorted by logit, descending (ties: lower id first), cut to top_k.
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto better = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  size_t keep = ids.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) {
    keep = static_cast<size_t>(options_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(), better);
  } else {
    std::sort(ids.begin(), ids.end(), better);
  }
  ids.resize(keep);
  std::vector<double> p(keep);
  const double mx = logits[static_cast<size_t>(ids[0])];
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((logits[static_cast<size_t>(ids[i])] - mx) / options_.temperature);
    sum += p[i];
  }
  // top_p: the smallest prefix whose probability reaches top_p.
  size_t n = keep;
  if (options_.top_p < 1.0f) {
    double acc = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i] / sum;
      if (acc >= options_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += p[i];
  const double u = uniform() * total;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[n - 1];
}

}  // namespace lowbit::engine
