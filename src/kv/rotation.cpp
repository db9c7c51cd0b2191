#include "lowbit/kv/rotation.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/kv/counter_rng.h"
#include "span_checks.h"

namespace lowbit::kv {

double random_normal(uint64_t seed, uint64_t n) {
  const double u1 = random_uniform_open0(seed, 2 * n);
  const double u2 = random_uniform_open0(seed, 2 * n + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

const char* rotation_kind_name(RotationKind kind) {
  return kind == RotationKind::hadamard ? "hadamard" : "haar";
}

std::optional<RotationKind> parse_rotation_kind(std::string_view name) {
  if (name == "haar") return RotationKind::haar;
  if (name == "hadamard") return RotationKind::hadamard;
  return std::nullopt;
}

namespace {

void check_dim(int dim) { LOWBIT_CHECK_ARG(dim >= 1 && dim <= kMaxRotationDim, "dim", dim, "1 to 1024"); }

size_t square(int dim) { return static_cast<size_t>(dim) * static_cast<size_t>(dim); }

}  // namespace

std::vector<double> gaussian_matrix(int dim, uint64_t seed) {
  check_dim(dim);
  std::vector<double> g(square(dim));
  for (size_t n = 0; n < g.size(); ++n) g[n] = random_normal(seed, n);
  return g;
}

std::vector<double> haar_orthogonal(int dim, uint64_t seed) {
  const size_t d = static_cast<size_t>(dim);
  std::vector<double> a = gaussian_matrix(dim, seed);  // becomes R in its upper triangle
  // Householder vectors v_k (entries k..d-1 used), unit length; H_k = I - 2 v v^T.
  std::vector<double> reflectors(d * d, 0.0);
  std::vector<double> r_diagonal(d);
  for (size_t k = 0; k < d; ++k) {
    double norm2 = 0.0;
    for (size_t i = k; i < d; ++i) norm2 += a[i * d + k] * a[i * d + k];
    const double norm = std::sqrt(norm2);
    // alpha takes the sign opposite to the pivot so that v = x - alpha e_k does
    // not cancel; the sign fix below undoes this convention's influence on Q.
    const double alpha = a[k * d + k] >= 0.0 ? -norm : norm;
    double* v = &reflectors[k * d];
    for (size_t i = k; i < d; ++i) v[i] = a[i * d + k];
    v[k] -= alpha;
    double v_norm2 = 0.0;
    for (size_t i = k; i < d; ++i) v_norm2 += v[i] * v[i];
    r_diagonal[k] = alpha;
    if (v_norm2 == 0.0) continue;  // column already reduced: H_k = I
    const double inv = 1.0 / std::sqrt(v_norm2);
    for (size_t i = k; i < d; ++i) v[i] *= inv;
    for (size_t j = k; j < d; ++j) {
      double dot = 0.0;
      for (size_t i = k; i < d; ++i) dot += v[i] * a[i * d + j];
      for (size_t i = k; i < d; ++i) a[i * d + j] -= 2.0 * v[i] * dot;
    }
  }
  // Q = H_0 H_1 ... H_(d-1): apply the reflectors to I from the last one.
  std::vector<double> q(d * d, 0.0);
  for (size_t i = 0; i < d; ++i) q[i * d + i] = 1.0;
  for (size_t k = d; k-- > 0;) {
    const double* v = &reflectors[k * d];
    for (size_t j = 0; j < d; ++j) {
      double dot = 0.0;
      for (size_t i = k; i < d; ++i) dot += v[i] * q[i * d + j];
      if (dot == 0.0) continue;
      for (size_t i = k; i < d; ++i) q[i * d + j] -= 2.0 * v[i] * dot;
    }
  }
  // Sign fix: Q <- Q diag(sign(R_kk)), so that G = Q' R' with diag(R') > 0.
  for (size_t k = 0; k < d; ++k)
    if (r_diagonal[k] < 0.0)
      for (size_t i = 0; i < d; ++i) q[i * d + k] = -q[i * d + k];
  return q;
}

Rotation Rotation::haar(int dim, uint64_t seed) {
  check_dim(dim);
  Rotation r(RotationKind::haar, dim, seed);
  const std::vector<double> q = haar_orthogonal(dim, seed);
  const size_t d = static_cast<size_t>(dim);
  r.matrix_.resize(d * d);
  r.transpose_.resize(d * d);
  for (size_t i = 0; i < d; ++i)
    for (size_t j = 0; j < d; ++j) {
      r.matrix_[i * d + j] = static_cast<float>(q[i * d + j]);
      r.transpose_[j * d + i] = r.matrix_[i * d + j];
    }
  return r;
}

Rotation Rotation::hadamard(int dim, uint64_t seed) {
  check_dim(dim);
  LOWBIT_CHECK_ARG(std::has_single_bit(static_cast<unsigned>(dim)), "dim", dim,
                   "a power of two for a Hadamard rotation (or use the haar rotation)");
  Rotation r(RotationKind::hadamard, dim, seed);
  r.signs_.resize(static_cast<size_t>(dim));
  for (int i = 0; i < dim; ++i)
    r.signs_[static_cast<size_t>(i)] = random_sign(seed, static_cast<uint64_t>(i));
  return r;
}

Rotation Rotation::make(RotationKind kind, int dim, uint64_t seed) {
  return kind == RotationKind::hadamard ? hadamard(dim, seed) : haar(dim, seed);
}

void Rotation::check_size(std::span<const float> in, std::span<float> out, const char* in_name,
                          const char* out_name) const {
  const size_t d = static_cast<size_t>(dim_);
  if (in.size() != d) detail::check_span_size(in_name, in.size(), d, "[dim " + std::to_string(dim_) + "]");
  if (out.size() != d) detail::check_span_size(out_name, out.size(), d, "[dim " + std::to_string(dim_) + "]");
}

namespace {

// In place: v <- H v (unnormalized Sylvester Hadamard), strides 1, 2, 4, ...
void walsh_hadamard(float* v, int dim) {
  for (int h = 1; h < dim; h *= 2)
    for (int block = 0; block < dim; block += 2 * h)
      for (int i = block; i < block + h; ++i) {
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
}

// out = in @ m for a row-major [dim][dim] m, summing i in increasing order
// (as row updates, which the compiler vectorizes over j).
void row_times_matrix(const float* in, const float* m, int dim, float* out) {
  float acc[kMaxRotationDim] = {};
  for (int i = 0; i < dim; ++i) {
    const float xi = in[i];
    const float* row = m + static_cast<size_t>(i) * static_cast<size_t>(dim);
    for (int j = 0; j < dim; ++j) acc[j] += xi * row[j];
  }
  std::copy(acc, acc + dim, out);
}

}  // namespace

void Rotation::rotate(std::span<const float> x, std::span<float> y) const {
  check_size(x, y, "x", "y");
  if (kind_ == RotationKind::haar) {
    row_times_matrix(x.data(), matrix_.data(), dim_, y.data());
    return;
  }
  float buffer[kMaxRotationDim];
  for (int i = 0; i < dim_; ++i) buffer[i] = x[static_cast<size_t>(i)] * signs_[static_cast<size_t>(i)];
  walsh_hadamard(buffer, dim_);
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim_)));
  for (int i = 0; i < dim_; ++i) y[static_cast<size_t>(i)] = buffer[i] * norm;
}

void Rotation::unrotate(std::span<const float> y, std::span<float> x) const {
  check_size(y, x, "y", "x");
  if (kind_ == RotationKind::haar) {
    row_times_matrix(y.data(), transpose_.data(), dim_, x.data());
    return;
  }
  float buffer[kMaxRotationDim];
  std::copy(y.begin(), y.end(), buffer);
  walsh_hadamard(buffer, dim_);
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim_)));
  for (int i = 0; i < dim_; ++i)
    x[static_cast<size_t>(i)] = buffer[i] * norm * signs_[static_cast<size_t>(i)];
}

std::vector<float> Rotation::dense_matrix() const {
  if (kind_ == RotationKind::haar) return matrix_;
  const size_t d = static_cast<size_t>(dim_);
  std::vector<float> m(d * d);
  const double norm = 1.0 / std::sqrt(static_cast<double>(dim_));
  for (size_t i = 0; i < d; ++i)
    for (size_t j = 0; j < d; ++j) {
      const double h = (std::popcount(i & j) % 2 == 0) ? norm : -norm;
      m[i * d + j] = static_cast<float>(signs_[i] * h);
    }
  return m;
}

}  // namespace lowbit::kv
