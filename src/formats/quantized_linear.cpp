#include "lowbit/formats/quantized_linear.h"

#include <cmath>
#include <sstream>

#include "lowbit/core/error.h"

namespace lowbit::formats {

const char* zero_point_name(ZeroPoint zp) {
  switch (zp) {
    case ZeroPoint::symmetric: return "symmetric";
    case ZeroPoint::integer: return "integer";
    case ZeroPoint::float_min: return "float_min";
  }
  return "?";
}

std::optional<ZeroPoint> parse_zero_point(std::string_view name) {
  for (ZeroPoint zp : {ZeroPoint::symmetric, ZeroPoint::integer, ZeroPoint::float_min})
    if (name == zero_point_name(zp)) return zp;
  return std::nullopt;
}

bool is_supported_group_size(int group_size) {
  for (int g : kSupportedGroupSizes)
    if (g == group_size) return true;
  return false;
}

namespace {

// The checks on K, N and group_size shared by allocate() and validate().
void check_shape(int64_t K, int64_t N, int group_size) {
  LOWBIT_CHECK_ARG(is_supported_group_size(group_size), "group_size", group_size,
                   "one of 32, 64, 128, 256, or -1 (per channel)");
  LOWBIT_CHECK_ARG(K > 0 && K % 8 == 0, "K", K,
                   "a positive multiple of 8 (K = in_features; codes pack 8 per 32-bit word)");
  if (group_size > 0 && K % group_size != 0)
    fail(ErrorKind::invalid_argument, "invalid argument 'K' = ", K, ": K is not a multiple of ",
         "group_size = ", group_size, " (", K % group_size,
         " rows left over); expected K to be a multiple of the group size");
  LOWBIT_CHECK_ARG(N > 0, "N", N, "a positive number of output features");
}

void check_size(const char* field, size_t actual, int64_t expected, const char* what) {
  if (static_cast<int64_t>(actual) != expected)
    fail(ErrorKind::invalid_argument, "invalid argument '", field, "' has ", actual,
         " elements: expected ", expected, " (", what, ")");
}

}  // namespace

QuantizedLinear QuantizedLinear::allocate(int64_t K, int64_t N, int group_size,
                                          ZeroPoint zero_point) {
  check_shape(K, N, group_size);
  QuantizedLinear q;
  q.K = K;
  q.N = N;
  q.group_size = group_size;
  q.zero_point = zero_point;
  const auto gn = static_cast<size_t>(q.num_groups() * N);
  q.codes.assign(static_cast<size_t>(K * N), 0);
  q.scales.assign(gn, f16{});
  if (zero_point == ZeroPoint::integer) q.zeros.assign(gn, 0);
  if (zero_point == ZeroPoint::float_min) q.mins.assign(gn, 0.0f);
  return q;
}

int64_t QuantizedLinear::num_groups() const { return group_size > 0 ? K / group_size : 1; }

int64_t QuantizedLinear::group_of(int64_t k) const {
  if (!g_idx.empty()) return g_idx[static_cast<size_t>(k)];
  return group_size > 0 ? k / group_size : 0;
}

bool QuantizedLinear::has_trivial_g_idx() const {
  if (g_idx.empty()) return true;
  for (int64_t k = 0; k < static_cast<int64_t>(g_idx.size()); ++k)
    if (g_idx[static_cast<size_t>(k)] != (group_size > 0 ? k / group_size : 0)) return false;
  return true;
}

float QuantizedLinear::offset(int64_t g, int64_t n) const {
  const auto i = static_cast<size_t>(g * N + n);
  const float s = f16_to_float(scales[i]);
  switch (zero_point) {
    case ZeroPoint::symmetric: return -(s * 8.0f);
    case ZeroPoint::integer: return -(s * static_cast<float>(zeros[i]));
    case ZeroPoint::float_min: return mins[i];
  }
  return 0.0f;
}

float QuantizedLinear::dequant(int64_t k, int64_t n) const {
  const int64_t g = group_of(k);
  const float s = f16_to_float(scales[static_cast<size_t>(g * N + n)]);
  const float q = static_cast<float>(codes[static_cast<size_t>(k * N + n)]);
  return s * q + offset(g, n);
}

void QuantizedLinear::validate() const {
  check_shape(K, N, group_size);
  const int64_t G = num_groups();
  check_size("codes", codes.size(), K * N, "[K, N] row-major");
  check_size("scales", scales.size(), G * N, "[G, N], G = K / group_size or 1 per channel");
  if (zero_point == ZeroPoint::integer)
    check_size("zeros", zeros.size(), G * N, "[G, N] for zero_point = integer");
  else
    check_size("zeros", zeros.size(), 0,
               zero_point == ZeroPoint::symmetric ? "none for zero_point = symmetric (z = 8)"
                                                  : "none for zero_point = float_min (use mins)");
  if (zero_point == ZeroPoint::float_min)
    check_size("mins", mins.size(), G * N, "[G, N] for zero_point = float_min");
  else
    check_size("mins", mins.size(), 0, "none unless zero_point = float_min");
  if (!g_idx.empty()) check_size("g_idx", g_idx.size(), K, "[K], or empty for k / group_size");

  for (size_t i = 0; i < codes.size(); ++i)
    if (codes[i] > 15)
      fail(ErrorKind::format, "invalid codes[", i / static_cast<size_t>(N), ", ",
           i % static_cast<size_t>(N), "] = ", int(codes[i]), ": expected a 4-bit code 0..15");
  for (size_t i = 0; i < zeros.size(); ++i)
    if (zeros[i] > 15)
      fail(ErrorKind::format, "invalid zeros[", i / static_cast<size_t>(N), ", ",
           i % static_cast<size_t>(N), "] = ", int(zeros[i]), ": expected a zero point 0..15");
  for (size_t i = 0; i < scales.size(); ++i)
    if (!std::isfinite(f16_to_float(scales[i])))
      fail(ErrorKind::format, "invalid scales[", i / static_cast<size_t>(N), ", ",
           i % static_cast<size_t>(N), "] = ", f16_to_float(scales[i]),
           ": expected a finite scale");
  for (size_t i = 0; i < mins.size(); ++i)
    if (!std::isfinite(mins[i]))
      fail(ErrorKind::format, "invalid mins[", i / static_cast<size_t>(N), ", ",
           i % static_cast<size_t>(N), "] = ", mins[i], ": expected a finite min");
  for (size_t k = 0; k < g_idx.size(); ++k)
    if (g_idx[k] < 0 || g_idx[k] >= G)
      fail(ErrorKind::format, "invalid g_idx[", k, "] = ", g_idx[k], ": expected a group 0..",
           G - 1, " (G = ", G, " groups for K = ", K, ", group_size = ", group_size, ")");
}

std::string QuantizedLinear::describe() const {
  std::ostringstream out;
  out << "K=" << K << " N=" << N << " group_size=" << group_size
      << " zero_point=" << zero_point_name(zero_point)
      << " act_order=" << (has_trivial_g_idx() ? "no" : "yes");
  return out.str();
}

}  // namespace lowbit::formats
