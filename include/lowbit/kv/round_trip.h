// Measured quality of the vector quantizer on random vectors: what
// `lowbit kv roundtrip` prints, so a user can check a configuration (bits,
// rotation, scale dtype, renormalization) against the Lloyd-Max theory.
//
// Data: vector i (i = 0 .. n-1) has coordinates x[j] = random_normal(seed,
// i*dim + j) (counter_rng.h): an isotropic Gaussian, so its direction is
// uniform on the sphere and its norm varies (~sqrt(dim)); the query paired
// with it is y[j] = random_normal(seed, (n + i)*dim + j). The rotation is the
// layer-0 rotation of seed_base (rotation.h). Sums run over fixed blocks of
// vectors and are added in block order: the result does not depend on the
// number of threads.
#pragma once

#include <cstdint>

#include "lowbit/kv/rotation.h"
#include "lowbit/kv/vector_quantizer.h"

namespace lowbit::kv {

struct RoundTripOptions {
  int bits = 4;
  int dim = 128;
  int64_t n = 10000;  // vectors, 1 to 10,000,000
  uint64_t seed = 0;
  RotationKind rotation = RotationKind::haar;
  uint64_t rotation_seed_base = kDefaultRotationSeedBase;
  QuantizerOptions quantizer;
};

struct RoundTripReport {
  double relative_mse = 0;  // mean of ||x - x~||^2 / ||x||^2
  double theory_mse = 0;    // the codebook's expected unit-vector MSE (Lloyd-Max, no rounding)
  double cosine_mean = 0;   // mean of cos(x, x~)
  double cosine_min = 0;
  double ip_rmse = 0;            // sqrt(mean of ((<y, x~> - <y, x>) / (||y|| ||x||))^2)
  double ip_bias = 0;            // mean of (<y, x~> - <y, x>) / (||y|| ||x||)
  double ip_rmse_theory = 0;     // sqrt(theory_mse / dim): an isotropic error of that size
  int64_t bytes_per_vector = 0;  // packed indices + scale
  int64_t code_bytes = 0, scale_bytes = 0;
};

// Throws Error(invalid_argument) naming 'bits', 'dim' or 'n'.
RoundTripReport measure_round_trip(const RoundTripOptions& options);

}  // namespace lowbit::kv
