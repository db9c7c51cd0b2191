// Lloyd-Max scalar codebooks for the coordinates of a randomly rotated unit
// vector (TurboQuant / PolarQuant, the "MSE" variant without QJL).
//
// Facts this header relies on:
//  - After a Haar-random rotation, each coordinate y_j of a unit vector in R^d
//    has the exact density f(y) = C * (1 - y^2)^((d-3)/2) on [-1, 1] (the
//    marginal of a uniform point on the sphere S^(d-1)); for large d it is
//    close to N(0, 1/d). Both densities are symmetric and log-concave, so the
//    Lloyd-Max fixed point is unique (Fleischer 1964) and Lloyd's iteration
//    converges to it from any start.
//  - A codebook of 2^bits levels is symmetric: centroids come in +- pairs,
//    none is 0, and the middle boundary is exactly 0. We solve for the
//    positive half only, which makes the symmetry exact in floating point.
//  - Boundaries are the midpoints of adjacent centroids (nearest-centroid
//    cells); each centroid is the conditional mean of its cell.
//
// Every integral is in closed form (no quadrature), so the result is exact to
// double rounding:
//  - gaussian N(0, 1): cell mass from erfc, first moment from the density
//    phi, second moment = mass + a*phi(a) - b*phi(b); then scaled by 1/sqrt(d).
//  - sphere: with y = sin(t), f(y) dy = C cos^(d-2)(t) dt. The mass uses
//    W_n(t) = integral_0^t cos^n, via W_n = cos^(n-1) sin / n + (n-1)/n W_(n-2)
//    (W_0 = t, W_1 = sin t; the recursion damps rounding errors, since
//    (n-1)/n < 1); the first moment is C (cos^(d-1) a' - cos^(d-1) b') / (d-1);
//    the second is C (W_n - W_(n+2)); C = 1 / (2 W_(d-2)(pi/2)).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace lowbit::kv {

enum class CoordinateDistribution : uint8_t {
  gaussian,  // N(0, 1/d): the large-d limit, what the literature tabulates
  sphere,    // the exact marginal of a uniform point on S^(d-1)
};
const char* coordinate_distribution_name(CoordinateDistribution distribution);  // "gaussian", "sphere"

inline constexpr int kMinCodebookBits = 1;
inline constexpr int kMaxCodebookBits = 6;    // Lloyd needs ~3.3x more iterations per bit
inline constexpr int kMinCodebookDim = 3;     // the sphere density needs d >= 3
inline constexpr int kMaxCodebookDim = 4096;  // the sphere recursion costs O(d) per boundary

struct Codebook {
  int bits = 0;
  int dim = 0;
  CoordinateDistribution distribution = CoordinateDistribution::gaussian;
  std::vector<double> centroids;     // 2^bits levels, ascending, c[L-1-i] = -c[i]
  std::vector<double> boundaries;    // 2^bits - 1 midpoints, ascending, middle one 0
  std::vector<float> centroids_f32;  // the values quantizers and kernels use
  std::vector<float> boundaries_f32;
  double coordinate_mse = 0;   // E[(y - c(y))^2] for one coordinate y
  double unit_vector_mse = 0;  // dim * coordinate_mse: E||x - x~||^2 for ||x|| = 1
  int iterations = 0;          // Lloyd iterations until the centroids stopped moving

  int levels() const { return 1 << bits; }
};

// Solves Lloyd-Max for 2^bits levels (bits in [1, 6]) for coordinates of
// dimension dim (in [3, 4096]). Throws Error(invalid_argument) naming
// 'bits' or 'dim'; Error(internal) if the iteration does not converge.
Codebook make_codebook(int bits, int dim,
                       CoordinateDistribution distribution = CoordinateDistribution::gaussian);

// The same codebook, computed once per (bits, dim, distribution) and kept for
// the life of the program (thread-safe). Quantizers hold a reference.
const Codebook& cached_codebook(int bits, int dim,
                                CoordinateDistribution distribution = CoordinateDistribution::gaussian);

// Index of the cell holding y: the number of boundaries b with y >= b (the
// comparison a GPU kernel makes with the same fp32 boundaries). A y exactly on
// a boundary goes to the upper cell.
int bucketize(const std::vector<float>& boundaries_f32, float y);

std::optional<CoordinateDistribution> parse_coordinate_distribution(std::string_view name);

}  // namespace lowbit::kv
