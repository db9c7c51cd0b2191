#include "lowbit/formats/rtn.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/parallel.h"

namespace lowbit::formats {

namespace {

// The element (k, n) of the weight in its own index order, for messages.
struct WeightIndex {
  WeightOrientation orientation;
  void print_to(std::ostream& out, int64_t k, int64_t n) const {
    if (orientation == WeightOrientation::out_in)
      out << "weight[" << n << ", " << k << "] (out_in [N, K])";
    else
      out << "weight[" << k << ", " << n << "] (in_out [K, N])";
  }
};

// The stored (f16) scale for an exact scale s; degenerate scales become 1.
f16 stored_scale(float s, int64_t g, int64_t n) {
  if (!(s > 0.0f)) return float_to_f16(1.0f);
  const f16 h = float_to_f16(s);
  const float back = f16_to_float(h);
  if (std::isinf(back))
    fail(ErrorKind::invalid_argument, "invalid argument 'weight': group ", g, " of column ", n,
         " needs a scale of ", s,
         ", beyond f16's largest finite value 65504; expected a group range below 15 * 65504 (|w| below ~491,000 when symmetric)");
  if (back == 0.0f) return float_to_f16(1.0f);  // below f16's smallest subnormal
  return h;
}

// The largest f16 value <= m.
f16 f16_round_down(float m, int64_t g, int64_t n) {
  f16 h = float_to_f16(m);
  if (f16_to_float(h) > m) {
    if (h.bits & 0x8000u)
      h.bits = static_cast<uint16_t>(h.bits + 1);
    else if (h.bits == 0)
      h.bits = 0x8001u;
    else
      h.bits = static_cast<uint16_t>(h.bits - 1);
  }
  if (std::isinf(f16_to_float(h)))
    fail(ErrorKind::invalid_argument, "invalid argument 'weight': group ", g, " of column ", n,
         " has min ", m, ", beyond f16's range, but f16_mins asks for an f16 min; expected "
         "|min| <= 65504 (or f16_mins = false)");
  return h;
}

uint8_t clamp_code(float v) { return static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f)); }

template <typename T>
void quantize_columns(const T* base, int64_t stride_k, int64_t stride_n, WeightIndex where,
                      const RtnOptions& o, QuantizedLinear& q, int64_t n0, int64_t n1) {
  const int64_t K = q.K, N = q.N, G = q.num_groups();
  const int64_t rows = K / G;
  std::vector<float> w(static_cast<size_t>(rows));
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * rows;
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t r = 0; r < rows; ++r) {
        const float v = to_float(base[(k0 + r) * stride_k + n * stride_n]);
        if (!std::isfinite(v)) {
          std::ostringstream index;
          where.print_to(index, k0 + r, n);
          fail(ErrorKind::invalid_argument, "invalid argument 'weight': ", index.str(), " = ", v,
               ": expected finite weights");
        }
        w[static_cast<size_t>(r)] = v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      const auto gi = static_cast<size_t>(g * N + n);
      uint8_t* codes = q.codes.data() + k0 * N + n;
      if (o.zero_point == ZeroPoint::symmetric) {
        const float amax = std::max(std::fabs(lo), std::fabs(hi));
        const f16 sh = stored_scale(2.0f * amax / 15.0f, g, n);
        const float s = f16_to_float(sh);
        q.scales[gi] = sh;
        for (int64_t r = 0; r < rows; ++r)
          codes[r * N] = clamp_code(std::nearbyint(w[static_cast<size_t>(r)] / s) + 8.0f);
      } else if (o.zero_point == ZeroPoint::integer) {
        const float xmin = std::min(lo, 0.0f), xmax = std::max(hi, 0.0f);
        f16 sh = stored_scale((xmax - xmin) / 15.0f, g, n);
        float s = f16_to_float(sh);
        float z = std::clamp(std::nearbyint(-xmin / s), 0.0f, 15.0f);
        if (z < static_cast<float>(o.min_zero)) {  // min_zero = 1 forces z = 1: widen the top
          z = static_cast<float>(o.min_zero);
          sh = stored_scale(xmax / 14.0f, g, n);
          s = f16_to_float(sh);
        }
        q.scales[gi] = sh;
        q.zeros[gi] = static_cast<uint8_t>(z);
        for (int64_t r = 0; r < rows; ++r)
          codes[r * N] = clamp_code(std::nearbyint(w[static_cast<size_t>(r)] / s) + z);
      } else {
        const float m = o.f16_mins ? f16_to_float(f16_round_down(lo, g, n)) : lo;
        const f16 sh = stored_scale((hi - m) / 15.0f, g, n);
        const float s = f16_to_float(sh);
        q.scales[gi] = sh;
        q.mins[gi] = m;
        for (int64_t r = 0; r < rows; ++r)
          codes[r * N] = clamp_code(std::nearbyint((w[static_cast<size_t>(r)] - m) / s));
      }
    }
  }
}

}  // namespace

QuantizedLinear quantize_rtn(const TensorView& weight, WeightOrientation orientation,
                             const RtnOptions& options) {
  if (weight.device != Device::cpu)
    fail(ErrorKind::invalid_argument, "invalid argument 'weight': a ", device_name(weight.device),
         " tensor: expected a CPU tensor");
  LOWBIT_CHECK_ARG(weight.rank == 2, "weight.rank", weight.rank,
                   "a 2-D weight ([N, K] out_in or [K, N] in_out)");
  LOWBIT_CHECK_ARG(weight.dtype == DType::f32 || weight.dtype == DType::f16 ||
                       weight.dtype == DType::bf16,
                   "weight.dtype", dtype_name(weight.dtype), "f32, f16 or bf16");
  LOWBIT_CHECK_ARG(options.min_zero == 0 || options.min_zero == 1, "min_zero", options.min_zero,
                   "0, or 1 for GPTQ v1 targets");
  const bool out_in = orientation == WeightOrientation::out_in;
  const int64_t K = out_in ? weight.shape[1] : weight.shape[0];
  const int64_t N = out_in ? weight.shape[0] : weight.shape[1];
  const int64_t stride_k = out_in ? weight.strides[1] : weight.strides[0];
  const int64_t stride_n = out_in ? weight.strides[0] : weight.strides[1];
  QuantizedLinear q = QuantizedLinear::allocate(K, N, options.group_size, options.zero_point);
  const WeightIndex where{orientation};
  parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    switch (weight.dtype) {
      case DType::f16:
        quantize_columns(weight.as<const f16>(), stride_k, stride_n, where, options, q, n0, n1);
        break;
      case DType::bf16:
        quantize_columns(weight.as<const bf16>(), stride_k, stride_n, where, options, q, n0, n1);
        break;
      default:
        quantize_columns(weight.as<const float>(), stride_k, stride_n, where, options, q, n0, n1);
        break;
    }
  });
  return q;
}

}  // namespace lowbit::formats
