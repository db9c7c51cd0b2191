#include "lowbit/engine/generate.h"

#include <algorithm>
#include <chrono>

#include "lowbit/core/error.h"

namespace lowbit::engine {

void warm_up(Backend& backend, int32_t token) {
  const int seq = backend.add_sequence();
  struct Release {
    Backend& b;
    int s;
    ~Release() { b.release_sequence(s); }
  } release{backend, seq};
  const int32_t two[2] = {token, token};
  std::vector<float> logits;
  StepInput in{seq, std::span<const int32_t>(two, 2)};
  backend.forward(std::span<const StepInput>(&in, 1), LogitsWanted::last, logits);  // the prefill kernels
  in.tokens = std::span<const int32_t>(two, 1);
  backend.forward(std::span<const StepInput>(&in, 1), LogitsWanted::last, logits);  // the decode kernels
}

GenerateResult generate(Backend& backend, std::span<const std::vector<int32_t>> prompts, const GenerateOptions& options,
                        const TokenCallback& on_token) {
  LOWBIT_CHECK_ARG(!prompts.empty(), "prompts", 0, "at least one prompt");
  LOWBIT_CHECK_ARG(options.max_tokens >= 0, "max_tokens", options.max_tokens, "a count >= 0");
  options.sampling.validate();
  for (size_t i = 0; i < prompts.size(); ++i)
    LOWBIT_CHECK_ARG(!prompts[i].empty(), "prompts[i]", i, "a non-empty token list");
  const size_t B = prompts.size();
  const int64_t vocab = backend.model().config.vocab;
  GenerateResult result;
  result.tokens.resize(B);
  std::vector<int> seqs;
  struct Release {
    Backend& b;
    std::vector<int>& s;
    ~Release() {
      for (int id : s) b.release_sequence(id);
    }
  } release{backend, seqs};
  for (size_t i = 0; i < B; ++i) seqs.push_back(backend.add_sequence());
  std::vector<Sampler> samplers;
  for (size_t i = 0; i < B; ++i) {
    SamplingOptions s = options.sampling;
    s.seed += i;
    samplers.emplace_back(s);
  }
  if (options.max_tokens == 0) return result;

  using clock = std::chrono::steady_clock;
  std::vector<float> logits;
  std::vector<bool> live(B, true);
  std::vector<int32_t> last(B);
  const auto take = [&](size_t i, std::span<const float> row) {
    const int32_t t = samplers[i].sample(row);
    result.tokens[i].push_back(t);
    ++result.generated_tokens;
    last[i] = t;
    bool keep = !on_token || on_token(i, t);
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), t) != options.stop_tokens.end()) keep = false;
    if (static_cast<int64_t>(result.tokens[i].size()) >= options.max_tokens) keep = false;
    live[i] = keep;
  };

  std::vector<StepInput> inputs;
  for (size_t i = 0; i < B; ++i) {
    inputs.push_back({seqs[i], std::span<const int32_t>(prompts[i])});
    result.prompt_tokens += static_cast<int64_t>(prompts[i].size());
  }
  auto t0 = clock::now();
  backend.forward(inputs, LogitsWanted::last, logits);
  result.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  for (size_t i = 0; i < B; ++i)
    take(i, std::span<const float>(logits).subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab)));

  std::vector<size_t> order;
  for (;;) {
    inputs.clear();
    order.clear();
    for (size_t i = 0; i < B; ++i)
      if (live[i]) {
        inputs.push_back({seqs[i], std::span<const int32_t>(&last[i], 1)});
        order.push_back(i);
      }
    if (inputs.empty()) break;
    t0 = clock::now();
    backend.forward(inputs, LogitsWanted::last, logits);
    result.decode_seconds += std::chrono::duration<double>(clock::now() - t0).count();
    ++result.decode_steps;
    for (size_t r = 0; r < order.size(); ++r)
      take(order[r], std::span<const float>(logits).subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)));
  }
  result.kv_bytes = backend.kv().bytes_used();
  for (const int id : seqs) result.kv_tokens += backend.length(id);
  return result;
}

}  // namespace lowbit::engine
