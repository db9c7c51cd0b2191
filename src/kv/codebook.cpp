#include "lowbit/kv/codebook.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <tuple>

#include "lowbit/core/error.h"

namespace lowbit::kv {

const char* coordinate_distribution_name(CoordinateDistribution distribution) {
  return distribution == CoordinateDistribution::sphere ? "sphere" : "gaussian";
}

std::optional<CoordinateDistribution> parse_coordinate_distribution(std::string_view name) {
  if (name == "gaussian") return CoordinateDistribution::gaussian;
  if (name == "sphere") return CoordinateDistribution::sphere;
  return std::nullopt;
}

namespace {

// Integrals of a density over a cell [a, b] of the positive half-line:
// mass = int f, first = int y f, second = int y^2 f.
struct CellMoments {
  double mass, first, second;
};

// Standard normal N(0, 1); `upper` is +inf.
CellMoments gaussian_moments(double a, double b) {
  const double inv_sqrt_2pi = 1.0 / std::sqrt(2.0 * std::numbers::pi);
  auto phi = [&](double x) { return std::isinf(x) ? 0.0 : inv_sqrt_2pi * std::exp(-0.5 * x * x); };
  auto x_phi = [&](double x) { return std::isinf(x) ? 0.0 : x * phi(x); };
  // Upper-tail probabilities from erfc: no cancellation in the far cells.
  auto upper_tail = [](double x) { return 0.5 * std::erfc(x / std::numbers::sqrt2); };
  const double mass = upper_tail(a) - upper_tail(b);
  return {mass, phi(a) - phi(b), mass + x_phi(a) - x_phi(b)};
}

// The sphere marginal in dimension d, on [0, 1], by y = sin(t).
class SphereMoments {
 public:
  explicit SphereMoments(int dim) : dim_(dim), n_(dim - 2) { normalizer_ = 1.0 / (2.0 * wallis(1.0)); }

  CellMoments operator()(double a, double b) const {
    const double wa = wallis(a), wb = wallis(b);
    const double mass = normalizer_ * (wb - wa);
    const double first = normalizer_ / (dim_ - 1) * (cos_power(a, dim_ - 1) - cos_power(b, dim_ - 1));
    // int sin^2 cos^n = W_n - W_(n+2) = (W_n - cos^(n+1) sin) / (n + 2), from the recursion.
    auto second_at = [&](double y, double w) { return (w - cos_power(y, n_ + 1) * y) / (n_ + 2); };
    return {mass, first, normalizer_ * (second_at(b, wb) - second_at(a, wa))};
  }

 private:
  // cos(t)^p for y = sin(t) in [0, 1]: (1 - y^2)^(p/2), with 1 - y^2 as (1-y)(1+y).
  static double cos_power(double y, int p) {
    const double c2 = (1.0 - y) * (1.0 + y);
    return std::pow(c2, 0.5 * p);
  }
  // W_n(t) = int_0^t cos^n, t = asin(y), by the upward recursion.
  double wallis(double y) const {
    const double c = std::sqrt((1.0 - y) * (1.0 + y));
    int k = n_ % 2;
    double w = k == 0 ? std::asin(y) : y;
    double c_pow = k == 0 ? c : c * c;  // cos^(k+1)
    for (k += 2; k <= n_; k += 2) {
      w = c_pow * y / k + static_cast<double>(k - 1) / k * w;
      c_pow *= c * c;
    }
    return w;
  }

  int dim_, n_;
  double normalizer_ = 0;
};

}  // namespace

Codebook make_codebook(int bits, int dim, CoordinateDistribution distribution) {
  LOWBIT_CHECK_ARG(bits >= kMinCodebookBits && bits <= kMaxCodebookBits, "bits", bits, "1 to 6");
  LOWBIT_CHECK_ARG(dim >= kMinCodebookDim && dim <= kMaxCodebookDim, "dim", dim, "3 to 4096");
  const bool sphere = distribution == CoordinateDistribution::sphere;
  const SphereMoments sphere_moments(sphere ? dim : 3);
  auto moments = [&](double a, double b) { return sphere ? sphere_moments(a, b) : gaussian_moments(a, b); };
  // The sphere is solved in its own units (y in [0, 1]); the Gaussian in
  // standard units, scaled by 1/sqrt(d) at the end (a Lloyd-Max solution
  // scales with the standard deviation).
  const double upper = sphere ? 1.0 : INFINITY;
  const double unit = sphere ? std::min(1.0, 3.0 / std::sqrt(static_cast<double>(dim))) : 3.0;

  const int half = 1 << (bits - 1);
  std::vector<double> c(static_cast<size_t>(half)), t(static_cast<size_t>(half + 1));
  for (int k = 0; k < half; ++k) c[k] = (k + 0.5) / half * unit;  // any start converges (log-concave)
  auto set_boundaries = [&] {
    t[0] = 0.0;
    for (int k = 1; k < half; ++k) t[k] = 0.5 * (c[k - 1] + c[k]);
    t[half] = upper;
  };

  // Lloyd's iteration converges linearly, with a rate r that approaches 1 as
  // the levels multiply (about 3.3x more iterations per extra bit: ~750 at 4
  // bits, ~8,000 at 6). It stops when the geometric tail of the remaining
  // moves, moved * r / (1 - r), is below 1e-14 of the outer centroid, or when
  // the moves stop shrinking at the rounding floor of the integrals (~1e-14
  // relative at d = 128, growing like d through the sphere's O(d) recursion).
  constexpr int kMaxIterations = 1'000'000;
  int iterations = 0;
  double previous_moved = 0.0;
  const double rounding_floor = 1e-12 * std::max(1.0, dim / 128.0);
  for (;; ++iterations) {
    if (iterations == kMaxIterations)
      fail(ErrorKind::internal, "Lloyd-Max for bits = ", bits, ", dim = ", dim, " (",
           coordinate_distribution_name(distribution), ") did not converge in ", kMaxIterations,
           " iterations");
    set_boundaries();
    double moved = 0.0;
    for (int k = 0; k < half; ++k) {
      const CellMoments m = moments(t[k], t[k + 1]);
      const double next = m.first / m.mass;
      moved = std::max(moved, std::abs(next - c[k]));
      c[k] = next;
    }
    const double outer = c[half - 1];
    if (moved == 0.0) break;
    const double rate = previous_moved > 0.0 ? moved / previous_moved : 1.0;
    if (rate < 1.0 && moved * rate / (1.0 - rate) <= 1e-14 * outer) break;
    if (rate >= 1.0 && iterations > 0 && moved <= rounding_floor * outer) break;
    previous_moved = moved;
  }
  set_boundaries();

  double half_mse = 0.0;
  for (int k = 0; k < half; ++k) {
    const CellMoments m = moments(t[k], t[k + 1]);
    half_mse += m.second - 2.0 * c[k] * m.first + c[k] * c[k] * m.mass;
  }
  const double scale = sphere ? 1.0 : 1.0 / std::sqrt(static_cast<double>(dim));

  Codebook book;
  book.bits = bits;
  book.dim = dim;
  book.distribution = distribution;
  book.iterations = iterations;
  const int levels = 2 * half;
  book.centroids.resize(static_cast<size_t>(levels));
  for (int k = 0; k < half; ++k) {
    book.centroids[half + k] = c[k] * scale;
    book.centroids[half - 1 - k] = -c[k] * scale;
  }
  book.boundaries.resize(static_cast<size_t>(levels - 1));
  book.boundaries[half - 1] = 0.0;
  for (int k = 1; k < half; ++k) {
    book.boundaries[half - 1 + k] = t[k] * scale;
    book.boundaries[half - 1 - k] = -t[k] * scale;
  }
  for (double v : book.centroids) book.centroids_f32.push_back(static_cast<float>(v));
  for (double v : book.boundaries) book.boundaries_f32.push_back(static_cast<float>(v));
  // Both halves contribute equally; the Gaussian's MSE scales with the variance 1/d.
  book.coordinate_mse = 2.0 * half_mse * scale * scale;
  book.unit_vector_mse = book.coordinate_mse * dim;
  return book;
}

const Codebook& cached_codebook(int bits, int dim, CoordinateDistribution distribution) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, CoordinateDistribution>, std::unique_ptr<Codebook>> books;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = books[{bits, dim, distribution}];
  if (!slot) slot = std::make_unique<Codebook>(make_codebook(bits, dim, distribution));
  return *slot;
}

int bucketize(const std::vector<float>& boundaries_f32, float y) {
  return static_cast<int>(std::upper_bound(boundaries_f32.begin(), boundaries_f32.end(), y) -
                          boundaries_f32.begin());
}

}  // namespace lowbit::kv
