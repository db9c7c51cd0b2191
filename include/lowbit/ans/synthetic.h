// Synthetic weights for the seed's experiment and for compression studies.
//
// Facts this header relies on:
//   * the seed's data (MATVANS report section 2, create_matfiles.py): K square
//     N x N matrices with w ~ Normal(0, sigma = 1/sqrt(N)) (the report writes
//     N(0, 1/sqrt(N_k)); its code uses 1/sqrt(N) as the standard deviation),
//     quantized per tensor: delta = max|w| / 127, code = round_half_even(w / delta);
//     v_0 = round_half_even(Normal(0, 1)) as int8;
//   * symmetric absmax quantization at b bits: qmax = 2^(b-1) - 1 (127 or 7),
//     scale = max|w| / qmax over the tensor, each row (per channel, an output
//     channel is a row here) or each group of `group_size` consecutive columns
//     of a row; code = clamp(round_half_even(w / scale), -qmax, qmax); an
//     all-zero block gets scale 1;
//   * randomness: our own generators (splitmix64-seeded xoshiro256**, Box-Muller
//     in double), so a seed gives the same weights on every platform with the
//     same libm; each row has its own stream (seeded from the seed, the matrix
//     and the row), so the result does not depend on the thread count. numpy's
//     streams are not reproduced: the seed's own files are read, not remade.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "lowbit/ans/chain.h"

namespace lowbit::ans {

enum class WeightDistribution : uint8_t { gaussian, laplace, student_t4 };
const char* distribution_name(WeightDistribution d);  // "gaussian", "laplace", "student-t4"
std::optional<WeightDistribution> parse_distribution(std::string_view name);

enum class Granularity : uint8_t { per_tensor, per_channel, per_group };
const char* granularity_name(Granularity g);  // "per-tensor", "per-channel", "per-group"
std::optional<Granularity> parse_granularity(std::string_view name);

struct SyntheticOptions {
  int64_t layers = 20;  // K
  int64_t dim = 4096;   // N: every matrix is N x N, v_0 has N entries
  uint64_t seed = 20250310;
  WeightDistribution distribution = WeightDistribution::gaussian;  // unit-variance shape, scaled by 1/sqrt(N)
  int bits = 8;                                  // 8 or 4
  Granularity granularity = Granularity::per_tensor;
  int64_t group_size = 128;                      // per_group only
};

// Quantizes row-major float weights [rows, cols]. per_tensor stores the scale
// as the matrix's delta (ScaleKind::none); per_channel and per_group store
// per-row / per-group scales (delta 1). Throws Error(invalid_argument) naming a
// bad argument (bits not 4 or 8, group_size < 1, size mismatch, non-finite weight).
Int8Matrix quantize_symmetric(std::span<const float> w, int64_t rows, int64_t cols, int bits,
                              Granularity granularity, int64_t group_size = 128);

// The seed's experiment with the options' distribution and quantization; the
// defaults are the seed's data (Gaussian, per tensor, 8 bits). The chain's
// result_hash is computed. Multithreaded.
Chain make_synthetic_chain(const SyntheticOptions& options);

// One N x N float matrix of the chain (matrix `index`), before quantization.
std::vector<float> synthetic_weights(const SyntheticOptions& options, int64_t index);

}  // namespace lowbit::ans
