// Shared by the engine tests: the golden folders, logits comparison, and
// running a model over a token list.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "lowbit/engine/backend.h"
#include "lowbit/engine/weights.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::test {

inline std::filesystem::path golden_dir(const std::string& model) {
  return std::filesystem::path(LOWBIT_SOURCE_DIR) / "tests" / "engine" / "golden" / model;
}

// max_i |a_i - b_i| / max_i |b_i| (see kEngineLogitsMaxRelError).
inline double max_relative_error(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0.0 ? num / den : num;
}

// Prefill of `prefill` tokens (every position's logits), then one token per
// call for the rest: the logits of every position, [tokens][vocab].
inline std::vector<float> run_positions(engine::Backend& backend, std::span<const int32_t> tokens, size_t prefill) {
  const int seq = backend.add_sequence();
  std::vector<float> all, step;
  const engine::StepInput first{seq, tokens.subspan(0, prefill)};
  backend.forward(std::span<const engine::StepInput>(&first, 1), engine::LogitsWanted::all, all);
  for (size_t i = prefill; i < tokens.size(); ++i) {
    const engine::StepInput in{seq, tokens.subspan(i, 1)};
    backend.forward(std::span<const engine::StepInput>(&in, 1), engine::LogitsWanted::last, step);
    all.insert(all.end(), step.begin(), step.end());
  }
  backend.release_sequence(seq);
  return all;
}

// A golden folder's reference (tests/engine/make_golden.py): the tokens (a
// prompt of kGoldenPrefill, then transformers' greedy continuation), the
// logits at every position, and those with the linears fake-quantized to w4.
inline constexpr size_t kGoldenPrefill = 10;  // make_golden.py's PROMPT_TOKENS
struct Golden {
  std::vector<int32_t> tokens;
  std::vector<float> logits, logits_w4;
};

inline Golden read_golden(const std::string& model) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(golden_dir(model) / "golden.safetensors");
  Golden g;
  const TensorView t = f.view("tokens");
  g.tokens.assign(t.as<const int32_t>(), t.as<const int32_t>() + t.numel());
  const TensorView l = f.view("logits");
  g.logits.assign(l.as<const float>(), l.as<const float>() + l.numel());
  const TensorView w = f.view("logits_w4");
  g.logits_w4.assign(w.as<const float>(), w.as<const float>() + w.numel());
  return g;
}

// The default model (scripts/fetch-default-model), or "" when it is not in the cache.
inline std::filesystem::path default_model_path() {
  std::filesystem::path cache;
  if (const char* d = std::getenv("LOWBIT_CACHE_DIR"); d != nullptr && *d != '\0') cache = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') cache = std::filesystem::path(x) / "lowbit";
  else if (const char* h = std::getenv("HOME"); h != nullptr) cache = std::filesystem::path(h) / ".cache" / "lowbit";
  const std::filesystem::path p = cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(p) ? p : std::filesystem::path();
}

}  // namespace lowbit::test
