// Rotations: the counter-based generator's known answers, Haar orthogonality,
// the QR sign fix, determinism and the seed scheme, Haar statistics, the
// randomized Hadamard transform.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "error_matchers.h"
#include "kv_test_util.h"
#include "lowbit/kv/counter_rng.h"
#include "lowbit/kv/rotation.h"
#include "tolerances.h"

namespace lowbit::kv {
namespace {

using lowbit::test::throws_error;

TEST(CounterRng, IsSplitmix64WithRandomAccess) {
  // The published first outputs of splitmix64 seeded with 0.
  EXPECT_EQ(random_u64(0, 0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(random_u64(0, 1), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(random_u64(0, 2), 0x06C45D188009454Full);
  // Element n of any stream is the generator stepped n + 1 times.
  uint64_t state = 42;
  for (uint64_t n = 0; n < 100; ++n) {
    state += kSplitmixGamma;
    EXPECT_EQ(random_u64(42, n), splitmix64_mix(state));
  }
}

TEST(CounterRng, NormalsHaveUnitVarianceAndSignsAreBalanced) {
  const int n = 200000;
  double sum = 0, sum2 = 0, sum4 = 0;
  int negative = 0;
  for (int i = 0; i < n; ++i) {
    const double z = random_normal(7, static_cast<uint64_t>(i));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    negative += random_sign(7, static_cast<uint64_t>(i)) < 0;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.012);   // 5 standard errors (1/sqrt(n) = 0.0022)
  EXPECT_NEAR(sum2 / n, 1.0, 0.016);  // sqrt(2/n) = 0.0032
  EXPECT_NEAR(sum4 / n, 3.0, 0.15);   // Gaussian kurtosis; sqrt(96/n) = 0.022
  EXPECT_NEAR(static_cast<double>(negative) / n, 0.5, 0.006);
}

// R R^T and R^T R computed in fp32.
void expect_orthogonal_fp32(const std::vector<float>& m, int d) {
  double worst = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      float rows = 0, cols = 0;
      for (int k = 0; k < d; ++k) {
        rows += m[i * d + k] * m[j * d + k];
        cols += m[k * d + i] * m[k * d + j];
      }
      const float expected = i == j ? 1.0f : 0.0f;
      worst = std::max({worst, std::abs(static_cast<double>(rows - expected)),
                        std::abs(static_cast<double>(cols - expected))});
    }
  EXPECT_LE(worst, test::kRotationOrthogonalityTol) << "dim " << d;
}

TEST(Rotation, HaarIsOrthogonalInFp32) {
  for (int d : {1, 32, 64, 128, 256}) expect_orthogonal_fp32(Rotation::haar(d, 42).dense_matrix(), d);
}

TEST(Rotation, HaarSignFixMakesRDiagonalPositive) {
  // G = Q R with R upper triangular and diag(R) > 0: R = Q^T G.
  const int d = 64;
  const std::vector<double> g = gaussian_matrix(d, 1042);
  const std::vector<double> q = haar_orthogonal(d, 1042);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double r = 0;
      for (int k = 0; k < d; ++k) r += q[k * d + i] * g[k * d + j];
      if (i > j) {
        EXPECT_NEAR(r, 0.0, 1e-11) << i << "," << j;
      }
      if (i == j) {
        EXPECT_GT(r, 1e-3) << i;
      }
    }
  // And Q is the fp32 matrix Rotation::haar stores.
  const std::vector<float> m = Rotation::haar(d, 1042).dense_matrix();
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i], static_cast<float>(q[i]));
}

TEST(Rotation, DeterministicPerSeedAndOnePerLayer) {
  const std::vector<float> a = Rotation::haar(128, 42).dense_matrix();
  EXPECT_EQ(a, Rotation::haar(128, 42).dense_matrix());
  EXPECT_NE(a, Rotation::haar(128, 43).dense_matrix());
  EXPECT_EQ(layer_rotation_seed(kDefaultRotationSeedBase, 0), 42u);
  EXPECT_EQ(layer_rotation_seed(kDefaultRotationSeedBase, 3), 3042u);
  EXPECT_NE(a, Rotation::haar(128, layer_rotation_seed(42, 1)).dense_matrix());
  const Rotation h = Rotation::hadamard(128, 42);
  EXPECT_EQ(h.dense_matrix(), Rotation::hadamard(128, 42).dense_matrix());
  EXPECT_NE(h.dense_matrix(), Rotation::hadamard(128, 1042).dense_matrix());
  EXPECT_EQ(h.seed(), 42u);
  EXPECT_EQ(h.kind(), RotationKind::hadamard);
  // The first Gaussian entries are pinned: a change of generator changes every
  // cached quantization, so it must be deliberate.
  const std::vector<double> g = gaussian_matrix(4, 42);
  for (size_t n = 0; n < g.size(); ++n) EXPECT_EQ(g[n], random_normal(42, n));
}

TEST(Rotation, HaarTraceHasTheHaarMoments) {
  // For Haar-random O(d), E[tr] = 0 and Var[tr] = 1. Householder QR without
  // the sign fix gives E[tr] far from 0 (its reflections bias the diagonal).
  const int d = 8, samples = 3000;
  double sum = 0, sum2 = 0;
  for (int s = 0; s < samples; ++s) {
    const std::vector<double> q = haar_orthogonal(d, static_cast<uint64_t>(s));
    double tr = 0;
    for (int i = 0; i < d; ++i) tr += q[i * d + i];
    sum += tr;
    sum2 += tr * tr;
  }
  const double mean = sum / samples;
  EXPECT_NEAR(mean, 0.0, test::kHaarTraceMeanTol);
  EXPECT_NEAR(sum2 / samples - mean * mean, 1.0, test::kHaarTraceVarianceTol);
}

void expect_rotation_matches_dense(const Rotation& r) {
  const int d = r.dim();
  const std::vector<float> m = r.dense_matrix();
  const std::vector<float> x = kvtest::random_rows(1, 1, d, 5, kvtest::DataKind::gaussian, false);
  std::vector<float> y(static_cast<size_t>(d)), back(static_cast<size_t>(d));
  r.rotate(x, y);
  double xx = 0, yy = 0;
  for (int j = 0; j < d; ++j) {
    double expected = 0;
    for (int i = 0; i < d; ++i) expected += static_cast<double>(x[i]) * m[i * d + j];
    EXPECT_NEAR(y[j], expected, test::kRotationApplyTol * std::sqrt(static_cast<double>(d))) << j;
    xx += static_cast<double>(x[j]) * x[j];
    yy += static_cast<double>(y[j]) * y[j];
  }
  EXPECT_NEAR(yy / xx, 1.0, 1e-5);
  r.unrotate(y, back);
  for (int i = 0; i < d; ++i) EXPECT_NEAR(back[i], x[i], test::kRotationApplyTol) << i;
  // In place (the same span in and out) gives the same bits.
  std::vector<float> inplace = x;
  r.rotate(inplace, inplace);
  EXPECT_EQ(inplace, y);
}

TEST(Rotation, ApplyEqualsTheDenseMatrixAndInverts) {
  for (int d : {32, 128}) {
    expect_rotation_matches_dense(Rotation::haar(d, 42));
    expect_rotation_matches_dense(Rotation::hadamard(d, 42));
  }
  expect_rotation_matches_dense(Rotation::haar(96, 7));  // any dimension
}

TEST(Rotation, HadamardIsSignedSylvesterAndOrthogonal) {
  for (int d : {2, 32, 128, 1024}) {
    const Rotation r = Rotation::hadamard(d, 42);
    const std::vector<float> m = r.dense_matrix();
    ASSERT_EQ(r.signs().size(), static_cast<size_t>(d));
    const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (int i = 0; i < d; ++i) {
      EXPECT_EQ(std::abs(r.signs()[i]), 1.0f);
      EXPECT_EQ(r.signs()[i], random_sign(42, static_cast<uint64_t>(i)));
      for (int j = 0; j < d; j += 7) {
        const float h = (std::popcount(static_cast<unsigned>(i & j)) % 2 == 0) ? norm : -norm;
        EXPECT_EQ(m[i * d + j], r.signs()[i] * h);
      }
    }
    if (d <= 128) expect_orthogonal_fp32(m, d);
  }
}

TEST(Rotation, ErrorsNameTheArgument) {
  EXPECT_TRUE(throws_error([] { (void)Rotation::haar(0, 1); }, ErrorKind::invalid_argument,
                           {"'dim' = 0", "1 to 1024"}));
  EXPECT_TRUE(
      throws_error([] { (void)Rotation::haar(2048, 1); }, ErrorKind::invalid_argument, "'dim' = 2048"));
  EXPECT_TRUE(throws_error([] { (void)Rotation::hadamard(96, 1); }, ErrorKind::invalid_argument,
                           {"'dim' = 96", "power of two"}));
  const Rotation r = Rotation::hadamard(32, 1);
  std::vector<float> x(31), y(32);
  EXPECT_TRUE(
      throws_error([&] { r.rotate(x, y); }, ErrorKind::invalid_argument, {"'x' has 31 values", "32"}));
  std::vector<float> x32(32), y16(16);
  EXPECT_TRUE(throws_error([&] { r.unrotate(x32, y16); }, ErrorKind::invalid_argument, "'x' has 16 values"));
  EXPECT_EQ(parse_rotation_kind("hadamard"), RotationKind::hadamard);
  EXPECT_EQ(parse_rotation_kind("qr"), std::nullopt);
}

}  // namespace
}  // namespace lowbit::kv
