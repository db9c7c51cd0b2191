#include "lowbit/formats/float_zero.h"

#include <algorithm>

#include "lowbit/formats/gptq.h"
#include "packing.h"

namespace lowbit::formats {

using detail::check_tensor;

namespace {

// m as an f16; throws unless it is exact or rounding is allowed.
f16 min_to_f16(float m, bool allow_rounding, int64_t g, int64_t n, const char* target) {
  const f16 h = float_to_f16(m);
  if (!allow_rounding && f16_to_float(h) != m)
    fail(ErrorKind::invalid_argument, "invalid argument 'mins[", g, ", ", n, "]' = ", m,
         ": it is not exact in f16 (it would round to ", f16_to_float(h), ") and ", target,
         " stores f16 mins; expected f16-representable mins (for integer zeros m = -scale*z "
         "needs scale*z to fit 11 significant bits), or allow_rounding (changes the weights)");
  return h;
}

}  // namespace

FloatZeroTensors pack_float_zero(const QuantizedLinear& layer, const FloatZeroOptions& options) {
  LOWBIT_CHECK_ARG(options.mins_dtype == DType::f32 || options.mins_dtype == DType::f16,
                   "mins_dtype", dtype_name(options.mins_dtype), "f32 or f16");
  layer.validate();
  const int64_t K = layer.K, N = layer.N, G = layer.num_groups();
  FloatZeroTensors t;
  t.qweight = pack_gptq_qweight(layer.codes, K, N);
  t.scales = HostTensor::make(DType::f16, {G, N});
  std::copy(layer.scales.begin(), layer.scales.end(), t.scales.span<f16>().begin());
  t.mins = HostTensor::make(options.mins_dtype, {G, N});
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      const float m = layer.offset(g, n);
      const auto i = static_cast<size_t>(g * N + n);
      if (options.mins_dtype == DType::f32)
        t.mins.span<float>()[i] = m;
      else
        t.mins.span<f16>()[i] = min_to_f16(m, options.allow_rounding, g, n, "float_zero with f16 mins");
    }
  if (!layer.has_trivial_g_idx()) {
    t.g_idx = HostTensor::make(DType::i32, {K});
    std::copy(layer.g_idx.begin(), layer.g_idx.end(), t.g_idx->span<int32_t>().begin());
  }
  return t;
}

QuantizedLinear unpack_float_zero(const FloatZeroTensors& tensors, int group_size) {
  LOWBIT_CHECK_ARG(is_supported_group_size(group_size), "group_size", group_size,
                   "one of 32, 64, 128, 256, or -1 (per channel)");
  const TensorView qweight = tensors.qweight.view();
  check_tensor(qweight, "qweight", DType::i32, {-1, -1}, "float_zero qweight [K/8, N]", DType::u32);
  const int64_t K = qweight.shape[0] * 8;
  const int64_t N = qweight.shape[1];
  QuantizedLinear q = QuantizedLinear::allocate(K, N, group_size, ZeroPoint::float_min);
  const int64_t G = q.num_groups();
  const std::string groups = "[G, N] with G = " + std::to_string(G) + ", N from qweight";
  check_tensor(tensors.scales.view(), "scales", DType::f16, {G, N}, "f16 " + groups);
  check_tensor(tensors.mins.view(), "mins", DType::f32, {G, N}, groups, DType::f16);
  q.codes = unpack_gptq_qweight(qweight);
  const auto scales = tensors.scales.span<f16>();
  q.scales.assign(scales.begin(), scales.end());
  if (tensors.mins.dtype == DType::f32) {
    const auto mins = tensors.mins.span<float>();
    q.mins.assign(mins.begin(), mins.end());
  } else {
    const auto mins = tensors.mins.span<f16>();
    std::transform(mins.begin(), mins.end(), q.mins.begin(), [](f16 h) { return f16_to_float(h); });
  }
  if (tensors.g_idx) {
    check_tensor(tensors.g_idx->view(), "g_idx", DType::i32, {K}, "int32 [K], K = 8 * qweight rows");
    const auto gi = tensors.g_idx->span<int32_t>();
    q.g_idx.assign(gi.begin(), gi.end());
    if (q.has_trivial_g_idx()) q.g_idx.clear();
  }
  q.validate();
  return q;
}

std::vector<BlockQ4_1> pack_q4_1(const QuantizedLinear& layer, bool allow_rounding) {
  layer.validate();
  LOWBIT_CHECK_ARG(layer.group_size == kQ4_1BlockSize, "group_size", layer.group_size,
                   "32 for GGUF Q4_1 (one block of 32 weights per scale and min)");
  if (!layer.has_trivial_g_idx())
    fail(ErrorKind::invalid_argument,
         "invalid argument 'g_idx': the layer has act-order (g_idx is not k / group_size) and "
         "GGUF Q4_1 has no g_idx; expected rows in group order — reorder them with "
         "sort_rows_by_group() (lowbit/formats/convert.h) and permute the activations with its perm");
  const int64_t K = layer.K, N = layer.N, B = K / kQ4_1BlockSize;
  std::vector<BlockQ4_1> blocks(static_cast<size_t>(N * B));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < B; ++b) {
      BlockQ4_1& blk = blocks[static_cast<size_t>(n * B + b)];
      blk.d = layer.scales[static_cast<size_t>(b * N + n)];
      blk.m = min_to_f16(layer.offset(b, n), allow_rounding, b, n, "GGUF Q4_1");
      for (int j = 0; j < 16; ++j) {
        const uint8_t lo = layer.codes[static_cast<size_t>((b * 32 + j) * N + n)];
        const uint8_t hi = layer.codes[static_cast<size_t>((b * 32 + j + 16) * N + n)];
        blk.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  return blocks;
}

QuantizedLinear unpack_q4_1(std::span<const BlockQ4_1> blocks, int64_t K, int64_t N) {
  LOWBIT_CHECK_ARG(K > 0 && K % kQ4_1BlockSize == 0, "K", K,
                   "a positive multiple of 32 (GGUF Q4_1 blocks of 32 along K)");
  LOWBIT_CHECK_ARG(N > 0, "N", N, "a positive number of output rows");
  const int64_t B = K / kQ4_1BlockSize;
  if (static_cast<int64_t>(blocks.size()) != N * B)
    fail(ErrorKind::invalid_argument, "invalid argument 'blocks' has ", blocks.size(),
         " blocks: expected N * K/32 = ", N * B, " for K = ", K, ", N = ", N);
  QuantizedLinear q = QuantizedLinear::allocate(K, N, kQ4_1BlockSize, ZeroPoint::float_min);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < B; ++b) {
      const BlockQ4_1& blk = blocks[static_cast<size_t>(n * B + b)];
      q.scales[static_cast<size_t>(b * N + n)] = blk.d;
      q.mins[static_cast<size_t>(b * N + n)] = f16_to_float(blk.m);
      for (int j = 0; j < 16; ++j) {
        q.codes[static_cast<size_t>((b * 32 + j) * N + n)] = static_cast<uint8_t>(blk.qs[j] & 0xF);
        q.codes[static_cast<size_t>((b * 32 + j + 16) * N + n)] = static_cast<uint8_t>(blk.qs[j] >> 4);
      }
    }
  q.validate();
  return q;
}

}  // namespace lowbit::formats
