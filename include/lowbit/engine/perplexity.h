// Perplexity of a token sequence under a Backend: the quality check that says
// what a weight or KV-cache format costs (`lowbit perplexity`).
//
// The tokens run as one sequence, in forward calls of `chunk` tokens with the
// logits of every position; each position's logits score the next token
// (natural-log NLL, accumulated in double). Later chunks attend to earlier
// tokens through the backend's cache, so a quantized KV cache is measured the
// way generation uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "lowbit/engine/backend.h"

namespace lowbit::engine {

struct PerplexityOptions {
  int64_t chunk = 512;  // tokens per forward call (>= 1)
  // Called after each chunk with (tokens done, total); may be empty.
  std::function<void(int64_t, int64_t)> progress;
};

struct PerplexityResult {
  int64_t scored = 0;      // predictions scored: tokens - 1
  double nll_sum = 0;      // sum of -log p(token | previous), nats
  double seconds = 0;      // wall time of the forward calls
  double mean_nll() const { return scored > 0 ? nll_sum / static_cast<double>(scored) : 0.0; }
  double perplexity() const;  // exp(mean_nll)
};

// tokens: at least 2, each in [0, vocab). The backend needs room for one
// sequence of tokens.size() tokens; the sequence is released at the end.
// Throws Error(invalid_argument) otherwise.
PerplexityResult perplexity(Backend& backend, std::span<const int32_t> tokens, const PerplexityOptions& options = {});

}  // namespace lowbit::engine
