#include "lowbit/formats/dequant_ref.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/parallel.h"

namespace lowbit::formats {

void dequantize_tile_ref(const QuantizedLinear& layer, int64_t k0, int64_t k1, int64_t n0,
                         int64_t n1, float* out, int64_t ld) {
  const int64_t width = n1 - n0;
  if (width <= 0) return;
  // Scale and offset of the current group for columns n0..n1-1; with a trivial
  // g_idx they change once per group, with act-order possibly every row.
  std::vector<float> scale(static_cast<size_t>(width)), offset(static_cast<size_t>(width));
  int64_t cached = -1;
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t g = layer.group_of(k);
    if (g != cached) {
      for (int64_t j = 0; j < width; ++j) {
        scale[static_cast<size_t>(j)] =
            f16_to_float(layer.scales[static_cast<size_t>(g * layer.N + n0 + j)]);
        offset[static_cast<size_t>(j)] = layer.offset(g, n0 + j);
      }
      cached = g;
    }
    const uint8_t* codes = layer.codes.data() + k * layer.N + n0;
    float* row = out + (k - k0) * ld;
    const float* s = scale.data();
    const float* m = offset.data();
    // s*q is exact (see quantized_linear.h), so this equals QuantizedLinear::dequant bit for bit.
    for (int64_t j = 0; j < width; ++j) row[j] = s[j] * static_cast<float>(codes[j]) + m[j];
  }
}

void dequantize_ref(const QuantizedLinear& layer, float* out_kn) {
  layer.validate();
  LOWBIT_CHECK_ARG(out_kn != nullptr, "out_kn", "null", "a buffer of K*N floats");
  parallel_for(0, layer.K, 64, [&](int64_t k0, int64_t k1) {
    dequantize_tile_ref(layer, k0, k1, 0, layer.N, out_kn + k0 * layer.N, layer.N);
  });
}

namespace {

template <typename T>
void store(const float* src, int64_t n, const TensorView& out, int64_t row) {
  T* dst = out.as<T>() + row * out.strides[0];
  const int64_t stride = out.strides[1];
  for (int64_t j = 0; j < n; ++j) {
    if constexpr (std::is_same_v<T, float>)
      dst[j * stride] = src[j];
    else if constexpr (std::is_same_v<T, f16>)
      dst[j * stride] = float_to_f16(src[j]);
    else
      dst[j * stride] = float_to_bf16(src[j]);
  }
}

}  // namespace

void dequantize_ref(const QuantizedLinear& layer, const TensorView& out) {
  layer.validate();
  if (out.device != Device::cpu)
    fail(ErrorKind::invalid_argument, "invalid argument 'out': a ", device_name(out.device),
         " tensor: expected a CPU tensor");
  LOWBIT_CHECK_ARG(out.dtype == DType::f32 || out.dtype == DType::f16 || out.dtype == DType::bf16,
                   "out.dtype", dtype_name(out.dtype), "f32, f16 or bf16");
  if (out.rank != 2 || out.shape[0] != layer.K || out.shape[1] != layer.N)
    fail(ErrorKind::invalid_argument, "invalid argument 'out' with shape ", out.shape_string(),
         ": expected [K, N] = [", layer.K, ", ", layer.N, "]");
  constexpr int64_t kRows = 16;
  parallel_for(0, layer.K, kRows, [&](int64_t k0, int64_t k1) {
    std::vector<float> buf(static_cast<size_t>(kRows * layer.N));
    for (int64_t kb = k0; kb < k1; kb += kRows) {
      const int64_t kn = std::min(k1, kb + kRows);
      dequantize_tile_ref(layer, kb, kn, 0, layer.N, buf.data(), layer.N);
      for (int64_t k = kb; k < kn; ++k) {
        const float* src = buf.data() + (k - kb) * layer.N;
        switch (out.dtype) {
          case DType::f16: store<f16>(src, layer.N, out, k); break;
          case DType::bf16: store<bf16>(src, layer.N, out, k); break;
          default: store<float>(src, layer.N, out, k); break;
        }
      }
    }
  });
}

}  // namespace lowbit::formats
