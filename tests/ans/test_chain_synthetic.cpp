// The seed's experiment: requantization, the FxHash-style result hash, the
// plain chain, and the synthetic generators (seed data; per-channel and
// per-group 8- and 4-bit codes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "ans_test_util.h"
#include "error_matchers.h"
#include "lowbit/ans/chain.h"
#include "lowbit/ans/entropy_model.h"
#include "lowbit/ans/synthetic.h"

namespace {

using namespace lowbit::ans;
using lowbit::ErrorKind;
using lowbit::test::expect_error;

TEST(Chain, FxHashMatchesTheReadmeDefinition) {
  // Values from the README's definition evaluated in Python.
  EXPECT_EQ(fxhash32({}), 0u);
  const std::vector<int8_t> one = {1}, two = {1, -1}, zeros = {0, 0, 0}, four = {127, -127, 5, -1};
  EXPECT_EQ(fxhash32(one), 656542357u);
  EXPECT_EQ(fxhash32(two), 877821175u);
  EXPECT_EQ(fxhash32(zeros), 0u);
  EXPECT_EQ(fxhash32(four), 489808914u);
}

TEST(Chain, RequantizeRoundsHalfToEven) {
  // max|y| = 254: 127 * y / 254 = y / 2, so odd y are exact ties.
  const std::vector<int64_t> y = {254, 1, 3, 5, -1, -3, -254, 0, 2};
  EXPECT_EQ(requantize(y), (std::vector<int8_t>{127, 0, 2, 2, 0, -2, -127, 0, 1}));
  EXPECT_EQ(requantize(std::vector<int64_t>{0, 0}), (std::vector<int8_t>{0, 0}));
  EXPECT_EQ(requantize(std::vector<int64_t>{-7}), (std::vector<int8_t>{-127}));
}

TEST(Chain, RequantizeEqualsTheDoubleFormula) {
  // The README's formula round_half_even(127 * y / max|y|) in double agrees
  // with our exact integer evaluation (see chain.h for why).
  std::mt19937_64 rng(3);
  for (int t = 0; t < 200; ++t) {
    std::vector<int64_t> y(50);
    const int64_t range = int64_t{1} << (rng() % 40);
    for (auto& v : y) v = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * range + 1)) - range;
    if (t % 3 == 0) y[0] = 2 * y[1];  // make ties likely
    const std::vector<int8_t> q = requantize(y);
    int64_t m = 0;
    for (int64_t v : y) m = std::max(m, std::abs(v));
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(q[i], m == 0 ? 0 : static_cast<int8_t>(std::nearbyint(127.0 * static_cast<double>(y[i]) / static_cast<double>(m))))
          << "y = " << y[i] << " max = " << m;
  }
}

TEST(Chain, ReferenceChainFollowsTheDefinition) {
  Chain c;
  c.v0 = {1, 2};
  Int8Matrix a;
  a.rows = 3;
  a.cols = 2;
  a.data = {1, 0, 0, 1, -1, -1};  // y = [1, 2, -3] -> 127*y/3 = [42.33, 84.67, -127] -> [42, 85, -127]
  c.matrices.push_back(a);
  EXPECT_EQ(run_chain_reference(c), (std::vector<int8_t>{42, 85, -127}));
  Int8Matrix bad = a;
  bad.cols = 3;
  c.matrices.push_back(bad);  // 3 columns follow 3 rows: fine; but data has 6 codes, not 9
  expect_error([&] { run_chain_reference(c); }, ErrorKind::format, {"matrix 1", "holds 6 codes", "3 x 3"});
  c.matrices.pop_back();
  c.matrices.push_back(a);  // 2 columns after 3 rows
  expect_error([&] { run_chain_reference(c); }, ErrorKind::format, {"matrix 1", "N_k = 2", "expected 3"});
}

TEST(Synthetic, SeedDataIsDeterministicAndThreadIndependent) {
  SyntheticOptions o;
  o.layers = 2;
  o.dim = 100;
  ::setenv("LOWBIT_NUM_THREADS", "1", 1);
  const Chain a = make_synthetic_chain(o);
  ::setenv("LOWBIT_NUM_THREADS", "4", 1);
  const Chain b = make_synthetic_chain(o);
  ::unsetenv("LOWBIT_NUM_THREADS");
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(a.matrices[k].data, b.matrices[k].data);
  EXPECT_EQ(a.v0, b.v0);
  EXPECT_EQ(*a.result_hash, *b.result_hash);
  EXPECT_EQ(*a.result_hash, fxhash32(run_chain_reference(a)));
  o.seed += 1;
  EXPECT_NE(make_synthetic_chain(o).matrices[0].data, a.matrices[0].data);
}

TEST(Synthetic, SeedDataLooksLikeTheSeeds) {
  SyntheticOptions o;
  o.layers = 1;
  o.dim = 512;
  const Chain c = make_synthetic_chain(o);
  const Int8Matrix& m = c.matrices[0];
  const SymbolCounts counts = SymbolCounts::of(m.data);
  // Per-tensor absmax: the extreme weight maps to +-127 exactly, nothing beyond.
  EXPECT_EQ(std::max(-counts.min_value(), counts.max_value()), 127);
  EXPECT_GE(counts.min_value(), -127);
  // N(0, 1/sqrt(N)) with max|w| ~ 4.3 sigma at 2^18 draws: the codes have a
  // standard deviation of about 127 / 4.3 ~ 30 and entropy log2(30 sqrt(2 pi e)) ~ 6.9.
  EXPECT_NEAR(counts.entropy_bits(), 6.9, 0.3);
  // delta is the per-tensor scale: max|w| / 127 with max|w| ~ 4.3 / sqrt(512) = 0.19.
  EXPECT_NEAR(m.delta * 127, 0.19, 0.04);
  // v0 = round(N(0, 1)): mostly -2..2.
  int small = 0;
  for (int8_t v : c.v0) small += std::abs(v) <= 2 ? 1 : 0;
  EXPECT_GT(small, 480);
}

TEST(Synthetic, PerChannelAndPerGroupCodesUseTheirGrid) {
  for (int bits : {8, 4})
    for (Granularity g : {Granularity::per_channel, Granularity::per_group}) {
      SCOPED_TRACE(std::to_string(bits) + "-bit " + granularity_name(g));
      SyntheticOptions o;
      o.layers = 1;
      o.dim = 96;
      o.bits = bits;
      o.granularity = g;
      o.group_size = 40;  // 96 columns: groups of 40, 40, 16
      o.distribution = WeightDistribution::laplace;
      const std::vector<float> w = synthetic_weights(o, 0);
      const Chain c = make_synthetic_chain(o);
      const Int8Matrix& m = c.matrices[0];
      const int qmax = bits == 8 ? 127 : 7;
      const int64_t groups = g == Granularity::per_group ? 3 : 1;
      const int64_t width = g == Granularity::per_group ? 40 : 96;
      ASSERT_EQ(m.scales.size(), static_cast<size_t>(96 * groups));
      for (int64_t r = 0; r < 96; ++r)
        for (int64_t gi = 0; gi < groups; ++gi) {
          const float s = m.scales[static_cast<size_t>(r * groups + gi)];
          int amax = 0;
          for (int64_t col = gi * width; col < std::min<int64_t>(96, (gi + 1) * width); ++col) {
            const int q = m.at(r, col);
            amax = std::max(amax, std::abs(q));
            // The code reconstructs the weight to within half a step.
            ASSERT_LE(std::fabs(w[static_cast<size_t>(r * 96 + col)] - s * static_cast<float>(q)), 0.5001f * s);
          }
          ASSERT_EQ(amax, qmax) << "row " << r << " group " << gi << ": absmax maps to the grid's end";
        }
    }
  expect_error([] { quantize_symmetric(std::vector<float>(4), 2, 2, 3, Granularity::per_tensor); },
               ErrorKind::invalid_argument, {"'bits' = 3"});
  expect_error([] { quantize_symmetric(std::vector<float>{1, NAN, 0, 0}, 2, 2, 8, Granularity::per_tensor); },
               ErrorKind::invalid_argument, {"w[1]", "finite"});
}

TEST(Synthetic, HeavierTailsAndFinerScalesChangeTheEntropyAsExpected) {
  // Laplace codes per tensor are more compressible than Gaussian ones; per-row
  // scales spread the codes (higher entropy) -- the notes' table 4.2 trends.
  auto entropy = [](WeightDistribution d, Granularity g, int bits) {
    SyntheticOptions o;
    o.layers = 1;
    o.dim = 256;
    o.distribution = d;
    o.granularity = g;
    o.bits = bits;
    return SymbolCounts::of(make_synthetic_chain(o).matrices[0].data).entropy_bits();
  };
  const double gauss = entropy(WeightDistribution::gaussian, Granularity::per_tensor, 8);
  EXPECT_LT(entropy(WeightDistribution::laplace, Granularity::per_tensor, 8), gauss);
  EXPECT_GT(entropy(WeightDistribution::gaussian, Granularity::per_channel, 8), gauss);
  // int4 per-row codes of Gaussian rows of 4096: 2.96 bits in the notes' table
  // 4.2 (a numpy simulation). 64 such rows give the entropy within ~0.01.
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(64 * 4096);
  for (float& x : w) x = normal(rng);
  const Int8Matrix int4 = quantize_symmetric(w, 64, 4096, 4, Granularity::per_channel);
  EXPECT_NEAR(SymbolCounts::of(int4.data).entropy_bits(), 2.96, 0.05);
}

}  // namespace
