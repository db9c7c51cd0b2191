// Random QuantizedLinear layers for the format and W4A16 tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "lowbit/core/half.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::test {

// The zero-point data a random layer gets.
enum class ZeroKind {
  sym,            // ZeroPoint::symmetric
  asym,           // ZeroPoint::integer, z in 0..15 with at least one z = 0 (not GPTQ v1-able)
  asym_v1,        // ZeroPoint::integer, z in 1..15 (fits GPTQ v1)
  float_min_f16,  // ZeroPoint::float_min, mins exact in f16 but not -s*z
  float_min_f32,  // ZeroPoint::float_min, mins not exact in f16
};

inline const char* zero_kind_name(ZeroKind k) {
  switch (k) {
    case ZeroKind::sym: return "sym";
    case ZeroKind::asym: return "asym";
    case ZeroKind::asym_v1: return "asym_v1";
    case ZeroKind::float_min_f16: return "float_min_f16";
    case ZeroKind::float_min_f32: return "float_min_f32";
  }
  return "?";
}

inline constexpr ZeroKind kAllZeroKinds[] = {ZeroKind::sym, ZeroKind::asym, ZeroKind::asym_v1,
                                             ZeroKind::float_min_f16, ZeroKind::float_min_f32};

// A random f16 scale with 7 significant bits in [2^-10, 2^-3): then s*z
// (z <= 15) fits 11 bits and stays normal, so m = -s*z is exact in f16 too.
inline f16 random_scale(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> exponent(-10, -4), mantissa(64, 127);
  return float_to_f16(std::ldexp(static_cast<float>(mantissa(rng)), exponent(rng) - 6));
}

// A permutation of the trivial g_idx (k / group_size): every group keeps
// exactly group_size rows, as GPTQ act-order produces.
inline std::vector<int32_t> random_act_order(int64_t K, int group_size, std::mt19937_64& rng) {
  std::vector<int32_t> g_idx(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k)
    g_idx[static_cast<size_t>(k)] = static_cast<int32_t>(group_size > 0 ? k / group_size : 0);
  std::shuffle(g_idx.begin(), g_idx.end(), rng);
  return g_idx;
}

inline formats::QuantizedLinear random_layer(int64_t K, int64_t N, int group_size, ZeroKind kind,
                                             uint64_t seed, bool act_order = false) {
  using formats::ZeroPoint;
  std::mt19937_64 rng(seed);
  const ZeroPoint zp = kind == ZeroKind::sym                                     ? ZeroPoint::symmetric
                       : (kind == ZeroKind::asym || kind == ZeroKind::asym_v1) ? ZeroPoint::integer
                                                                                 : ZeroPoint::float_min;
  formats::QuantizedLinear q = formats::QuantizedLinear::allocate(K, N, group_size, zp);
  std::uniform_int_distribution<int> code(0, 15);
  for (auto& c : q.codes) c = static_cast<uint8_t>(code(rng));
  for (auto& s : q.scales) s = random_scale(rng);
  if (kind == ZeroKind::asym || kind == ZeroKind::asym_v1) {
    std::uniform_int_distribution<int> zero(kind == ZeroKind::asym ? 0 : 1, 15);
    for (auto& z : q.zeros) z = static_cast<uint8_t>(zero(rng));
    if (kind == ZeroKind::asym) q.zeros[q.zeros.size() / 2] = 0;
  }
  if (zp == ZeroPoint::float_min) {
    std::uniform_real_distribution<float> min(-0.5f, 0.25f);
    for (auto& m : q.mins) {
      m = min(rng);
      if (kind == ZeroKind::float_min_f16) {
        m = f16_to_float(float_to_f16(m));
      } else if (f16_to_float(float_to_f16(m)) == m) {
        m = std::nextafter(m, 1.0f);  // make sure it is not exact in f16
      }
    }
  }
  if (act_order) {
    q.g_idx = random_act_order(K, group_size, rng);
    if (q.has_trivial_g_idx()) q.g_idx.clear();  // canonical form (one group: nothing to permute)
  }
  return q;
}

}  // namespace lowbit::test

namespace lowbit::formats {
// GoogleTest prints a QuantizedLinear as its description instead of raw bytes.
inline void PrintTo(const QuantizedLinear& q, std::ostream* out) { *out << q.describe(); }
}  // namespace lowbit::formats
