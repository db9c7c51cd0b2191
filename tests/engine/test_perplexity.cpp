// engine::perplexity: the exact value for a model whose logits are all zero,
// independence from the chunking (the cache carries the context between
// forward calls), agreement with the NLL computed directly from the logits of
// one forward call, and clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine_test_util.h"
#include "error_matchers.h"
#include "lowbit/engine/perplexity.h"

namespace lowbit::test {
namespace {

engine::ModelConfig small_config() {
  engine::ModelConfig c;
  c.hidden = 64;
  c.intermediate = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;  // the smallest the TurboQuant cache packs
  c.vocab = 50;
  return c;
}

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

std::unique_ptr<engine::Backend> cpu_backend(const engine::Model& m, int64_t tokens,
                                             engine::KvStorage kv = engine::KvStorage::fp32) {
  engine::CpuBackendOptions o;
  o.kv.k = o.kv.v = kv;
  o.kv.max_tokens = tokens;
  o.kv.max_sequences = 1;
  o.threads = 1;
  return engine::make_cpu_backend(m, o);
}

TEST(Perplexity, ZeroLogitsGiveTheVocabularySize) {
  // All weights zero: every hidden state and logit is exactly 0, so each
  // token has probability 1/vocab.
  const engine::Model m = engine::make_random_model(small_config(), 1, engine::WeightMode::dense, 0.0f);
  const auto tokens = random_tokens(40, 50, 2);
  auto backend = cpu_backend(m, 40);
  const engine::PerplexityResult r = engine::perplexity(*backend, tokens, {7, {}});
  EXPECT_EQ(r.scored, 39);
  EXPECT_NEAR(r.perplexity(), 50.0, 50.0 * 1e-12);
  EXPECT_NEAR(r.mean_nll(), std::log(50.0), 1e-12);
}

TEST(Perplexity, ChunkingDoesNotChangeTheResultAndMatchesTheLogits) {
  const engine::Model m = engine::make_random_model(small_config(), 3, engine::WeightMode::dense, 0.3f);
  const auto tokens = random_tokens(61, 50, 4);
  // Direct: one forward call with every position's logits.
  auto direct_backend = cpu_backend(m, 61);
  const std::vector<float> logits = run_positions(*direct_backend, tokens, tokens.size());
  double nll = 0.0;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const float* row = logits.data() + i * 50;
    double sum = 0.0;
    for (int v = 0; v < 50; ++v) sum += std::exp(static_cast<double>(row[v]));
    nll += std::log(sum) - row[tokens[i + 1]];
  }
  const double want = std::exp(nll / 60.0);
  ASSERT_GT(std::fabs(want - 50.0), 1.0) << "random weights should not give uniform predictions";
  int progress_calls = 0;
  int64_t last_done = 0;
  for (int64_t chunk : {1, 6, 60, 1000}) {
    auto backend = cpu_backend(m, 61);
    engine::PerplexityOptions o;
    o.chunk = chunk;
    progress_calls = 0;
    o.progress = [&](int64_t done, int64_t total) {
      ++progress_calls;
      last_done = done;
      EXPECT_EQ(total, 60);
    };
    const engine::PerplexityResult r = engine::perplexity(*backend, tokens, o);
    EXPECT_EQ(r.scored, 60);
    EXPECT_NEAR(r.perplexity(), want, want * 1e-5) << "chunk " << chunk;
    EXPECT_EQ(progress_calls, (60 + chunk - 1) / chunk);
    EXPECT_EQ(last_done, 60);
    EXPECT_EQ(backend->kv().bytes_used(), 0) << "the sequence is released";
  }
}

TEST(Perplexity, ScoresThroughTheBackendsKvFormat) {
  // The same tokens with a tq4 cache give a different (finite) perplexity:
  // later chunks really read the quantized K/V. (How much it costs on a real
  // model: docs/engine.md, `lowbit perplexity`.)
  const engine::Model m = engine::make_random_model(small_config(), 5, engine::WeightMode::dense, 0.3f);
  const auto tokens = random_tokens(80, 50, 6);
  auto exact = cpu_backend(m, 80);
  auto tq4 = cpu_backend(m, 80, engine::KvStorage::tq4);
  const double a = engine::perplexity(*exact, tokens, {16, {}}).perplexity();
  const double b = engine::perplexity(*tq4, tokens, {16, {}}).perplexity();
  EXPECT_TRUE(std::isfinite(a) && std::isfinite(b));
  EXPECT_NE(a, b);
}

TEST(Perplexity, RejectsWhatItCannotScore) {
  const engine::Model m = engine::make_random_model(small_config(), 7);
  auto backend = cpu_backend(m, 10);
  const std::vector<int32_t> one = {3};
  EXPECT_TRUE(throws_error([&] { engine::perplexity(*backend, one); }, ErrorKind::invalid_argument, "at least 2"));
  const std::vector<int32_t> bad = {3, 4, 50};  // the last token is only scored, never fed: still checked
  EXPECT_TRUE(throws_error([&] { engine::perplexity(*backend, bad); }, ErrorKind::invalid_argument, "tokens[2]"));
  const std::vector<int32_t> two = {1, 2};
  EXPECT_TRUE(throws_error([&] { engine::perplexity(*backend, two, {0, {}}); }, ErrorKind::invalid_argument, "chunk"));
  // Longer than the cache: the backend's own error, and the sequence is released.
  const auto many = random_tokens(30, 50, 8);
  EXPECT_TRUE(throws_error([&] { engine::perplexity(*backend, many); }, ErrorKind::invalid_argument, "max_tokens"));
  EXPECT_EQ(backend->kv().bytes_used(), 0);
  EXPECT_NO_THROW(engine::perplexity(*backend, random_tokens(10, 50, 9)));
}

}  // namespace
}  // namespace lowbit::test
