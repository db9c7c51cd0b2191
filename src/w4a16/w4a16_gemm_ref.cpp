#include "lowbit/w4a16/w4a16_gemm_ref.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/parallel.h"
#include "lowbit/formats/dequant_ref.h"

namespace lowbit {

namespace {

constexpr int64_t kTileN = 64;   // columns of W dequantized together (the vector loop width)
constexpr int64_t kChunkK = 128; // rows of the tile kept in cache: 128 x 64 floats = 32 KiB

std::string describe_w(const formats::QuantizedLinear& w) {
  return detail::concat("[K, N] = [", w.K, ", ", w.N, "] (in_features x out_features)");
}

void check_view(const TensorView& t, const char* name, const char* shape_name) {
  if (t.device != Device::cpu)
    fail(ErrorKind::invalid_argument, "invalid argument '", name, "': a ", device_name(t.device),
         " tensor: expected a CPU tensor (w4a16_gemm_ref is the CPU reference)");
  if (t.rank != 2)
    fail(ErrorKind::invalid_argument, "invalid argument '", name, "' with shape ", t.shape_string(),
         ": expected a 2-D tensor ", shape_name);
}

template <typename T>
void widen_rows(const TensorView& x, int64_t K, float* out) {
  const T* base = x.as<const T>();
  for (int64_t m = 0; m < x.shape[0]; ++m)
    for (int64_t k = 0; k < K; ++k)
      out[m * K + k] = to_float(base[m * x.strides[0] + k * x.strides[1]]);
}

template <typename T>
void store_tile(const float* acc, int64_t M, int64_t n0, int64_t width, const TensorView& y) {
  for (int64_t m = 0; m < M; ++m) {
    T* row = y.as<T>() + m * y.strides[0] + n0 * y.strides[1];
    const float* a = acc + m * kTileN;
    for (int64_t j = 0; j < width; ++j) {
      if constexpr (std::is_same_v<T, float>)
        row[j * y.strides[1]] = a[j];
      else if constexpr (std::is_same_v<T, f16>)
        row[j * y.strides[1]] = float_to_f16(a[j]);
      else
        row[j * y.strides[1]] = float_to_bf16(a[j]);
    }
  }
}

}  // namespace

void w4a16_gemm_ref(const TensorView& x, const formats::QuantizedLinear& w, const TensorView& y) {
  check_view(x, "x", "[M, K]");
  check_view(y, "y", "[M, N]");
  LOWBIT_CHECK_ARG(x.dtype == DType::f16 || x.dtype == DType::bf16 || x.dtype == DType::f32,
                   "x.dtype", dtype_name(x.dtype), "f16, bf16 or f32");
  LOWBIT_CHECK_ARG(y.dtype == DType::f32 || y.dtype == DType::f16 || y.dtype == DType::bf16,
                   "y.dtype", dtype_name(y.dtype), "f32, f16 or bf16");
  w.validate();
  const int64_t M = x.shape[0], K = w.K, N = w.N;
  if (x.shape[1] != K)
    fail(ErrorKind::invalid_argument, "invalid argument 'x' with shape ", x.shape_string(),
         ": w is ", describe_w(w), ", so expected x [M, ", K, "] (x's columns = w's K)");
  if (y.shape[0] != M || y.shape[1] != N)
    fail(ErrorKind::invalid_argument, "invalid argument 'y' with shape ", y.shape_string(),
         ": x is ", x.shape_string(), " and w is ", describe_w(w), ", so expected y [", M, ", ",
         N, "]");
  if (M == 0) return;

  std::vector<float> xf(static_cast<size_t>(M * K));
  switch (x.dtype) {
    case DType::f16: widen_rows<f16>(x, K, xf.data()); break;
    case DType::bf16: widen_rows<bf16>(x, K, xf.data()); break;
    default: widen_rows<float>(x, K, xf.data()); break;
  }

  const int64_t tiles = (N + kTileN - 1) / kTileN;
  parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> tile(static_cast<size_t>(kChunkK * kTileN), 0.0f);
    std::vector<float> acc(static_cast<size_t>(M * kTileN));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kTileN;
      const int64_t width = std::min(kTileN, N - n0);
      if (width < kTileN) std::fill(tile.begin(), tile.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k0 = 0; k0 < K; k0 += kChunkK) {
        const int64_t rows = std::min(kChunkK, K - k0);
        formats::dequantize_tile_ref(w, k0, k0 + rows, n0, n0 + width, tile.data(), kTileN);
        for (int64_t m = 0; m < M; ++m) {
          float* __restrict a = acc.data() + m * kTileN;
          const float* __restrict xr = xf.data() + m * K + k0;
          for (int64_t k = 0; k < rows; ++k) {
            const float xv = xr[k];
            const float* __restrict wr = tile.data() + k * kTileN;
            for (int64_t j = 0; j < kTileN; ++j) a[j] += xv * wr[j];
          }
        }
      }
      switch (y.dtype) {
        case DType::f16: store_tile<f16>(acc.data(), M, n0, width, y); break;
        case DType::bf16: store_tile<bf16>(acc.data(), M, n0, width, y); break;
        default: store_tile<float>(acc.data(), M, n0, width, y); break;
      }
    }
  });
}

}  // namespace lowbit
