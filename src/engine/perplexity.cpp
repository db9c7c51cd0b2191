#include "lowbit/engine/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit::engine {

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

PerplexityResult perplexity(Backend& backend, std::span<const int32_t> tokens, const PerplexityOptions& options) {
  LOWBIT_CHECK_ARG(tokens.size() >= 2, "tokens", tokens.size(), "at least 2 tokens (one prediction)");
  LOWBIT_CHECK_ARG(options.chunk >= 1, "chunk", options.chunk, "at least 1 token per forward call");
  const int64_t vocab = backend.model().config.vocab;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i)
    LOWBIT_CHECK_ARG(tokens[static_cast<size_t>(i)] >= 0 && tokens[static_cast<size_t>(i)] < vocab,
                     "tokens[" + std::to_string(i) + "]", tokens[static_cast<size_t>(i)],
                     "a token id in [0, " + std::to_string(vocab) + ")");
  PerplexityResult r;
  const int seq = backend.add_sequence();
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    // Position i's logits predict token i + 1; the last position predicts nothing.
    for (int64_t begin = 0; begin < n - 1; begin += options.chunk) {
      const int64_t end = std::min(n - 1, begin + options.chunk);
      const StepInput in{seq, tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin))};
      backend.forward(std::span<const StepInput>(&in, 1), LogitsWanted::all, logits);
      for (int64_t i = begin; i < end; ++i) {
        const float* row = logits.data() + (i - begin) * vocab;
        double max = row[0];
        for (int64_t v = 1; v < vocab; ++v) max = std::max<double>(max, row[v]);
        double sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
        const double nll = max + std::log(sum) - static_cast<double>(row[tokens[static_cast<size_t>(i + 1)]]);
        LOWBIT_REQUIRE(std::isfinite(nll), "perplexity: the logits of position ", i, " are not finite");
        r.nll_sum += nll;
        ++r.scored;
      }
      if (options.progress) options.progress(end, n - 1);
    }
  } catch (...) {
    backend.release_sequence(seq);
    throw;
  }
  backend.release_sequence(seq);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace lowbit::engine
