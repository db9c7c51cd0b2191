// Lloyd-Max codebooks: the published Gaussian levels, optimality checked by an
// independent quadrature, the exact sphere marginal's special cases, bucketize.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <vector>

#include "error_matchers.h"
#include "lowbit/kv/codebook.h"
#include "tolerances.h"

namespace lowbit::kv {
namespace {

using lowbit::test::throws_error;

// J. Max, "Quantizing for minimum distortion" (1960), Table I: optimum levels
// and thresholds (positive half) for N(0, 1), and the mean squared error.
struct PublishedLevels {
  int bits;
  std::vector<double> levels, thresholds;
  double mse;
};
const std::vector<PublishedLevels>& max_1960_table() {
  static const std::vector<PublishedLevels> table = {
      {2, {0.4528, 1.510}, {0.0, 0.9816}, 0.1175},
      {3, {0.2451, 0.7560, 1.344, 2.152}, {0.0, 0.5006, 1.050, 1.748}, 0.03454},
      {4,
       {0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733},
       {0.0, 0.2582, 0.5224, 0.7996, 1.099, 1.437, 1.844, 2.401},
       0.009497},
  };
  return table;
}

TEST(Codebook, GaussianD128EqualsPublishedLloydMaxLevelsScaled) {
  const double scale = 1.0 / std::sqrt(128.0);
  for (const PublishedLevels& row : max_1960_table()) {
    SCOPED_TRACE("bits = " + std::to_string(row.bits));
    const Codebook book = make_codebook(row.bits, 128);
    const int half = book.levels() / 2;
    ASSERT_EQ(book.centroids.size(), static_cast<size_t>(2 * half));
    ASSERT_EQ(book.boundaries.size(), static_cast<size_t>(2 * half - 1));
    for (int k = 0; k < half; ++k) {
      EXPECT_NEAR(book.centroids[half + k], row.levels[k] * scale, test::kCodebookPublishedAbsTol) << k;
      EXPECT_NEAR(book.centroids[half - 1 - k], -row.levels[k] * scale, test::kCodebookPublishedAbsTol) << k;
      EXPECT_NEAR(book.boundaries[half - 1 + k], row.thresholds[k] * scale, test::kCodebookPublishedAbsTol)
          << k;
    }
    EXPECT_NEAR(book.unit_vector_mse, row.mse, test::kCodebookPublishedMseAbsTol);
    EXPECT_NEAR(book.coordinate_mse * 128, book.unit_vector_mse, 1e-15);
  }
  // The numbers: outermost 4-bit levels +-0.2415 and +-0.1829.
  const Codebook four = make_codebook(4, 128);
  EXPECT_NEAR(four.centroids.back(), 0.2415, test::kCodebookPublishedAbsTol);
  EXPECT_NEAR(four.centroids.front(), -0.2415, test::kCodebookPublishedAbsTol);
  EXPECT_NEAR(four.centroids[14], 0.1829, test::kCodebookPublishedAbsTol);
  EXPECT_NEAR(four.centroids[1], -0.1829, test::kCodebookPublishedAbsTol);
}

TEST(Codebook, SymmetricSortedMidpointBoundariesAndFp32Copies) {
  for (CoordinateDistribution dist : {CoordinateDistribution::gaussian, CoordinateDistribution::sphere})
    for (int bits = 1; bits <= 4; ++bits) {
      const Codebook book = make_codebook(bits, 128, dist);
      const int L = book.levels();
      EXPECT_EQ(book.bits, bits);
      EXPECT_EQ(book.dim, 128);
      EXPECT_EQ(book.distribution, dist);
      for (int i = 0; i < L; ++i) {
        EXPECT_EQ(book.centroids[i], -book.centroids[L - 1 - i]);
        EXPECT_EQ(book.centroids_f32[i], static_cast<float>(book.centroids[i]));
        if (i > 0) {
          EXPECT_LT(book.centroids[i - 1], book.centroids[i]);
        }
      }
      for (int i = 0; i + 1 < L; ++i) {
        EXPECT_DOUBLE_EQ(book.boundaries[i], 0.5 * (book.centroids[i] + book.centroids[i + 1]));
        EXPECT_EQ(book.boundaries_f32[i], static_cast<float>(book.boundaries[i]));
      }
      EXPECT_EQ(book.boundaries[L / 2 - 1], 0.0);
    }
}

// Composite Simpson on [a, b] with n panels.
double simpson(const std::function<double(double)>& f, double a, double b, int n) {
  const double h = (b - a) / n;
  double s = f(a) + f(b);
  for (int i = 1; i < n; ++i) s += f(a + i * h) * (i % 2 == 1 ? 4.0 : 2.0);
  return s * h / 3.0;
}

// Every centroid is the conditional mean of its cell, by brute-force
// quadrature of the density (unnormalized: the constant cancels).
void expect_centroids_are_cell_means(const Codebook& book, const std::function<double(double)>& density,
                                     double upper) {
  const int L = book.levels();
  for (int k = L / 2; k < L; ++k) {
    const double a = book.boundaries[k - 1];
    const double b = k + 1 < L ? book.boundaries[k] : upper;
    const double mass = simpson(density, a, b, 200000);
    const double first = simpson([&](double y) { return y * density(y); }, a, b, 200000);
    EXPECT_NEAR(book.centroids[k], first / mass, test::kCodebookOptimalityRtol * book.centroids.back())
        << "level " << k << " of " << L << ", dim " << book.dim;
  }
}

TEST(Codebook, CentroidsAreConditionalMeansByIndependentQuadrature) {
  for (int bits = 1; bits <= 4; ++bits) {
    const Codebook g = make_codebook(bits, 128);
    const double sigma = 1.0 / std::sqrt(128.0);
    // The Gaussian tail beyond 14 sigma holds < 1e-44 of the mass.
    expect_centroids_are_cell_means(
        g, [&](double y) { return std::exp(-0.5 * y * y / (sigma * sigma)); }, 14.0 * sigma);
    for (int dim : {5, 128}) {
      const Codebook s = make_codebook(bits, dim, CoordinateDistribution::sphere);
      expect_centroids_are_cell_means(
          s, [&](double y) { return std::pow(1.0 - y * y, 0.5 * (dim - 3)); }, 1.0);
      // MSE by quadrature too (normalized density on [-1, 1], both halves).
      const auto f = [&](double y) { return std::pow(1.0 - y * y, 0.5 * (dim - 3)); };
      const double total = 2.0 * simpson(f, 0.0, 1.0, 200000);
      double mse = 0.0;
      const int L = s.levels();
      for (int k = L / 2; k < L; ++k) {
        const double a = s.boundaries[k - 1], b = k + 1 < L ? s.boundaries[k] : 1.0, c = s.centroids[k];
        mse += 2.0 * simpson([&](double y) { return (y - c) * (y - c) * f(y); }, a, b, 200000) / total;
      }
      EXPECT_NEAR(s.coordinate_mse, mse, 1e-9 * mse) << "sphere dim " << dim << " bits " << bits;
    }
  }
}

TEST(Codebook, SphereInDimensionThreeIsTheUniformQuantizer) {
  // For d = 3 the marginal is uniform on [-1, 1] (Archimedes), whose
  // Lloyd-Max quantizer is uniform: c_k = -1 + (2k + 1) / L, MSE = (2/L)^2 / 12.
  for (int bits = 1; bits <= 4; ++bits) {
    const Codebook book = make_codebook(bits, 3, CoordinateDistribution::sphere);
    const int L = book.levels();
    for (int k = 0; k < L; ++k) EXPECT_NEAR(book.centroids[k], -1.0 + (2.0 * k + 1.0) / L, 1e-14);
    EXPECT_NEAR(book.coordinate_mse, (2.0 / L) * (2.0 / L) / 12.0, 1e-14);
  }
  // d = 5: density (3/4)(1 - y^2); the 1-bit centroid is E[y | y > 0] = 3/8.
  EXPECT_NEAR(make_codebook(1, 5, CoordinateDistribution::sphere).centroids[1], 0.375, 1e-14);
}

TEST(Codebook, SphereMarginalAtD128AndItsGaussianLimit) {
  // Computed independently (trapezoid CDF, 4e5 points) in the shared KV notes.
  const Codebook s = make_codebook(4, 128, CoordinateDistribution::sphere);
  EXPECT_NEAR(s.centroids.back(), 0.237664, 2e-6);
  EXPECT_NEAR(s.centroids[8], 0.011302, 2e-6);
  EXPECT_NEAR(s.unit_vector_mse, 0.00931, 1e-5);
  // The sphere marginal approaches N(0, 1/d) as d grows: at d = 4096 the
  // outer level differs by < 0.1% (at d = 128 by 1.6%).
  const Codebook big_s = make_codebook(4, 4096, CoordinateDistribution::sphere);
  const Codebook big_g = make_codebook(4, 4096);
  EXPECT_NEAR(big_s.centroids.back() / big_g.centroids.back(), 1.0, 1e-3);
  EXPECT_GT(std::abs(s.centroids.back() / make_codebook(4, 128).centroids.back() - 1.0), 0.01);
}

TEST(Codebook, GaussianScalesWithOneOverSqrtDim) {
  const Codebook a = make_codebook(3, 64), b = make_codebook(3, 256);
  for (size_t i = 0; i < a.centroids.size(); ++i) EXPECT_NEAR(a.centroids[i], 2.0 * b.centroids[i], 1e-14);
  EXPECT_NEAR(a.unit_vector_mse, b.unit_vector_mse, 1e-14);
}

TEST(Codebook, BucketizeCountsBoundariesAtOrBelow) {
  const Codebook& book = cached_codebook(4, 128);
  EXPECT_EQ(&book, &cached_codebook(4, 128));  // computed once
  EXPECT_EQ(book.centroids, make_codebook(4, 128).centroids);
  const std::vector<float>& b = book.boundaries_f32;
  EXPECT_EQ(bucketize(b, -1.0f), 0);
  EXPECT_EQ(bucketize(b, 1.0f), 15);
  EXPECT_EQ(bucketize(b, 0.0f), 8);  // on the middle boundary: the upper cell
  EXPECT_EQ(bucketize(b, -0.0f), 8);
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(bucketize(b, b[i]), i + 1);
    EXPECT_EQ(bucketize(b, std::nextafter(b[i], -1.0f)), i);
  }
  // Nearest centroid everywhere (boundaries are midpoints).
  for (float y = -0.3f; y <= 0.3f; y += 0.00037f) {
    const int idx = bucketize(b, y);
    for (int j = 0; j < 16; ++j)
      EXPECT_LE(std::abs(y - book.centroids_f32[idx]), std::abs(y - book.centroids_f32[j]) + 1e-7f) << y;
  }
}

TEST(Codebook, ErrorsNameTheArgument) {
  EXPECT_TRUE(throws_error([] { (void)make_codebook(0, 128); }, ErrorKind::invalid_argument,
                           {"'bits' = 0", "1 to 6"}));
  EXPECT_TRUE(throws_error([] { (void)make_codebook(7, 128); }, ErrorKind::invalid_argument, "'bits' = 7"));
  EXPECT_TRUE(throws_error([] { (void)make_codebook(4, 2); }, ErrorKind::invalid_argument,
                           {"'dim' = 2", "3 to 4096"}));
  EXPECT_TRUE(throws_error([] { (void)make_codebook(4, 5000, CoordinateDistribution::sphere); },
                           ErrorKind::invalid_argument, "'dim' = 5000"));
  EXPECT_EQ(parse_coordinate_distribution("sphere"), CoordinateDistribution::sphere);
  EXPECT_EQ(parse_coordinate_distribution("beta"), std::nullopt);
}

}  // namespace
}  // namespace lowbit::kv
