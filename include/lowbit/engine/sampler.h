// Choosing the next token from logits: greedy (temperature 0), or sampling
// from softmax(logits / temperature) restricted to the top_k most likely
// tokens and then to the smallest set whose probability reaches top_p.
// Deterministic for a seed: the random numbers come from a 64-bit
// SplitMix64 stream, not from <random>'s distributions, whose algorithms
// differ between standard libraries.
#pragma once

#include <cstdint>
#include <span>

namespace lowbit::engine {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // (0, 1]
  uint64_t seed = 0;

  // Throws Error(invalid_argument) naming the bad field.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  int32_t sample(std::span<const float> logits);
  const SamplingOptions& options() const { return options_; }

 private:
  double uniform();  // [0, 1)
  SamplingOptions options_;
  uint64_t state_;
};

// argmax, lowest index on ties; -1 for an empty span.
int32_t argmax(std::span<const float> logits);

}  // namespace lowbit::engine
