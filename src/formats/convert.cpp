#include "lowbit/formats/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "lowbit/core/error.h"

namespace lowbit::formats {

namespace {

// The integer zero point z with -(s*z) == m exactly, or an Error.
uint8_t zero_from_min(float s, float m, int64_t g, int64_t n, ZeroPoint target) {
  if (s == 0.0f) {
    if (m == 0.0f) return 8;
    fail(ErrorKind::invalid_argument, "invalid argument 'mins[", g, ", ", n, "]' = ", m,
         " with scale 0: the group is the constant ", m,
         ", which s*(q - z) cannot give; expected min 0 for a zero scale to convert to ",
         zero_point_name(target), " zeros");
  }
  const float zf = -m / s;
  const bool integral = zf >= 0.0f && zf <= 15.0f && std::nearbyint(zf) == zf;
  if (!integral || -(s * zf) != m)
    fail(ErrorKind::invalid_argument, "invalid argument 'mins[", g, ", ", n, "]' = ", m,
         " (scale = ", s, ", -min/scale = ", zf,
         "): expected -scale*z for an integer z in 0..15 to convert zero_point float_min to ",
         zero_point_name(target),
         " (a float zero-point layer has integer zeros only when every min is exactly -scale*z)");
  return static_cast<uint8_t>(zf);
}

}  // namespace

QuantizedLinear to_zero_point(const QuantizedLinear& layer, ZeroPoint target) {
  layer.validate();
  if (layer.zero_point == target) return layer;
  QuantizedLinear out = layer;
  out.zero_point = target;
  out.zeros.clear();
  out.mins.clear();
  const int64_t G = layer.num_groups(), N = layer.N;
  const auto gn = static_cast<size_t>(G * N);

  if (target == ZeroPoint::float_min) {
    out.mins.resize(gn);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n) out.mins[static_cast<size_t>(g * N + n)] = layer.offset(g, n);
    return out;
  }
  // Target symmetric or integer: the source's integer zeros.
  std::vector<uint8_t> zeros;
  if (layer.zero_point == ZeroPoint::symmetric) {
    zeros.assign(gn, 8);
  } else if (layer.zero_point == ZeroPoint::integer) {
    zeros = layer.zeros;
  } else {
    zeros.resize(gn);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n) {
        const auto i = static_cast<size_t>(g * N + n);
        zeros[i] = zero_from_min(f16_to_float(layer.scales[i]), layer.mins[i], g, n, target);
      }
  }
  if (target == ZeroPoint::integer) {
    out.zeros = std::move(zeros);
    return out;
  }
  for (size_t i = 0; i < gn; ++i) {
    // A zero scale makes the zero point irrelevant: any z gives w = 0.
    if (zeros[i] != 8 && f16_to_float(layer.scales[i]) != 0.0f)
      fail(ErrorKind::invalid_argument, "invalid argument 'zeros[", static_cast<int64_t>(i) / N,
           ", ", static_cast<int64_t>(i) % N, "]' = ", int(zeros[i]),
           ": expected z = 8 everywhere to convert zero_point ", zero_point_name(layer.zero_point),
           " to symmetric");
  }
  return out;
}

SortedRows sort_rows_by_group(const QuantizedLinear& layer) {
  layer.validate();
  SortedRows result;
  result.perm.resize(static_cast<size_t>(layer.K));
  std::iota(result.perm.begin(), result.perm.end(), 0);
  result.sorted = layer;
  result.sorted.g_idx.clear();
  if (layer.has_trivial_g_idx()) return result;

  const int64_t G = layer.num_groups();
  std::vector<int64_t> count(static_cast<size_t>(G), 0);
  for (int32_t g : layer.g_idx) ++count[static_cast<size_t>(g)];
  for (int64_t g = 0; g < G; ++g)
    if (count[static_cast<size_t>(g)] != layer.group_size)
      fail(ErrorKind::invalid_argument, "invalid argument 'g_idx': group ", g, " has ",
           count[static_cast<size_t>(g)], " rows: expected exactly group_size = ", layer.group_size,
           " rows in every group, so that the sorted layer has contiguous groups");
  std::stable_sort(result.perm.begin(), result.perm.end(), [&](int32_t a, int32_t b) {
    return layer.g_idx[static_cast<size_t>(a)] < layer.g_idx[static_cast<size_t>(b)];
  });
  const auto N = static_cast<size_t>(layer.N);
  for (size_t i = 0; i < result.perm.size(); ++i)
    std::memcpy(result.sorted.codes.data() + i * N,
                layer.codes.data() + static_cast<size_t>(result.perm[i]) * N, N);
  return result;
}

}  // namespace lowbit::formats
