#include "lowbit/ans/synthetic.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"

namespace lowbit::ans {

using lowbit::detail::concat;

const char* distribution_name(WeightDistribution d) {
  switch (d) {
    case WeightDistribution::gaussian: return "gaussian";
    case WeightDistribution::laplace: return "laplace";
    case WeightDistribution::student_t4: return "student-t4";
  }
  return "?";
}

std::optional<WeightDistribution> parse_distribution(std::string_view name) {
  for (auto d : {WeightDistribution::gaussian, WeightDistribution::laplace, WeightDistribution::student_t4})
    if (name == distribution_name(d)) return d;
  return std::nullopt;
}

const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::per_tensor: return "per-tensor";
    case Granularity::per_channel: return "per-channel";
    case Granularity::per_group: return "per-group";
  }
  return "?";
}

std::optional<Granularity> parse_granularity(std::string_view name) {
  for (auto g : {Granularity::per_tensor, Granularity::per_channel, Granularity::per_group})
    if (name == granularity_name(g)) return g;
  return std::nullopt;
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman & Vigna): small, fast, and good enough for weights.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return result;
  }
  // Uniform in (0, 1): 53 random bits, never exactly 0 (logs below need that).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }
  // Two independent standard normals (Box-Muller).
  std::pair<double, double> normal2() {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double a = 2.0 * std::numbers::pi * uniform();
    return {r * std::cos(a), r * std::sin(a)};
  }

 private:
  uint64_t s_[4];
};

// The stream of one row: independent of every other row and of threading.
Rng row_rng(uint64_t seed, int64_t matrix, int64_t row) {
  uint64_t s = seed;
  const uint64_t a = splitmix64(s);
  uint64_t t = a ^ (static_cast<uint64_t>(matrix) * 0xD1B54A32D192ED03ull) ^
               (static_cast<uint64_t>(row) * 0x8CB92BA72F3D8DD7ull);
  return Rng(splitmix64(t));
}

// Fills `out` with unit-variance draws of the distribution.
void fill_unit(Rng& rng, WeightDistribution d, std::span<float> out) {
  switch (d) {
    case WeightDistribution::gaussian:
      for (size_t i = 0; i < out.size(); i += 2) {
        const auto [a, b] = rng.normal2();
        out[i] = static_cast<float>(a);
        if (i + 1 < out.size()) out[i + 1] = static_cast<float>(b);
      }
      break;
    case WeightDistribution::laplace:
      // Inverse CDF with scale 1/sqrt(2) (variance 1).
      for (float& v : out) {
        const double u = rng.uniform() - 0.5;
        const double mag = -std::log(1.0 - 2.0 * std::fabs(u)) / std::numbers::sqrt2;
        v = static_cast<float>(u < 0 ? -mag : mag);
      }
      break;
    case WeightDistribution::student_t4:
      // t_4 = Z / sqrt(chi2_4 / 4) with chi2_4 = -2 log(U1 U2); variance 2, so scale by 1/sqrt(2).
      for (float& v : out) {
        const double z = rng.normal2().first;
        const double chi2 = -2.0 * std::log(rng.uniform() * rng.uniform());
        v = static_cast<float>(z / std::sqrt(chi2 / 4.0) / std::numbers::sqrt2);
      }
      break;
  }
}

int8_t quantize_one(float w, double scale, int qmax) {
  const double q = std::nearbyint(static_cast<double>(w) / scale);
  return static_cast<int8_t>(std::clamp(q, static_cast<double>(-qmax), static_cast<double>(qmax)));
}

}  // namespace

Int8Matrix quantize_symmetric(std::span<const float> w, int64_t rows, int64_t cols, int bits, Granularity granularity,
                              int64_t group_size) {
  LOWBIT_CHECK_ARG(bits == 8 || bits == 4, "bits", bits, "8 or 4");
  LOWBIT_CHECK_ARG(rows >= 1 && cols >= 1, "shape", concat(rows, " x ", cols), "positive extents");
  LOWBIT_CHECK_ARG(static_cast<int64_t>(w.size()) == rows * cols, "w.size()", w.size(),
                   concat("rows * cols = ", rows * cols));
  LOWBIT_CHECK_ARG(granularity != Granularity::per_group || group_size >= 1, "group_size", group_size, ">= 1");
  for (size_t i = 0; i < w.size(); ++i)
    if (!std::isfinite(w[i])) fail_argument(concat("w[", i, "]"), w[i], "a finite weight");
  const int qmax = (1 << (bits - 1)) - 1;
  Int8Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(w.size());
  auto scale_of = [&](int64_t begin, int64_t end) {  // absmax / qmax over w[begin, end)
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(w[static_cast<size_t>(i)]));
    return amax == 0.0f ? 1.0 : static_cast<double>(amax) / qmax;
  };
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / cols);
  switch (granularity) {
    case Granularity::per_tensor: {
      const double scale = scale_of(0, rows * cols);
      m.delta = static_cast<float>(scale);
      parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0 * cols; i < r1 * cols; ++i)
          m.data[static_cast<size_t>(i)] = quantize_one(w[static_cast<size_t>(i)], scale, qmax);
      });
      break;
    }
    case Granularity::per_channel:
      m.scale_kind = ScaleKind::per_row;
      m.scales.resize(static_cast<size_t>(rows));
      parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const double scale = scale_of(r * cols, (r + 1) * cols);
          m.scales[static_cast<size_t>(r)] = static_cast<float>(scale);
          for (int64_t i = r * cols; i < (r + 1) * cols; ++i)
            m.data[static_cast<size_t>(i)] = quantize_one(w[static_cast<size_t>(i)], scale, qmax);
        }
      });
      break;
    case Granularity::per_group: {
      m.scale_kind = ScaleKind::per_group;
      m.group_size = group_size;
      const int64_t groups = (cols + group_size - 1) / group_size;
      m.scales.resize(static_cast<size_t>(rows * groups));
      parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t begin = r * cols + g * group_size, end = r * cols + std::min(cols, (g + 1) * group_size);
            const double scale = scale_of(begin, end);
            m.scales[static_cast<size_t>(r * groups + g)] = static_cast<float>(scale);
            for (int64_t i = begin; i < end; ++i)
              m.data[static_cast<size_t>(i)] = quantize_one(w[static_cast<size_t>(i)], scale, qmax);
          }
      });
      break;
    }
  }
  return m;
}

std::vector<float> synthetic_weights(const SyntheticOptions& o, int64_t index) {
  LOWBIT_CHECK_ARG(o.dim >= 1 && o.dim <= (int64_t{1} << 20), "dim", o.dim, "1..2^20");
  const int64_t n = o.dim;
  std::vector<float> w(static_cast<size_t>(n * n));
  const float sigma = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 15) / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      Rng rng = row_rng(o.seed, index, r);
      const std::span<float> row(w.data() + r * n, static_cast<size_t>(n));
      fill_unit(rng, o.distribution, row);
      for (float& v : row) v *= sigma;
    }
  });
  return w;
}

Chain make_synthetic_chain(const SyntheticOptions& o) {
  LOWBIT_CHECK_ARG(o.layers >= 0 && o.layers <= 100000, "layers", o.layers, "0..100000");
  LOWBIT_CHECK_ARG(o.dim >= 1 && o.dim <= (int64_t{1} << 20), "dim", o.dim, "1..2^20");
  Chain chain;
  chain.v0.resize(static_cast<size_t>(o.dim));
  {
    Rng rng = row_rng(o.seed, -1, 0);  // matrix index -1: the vector's own stream
    for (auto& v : chain.v0)
      v = static_cast<int8_t>(std::clamp(std::nearbyint(rng.normal2().first), -127.0, 127.0));
  }
  for (int64_t k = 0; k < o.layers; ++k) {
    const std::vector<float> w = synthetic_weights(o, k);
    chain.matrices.push_back(quantize_symmetric(w, o.dim, o.dim, o.bits, o.granularity, o.group_size));
  }
  chain.result_hash = fxhash32(run_chain_reference(chain));
  return chain;
}

}  // namespace lowbit::ans
