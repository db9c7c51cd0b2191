// Sampling: greedy, temperature, top-k, top-p, seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/engine/sampler.h"

namespace lowbit::test {
namespace {

using engine::Sampler;
using engine::SamplingOptions;

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler s(SamplingOptions{});
  EXPECT_EQ(s.sample(kLogits), 1);
  EXPECT_EQ(engine::argmax(kLogits), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  SamplingOptions o;
  o.temperature = 1.0f;
  o.top_k = 1;
  Sampler a(o);
  o.top_k = 0;
  o.top_p = 0.01f;
  Sampler b(o);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(a.sample(kLogits), 1);
    EXPECT_EQ(b.sample(kLogits), 1);
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  SamplingOptions o;
  o.temperature = 1.0f;
  o.seed = 42;
  Sampler a(o), b(o);
  o.seed = 43;
  Sampler c(o);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 100; ++i) {
    ta.push_back(a.sample(kLogits));
    tb.push_back(b.sample(kLogits));
    tc.push_back(c.sample(kLogits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  SamplingOptions o;
  o.temperature = 0.7f;
  o.seed = 1;
  Sampler s(o);
  const int n = 40000;
  std::vector<int> counts(kLogits.size());
  for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(s.sample(kLogits))];
  double z = 0.0;
  for (float l : kLogits) z += std::exp(l / 0.7);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    const double p = std::exp(kLogits[i] / 0.7) / z;
    const double sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(counts[i] / static_cast<double>(n), p, 5 * sd + 1e-4) << "token " << i;
  }
}

TEST(Sampler, TopKAndTopPKeepOnlyTheirCandidates) {
  SamplingOptions o;
  o.temperature = 5.0f;  // nearly uniform, so exclusion is what limits the choice
  o.top_k = 3;           // ids 1, 4 (ties: lower id first) and 3
  Sampler k(o);
  for (int i = 0; i < 500; ++i) {
    const int32_t t = k.sample(kLogits);
    EXPECT_TRUE(t == 1 || t == 4 || t == 3) << t;
  }
  o.top_k = 0;
  o.temperature = 1.0f;
  o.top_p = 0.8f;  // p(1) = p(4) = 0.332, p(3) = 0.201: the smallest prefix reaching 0.8 is {1, 4, 3}
  Sampler p(o);
  std::vector<int> seen(kLogits.size());
  for (int i = 0; i < 2000; ++i) ++seen[static_cast<size_t>(p.sample(kLogits))];
  EXPECT_EQ(seen[0] + seen[2] + seen[5], 0);
  EXPECT_GT(seen[3], 0);
}

TEST(Sampler, RejectsBadOptionsAndNaN) {
  SamplingOptions o;
  o.temperature = -1.0f;
  EXPECT_THROW(Sampler{o}, Error);
  o = {};
  o.top_p = 0.0f;
  EXPECT_THROW(Sampler{o}, Error);
  o = {};
  o.top_k = -2;
  EXPECT_THROW(Sampler{o}, Error);
  Sampler s(SamplingOptions{});
  const std::vector<float> bad = {1.0f, NAN};
  EXPECT_THROW(s.sample(bad), Error);
  EXPECT_THROW(s.sample(std::span<const float>()), Error);
}

}  // namespace
}  // namespace lowbit::test
