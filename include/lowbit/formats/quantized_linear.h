// The ONE canonical in-memory description of a 4-bit linear layer
//
//     y[M, N] = x[M, K] * W[K, N]      K = in_features, N = out_features
//
// Every packed layout (GPTQ, AWQ, lowbit's float zero-point layout, GGUF Q4_1,
// GPU tiled layouts) converts to and from this struct; it is plain data and
// deliberately unpacked (one byte per code) so that it is easy to reason about.
//
// Layout facts this header relies on:
//  - codes  : uint8 [K, N] row-major (index k*N + n), values 0..15.
//  - scales : f16   [G, N] row-major (index g*N + n), G = num_groups().
//  - zeros  : uint8 [G, N], values 0..15, present only for ZeroPoint::integer.
//  - mins   : float [G, N], present only for ZeroPoint::float_min.
//  - g_idx  : int32 [K], the group of each row k (act-order / desc_act
//             checkpoints); empty means the trivial map k / group_size
//             (0 for per-channel). Values lie in 0..G-1.
//  - G = K / group_size, or 1 when group_size == -1 (per channel).
//  - group_size is one of 32, 64, 128, 256 or -1; K is a positive multiple of
//    8 and of group_size; N is positive. (Layouts that pack along N — GPTQ
//    qzeros, AWQ — additionally need N % 8 == 0; they check it themselves.)
//
// Dequantization, identical for every convention (s = float(scales[g, n])):
//     symmetric : w = s*(q - 8)             stored as  w = s*q + m, m = -(s*8)
//     integer   : w = s*(q - z)             stored as  w = s*q + m, m = -(s*z)
//     float_min : w = s*q + m,  m = mins[g, n]
// evaluated in fp32 exactly as `s*q + m`. Because s is an f16 (11 significant
// bits) and q, z <= 15 (4 bits), s*q and s*z are exact in fp32, so the result
// has a single rounding: it equals fmaf(s, q, m), and for symmetric/integer it
// is the exact value s*(q - z) (no rounding at all). Hence an integer layer and
// its float_min conversion (m = -s*z) dequantize to the same bits, and a GPU
// kernel computing fma(s, q, m) or (q - z)*s in fp32 matches dequant() exactly
// (up to the sign of a zero result, for negative scales).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/half.h"

namespace lowbit::formats {

enum class ZeroPoint : uint8_t {
  symmetric,  // w = s*(q - 8); no zeros stored
  integer,    // w = s*(q - z), z in 0..15 per group and column
  float_min,  // w = s*q + m: "scale and min" as GGUF Q4_1, HQQ (m = -z*s) and tinygemm store it
};

// "symmetric", "integer", "float_min".
const char* zero_point_name(ZeroPoint zp);
std::optional<ZeroPoint> parse_zero_point(std::string_view name);

// The group sizes lowbit supports: 32, 64, 128, 256 and -1 (per channel).
inline constexpr int kSupportedGroupSizes[] = {32, 64, 128, 256, -1};
bool is_supported_group_size(int group_size);

struct QuantizedLinear {
  int64_t K = 0;  // in_features
  int64_t N = 0;  // out_features
  int group_size = 128;  // 32, 64, 128, 256, or -1 = per channel
  ZeroPoint zero_point = ZeroPoint::integer;
  std::vector<uint8_t> codes;    // [K, N] row-major, 0..15
  std::vector<f16> scales;       // [G, N]
  std::vector<uint8_t> zeros;    // [G, N] when integer, else empty
  std::vector<float> mins;       // [G, N] when float_min, else empty
  std::vector<int32_t> g_idx;    // [K] act-order group of each row; empty = k / group_size

  // A layer of the given shape with every field sized for `zero_point` and
  // zero-filled (g_idx empty). Checks K, N and group_size like validate().
  static QuantizedLinear allocate(int64_t K, int64_t N, int group_size, ZeroPoint zero_point);

  // G: K / group_size, or 1 for per channel.
  int64_t num_groups() const;
  // The group of row k: g_idx[k] when g_idx is set, else k / group_size.
  int64_t group_of(int64_t k) const;
  // True when g_idx is empty or equal to k / group_size for every k.
  bool has_trivial_g_idx() const;
  // The offset m of group g, column n in `w = s*q + m` (see the top of this file).
  float offset(int64_t g, int64_t n) const;
  // The fp32 weight W[k, n] (no bounds checks; call validate() first).
  float dequant(int64_t k, int64_t n) const;

  // Throws Error naming the field, its value and what was expected:
  //  - ErrorKind::invalid_argument for shape/parameter problems: K, N,
  //    group_size, the size of each vector, fields present that the zero
  //    point convention does not use (zeros for symmetric, mins for integer...).
  //  - ErrorKind::format for bad contents: a code or zero above 15, a g_idx
  //    entry outside 0..G-1, a non-finite scale or min.
  void validate() const;

  // "K=4096 N=11008 group_size=128 zero_point=integer act_order=no".
  std::string describe() const;

  bool operator==(const QuantizedLinear&) const = default;
};

}  // namespace lowbit::formats
