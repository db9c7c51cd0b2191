// Round-to-nearest (min-max) 4-bit quantizer, following AutoGPTQ's RTN
// semantics (gptq Quantizer.find_params + quantize) so that our checkpoints
// look like theirs, except that the scale is rounded to f16 FIRST and the
// codes are computed with that stored scale.
//
// Layout facts this header relies on:
//  - weight is a 2-D f32/f16/bf16 CPU view with any strides:
//      WeightOrientation::out_in : [N, K], as torch.nn.Linear.weight
//      WeightOrientation::in_out : [K, N]
//  - the result is a QuantizedLinear (quantized_linear.h): codes [K, N],
//    scales f16 [G, N], zeros [G, N] or mins f32 [G, N], g_idx empty; group g of
//    column n holds rows g*group_size .. (g+1)*group_size - 1 (all K for -1).
//
// Per group and column (w the group's weights, all arithmetic in fp32;
// round() is round-half-to-even, like torch.round):
//   symmetric : amax = max|w|, s = 2*amax/15, z = 8
//   integer   : xmin = min(min w, 0), xmax = max(max w, 0), s = (xmax - xmin)/15,
//               s rounded to f16, z = round(-xmin/s) clamped to [min_zero, 15];
//               when min_zero = 1 forces z up from 0, s = xmax/14 instead (so
//               the range still fits: then -xmin < xmax/29 < s).
//   float_min : m = min w (rounded DOWN to f16 when f16_mins, so m <= min w),
//               s = (max w - m)/15
//   degenerate: when s is 0 or rounds to 0 in f16 (an all-zero or constant
//               group, or a range below f16's smallest subnormal), s = 1.
//   then s is rounded to f16 and, with that stored s,
//   q = clamp(round(w/s) + z, 0, 15)     (float_min: q = clamp(round((w - m)/s), 0, 15))
//
// Error bound, with s the STORED scale: |w - dequant| <= s/2 + slack for every
// mode. The grid s*(j - z), j = 0..15, is the exact range [xmin, xmax] shifted
// by at most s/2 (z rounding), so the nearest grid point of any w in the range
// is within s/2 (the often quoted "<= s" for asymmetric is loose). slack comes
// from rounding s to f16 (relative 2^-11): the top of the range may exceed the
// grid by 15*|s_exact - s| <= 15*2^-11*s/(1 - 2^-11) < 2^-7*s (subnormal f16
// scales: 15*2^-25 absolute), plus fp32 rounding of w/s (a tie may round
// either way). A scale above f16's 65504 (a group range beyond ~982,000,
// or |w| beyond ~491,000 when symmetric) throws.
#pragma once

#include <cstdint>

#include "lowbit/core/tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats {

enum class WeightOrientation : uint8_t {
  out_in,  // [N, K], as torch.nn.Linear.weight
  in_out,  // [K, N]
};

struct RtnOptions {
  int group_size = 128;                       // 32, 64, 128, 256 or -1
  ZeroPoint zero_point = ZeroPoint::integer;
  int min_zero = 0;       // integer only: 0, or 1 for GPTQ v1 targets (v1 cannot store z = 0)
  bool f16_mins = false;  // float_min only: round m down to f16 (for Q4_1 and f16-mins targets)
};

// Quantizes `weight` (multithreaded over columns). Throws Error(invalid_argument)
// naming the argument for a bad rank/dtype/device/shape/option, and for a
// non-finite weight (naming its index) or a group whose scale overflows f16.
QuantizedLinear quantize_rtn(const TensorView& weight, WeightOrientation orientation,
                             const RtnOptions& options = {});

}  // namespace lowbit::formats
