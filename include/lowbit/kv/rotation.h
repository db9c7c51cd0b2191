// Random orthogonal rotations of K/V head vectors, applied before scalar
// quantization so that every coordinate of a unit vector follows the same
// known distribution (codebook.h), whatever outlier channels the model has.
//
// Conventions (shared with the GPU kernels; vectors are rows, as in PyTorch):
//  - A rotation is a d x d orthogonal matrix M, stored row-major fp32.
//    rotate:   y = x @ M      (y_j = sum_i x_i M[i][j])
//    unrotate: x = y @ M^T    (x_i = sum_j y_j M[i][j])
//    so a batch of n rows is one [n, d] x [d, d] GEMM with M (or M^T) as the
//    row-major B operand. Attention needs no unrotation of keys at all:
//    q . k = (q @ M) . (k @ M), and sum_t p_t (v_t @ M) = (sum_t p_t v_t) @ M.
//  - haar: M = Q * diag(sign(diag(R))) where G = Q R is the Householder QR of
//    the d x d Gaussian matrix G[i][j] = random_normal(seed, i*d + j)
//    (counter_rng.h), computed in double and rounded to fp32 once. The sign
//    fix makes R's diagonal positive, which makes Q unique and Haar-distributed
//    (without it, the QR routine's own sign convention biases the result).
//    Built on the host (O(d^3), ~6 Mflop at d = 128) and uploaded to a device.
//  - hadamard: M = diag(s) H / sqrt(d), H the Sylvester Hadamard matrix
//    (H[i][j] = (-1)^popcount(i & j)), s_i = random_sign(seed, i). rotate is
//    the fast Walsh-Hadamard transform of x * s, O(d log d), scaled by
//    1/sqrt(d); the butterflies run with strides 1, 2, 4, ... d/2, each
//    a' = a + b, b' = a - b in fp32. Needs d a power of two. It only
//    approximates a Haar rotation (coordinates are close to, not exactly, the
//    sphere marginal), which costs a little MSE on adversarial inputs.
//  - One rotation per layer, shared by K and V and by every KV head of the
//    layer. Seed scheme: layer l uses seed_base + 1000 * l, seed_base 42 by
//    default (the scheme of the TurboQuant NPU design this follows). Our
//    generator is splitmix64 + Box-Muller, not torch's, so the matrices differ
//    from torch.Generator().manual_seed(42 + 1000 * l) ones; only the scheme is shared.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace lowbit::kv {

enum class RotationKind : uint8_t { haar, hadamard };
const char* rotation_kind_name(RotationKind kind);  // "haar", "hadamard"
std::optional<RotationKind> parse_rotation_kind(std::string_view name);

inline constexpr uint64_t kDefaultRotationSeedBase = 42;
inline constexpr uint64_t kRotationSeedLayerStride = 1000;
inline constexpr int kMaxRotationDim = 1024;

constexpr uint64_t layer_rotation_seed(uint64_t seed_base, int layer) {
  return seed_base + kRotationSeedLayerStride * static_cast<uint64_t>(layer);
}

// The Gaussian matrix the haar rotation starts from, row-major [dim][dim], double.
std::vector<double> gaussian_matrix(int dim, uint64_t seed);

// Q * diag(sign(diag(R))) of the Householder QR G = Q R of gaussian_matrix(dim, seed),
// row-major [dim][dim], double (before the fp32 rounding that Rotation::haar applies).
std::vector<double> haar_orthogonal(int dim, uint64_t seed);

class Rotation {
 public:
  // dim in [1, 1024]; hadamard also needs a power of two. Throws
  // Error(invalid_argument) naming 'dim'.
  static Rotation haar(int dim, uint64_t seed);
  static Rotation hadamard(int dim, uint64_t seed);
  static Rotation make(RotationKind kind, int dim, uint64_t seed);

  RotationKind kind() const { return kind_; }
  int dim() const { return dim_; }
  uint64_t seed() const { return seed_; }

  // y = x @ M and x = y @ M^T, in fp32, for spans of dim() floats (they may be
  // the same span). Throws Error(invalid_argument) on a wrong size.
  void rotate(std::span<const float> x, std::span<float> y) const;
  void unrotate(std::span<const float> y, std::span<float> x) const;

  // M as a dense row-major [dim][dim] fp32 matrix (for hadamard: s_i H[i][j] / sqrt(d)).
  std::vector<float> dense_matrix() const;
  // The random signs s of a hadamard rotation (empty for haar).
  std::span<const float> signs() const { return signs_; }

 private:
  Rotation(RotationKind kind, int dim, uint64_t seed) : kind_(kind), dim_(dim), seed_(seed) {}
  void check_size(std::span<const float> in, std::span<float> out, const char* in_name,
                  const char* out_name) const;

  RotationKind kind_;
  int dim_;
  uint64_t seed_;
  std::vector<float> matrix_;     // haar: M, row-major
  std::vector<float> transpose_;  // haar: M^T, row-major (unrotate runs as row updates too)
  std::vector<float> signs_;      // hadamard: s
};

}  // namespace lowbit::kv
