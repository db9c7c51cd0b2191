#include "lowbit/formats/awq.h"

#include "packing.h"

namespace lowbit::formats {

using detail::check_nibbles;
using detail::check_tensor;
using detail::word_at;
using detail::words_tensor;

namespace {

// Packs rows of N nibbles along N: slot j of word (r, i) holds column 8*i + kAwqPackOrder[j].
std::vector<uint32_t> pack_along_n(std::span<const uint8_t> values, int64_t rows, int64_t N) {
  std::vector<uint32_t> words(static_cast<size_t>(rows * (N / 8)), 0u);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < N / 8; ++i) {
      uint32_t w = 0;
      for (int j = 0; j < 8; ++j)
        w |= static_cast<uint32_t>(values[static_cast<size_t>(r * N + 8 * i + kAwqPackOrder[j])])
             << (4 * j);
      words[static_cast<size_t>(r * (N / 8) + i)] = w;
    }
  return words;
}

std::vector<uint8_t> unpack_along_n(const TensorView& t) {
  const int64_t rows = t.shape[0];
  const int64_t N = t.shape[1] * 8;
  std::vector<uint8_t> values(static_cast<size_t>(rows * N));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < N / 8; ++i) {
      const uint32_t w = word_at(t, r * (N / 8) + i);
      for (int j = 0; j < 8; ++j)
        values[static_cast<size_t>(r * N + 8 * i + kAwqPackOrder[j])] =
            static_cast<uint8_t>((w >> (4 * j)) & 0xFu);
    }
  return values;
}

}  // namespace

HostTensor pack_awq_qweight(std::span<const uint8_t> codes, int64_t K, int64_t N) {
  LOWBIT_CHECK_ARG(K > 0, "K", K, "a positive number of rows");
  LOWBIT_CHECK_ARG(N > 0 && N % 8 == 0, "N", N,
                   "a positive multiple of 8 (AWQ packs 8 columns per word)");
  check_nibbles(codes, K * N, N, "codes", "[K, N] row-major");
  return words_tensor(pack_along_n(codes, K, N), {K, N / 8});
}

std::vector<uint8_t> unpack_awq_qweight(const TensorView& qweight) {
  check_tensor(qweight, "qweight", DType::i32, {-1, -1}, "AWQ qweight [K, N/8]", DType::u32);
  return unpack_along_n(qweight);
}

HostTensor pack_awq_qzeros(std::span<const uint8_t> zeros, int64_t G, int64_t N) {
  LOWBIT_CHECK_ARG(G > 0, "G", G, "a positive number of groups");
  LOWBIT_CHECK_ARG(N > 0 && N % 8 == 0, "N", N,
                   "a positive multiple of 8 (AWQ packs 8 columns per word)");
  check_nibbles(zeros, G * N, N, "zeros", "[G, N] row-major");
  return words_tensor(pack_along_n(zeros, G, N), {G, N / 8});
}

std::vector<uint8_t> unpack_awq_qzeros(const TensorView& qzeros) {
  check_tensor(qzeros, "qzeros", DType::i32, {-1, -1}, "AWQ qzeros [G, N/8]", DType::u32);
  return unpack_along_n(qzeros);
}

AwqTensors pack_awq(const QuantizedLinear& layer) {
  layer.validate();
  const std::vector<uint8_t> zeros = detail::integer_zero_points(layer, "AWQ");
  if (!layer.has_trivial_g_idx())
    fail(ErrorKind::invalid_argument,
         "invalid argument 'g_idx': the layer has act-order (g_idx is not k / group_size) and AWQ "
         "has no g_idx; expected rows in group order — reorder them with sort_rows_by_group() "
         "(lowbit/formats/convert.h) and permute the activations with its perm");
  LOWBIT_CHECK_ARG(layer.N % 8 == 0, "N", layer.N,
                   "a multiple of 8 for AWQ (8 columns per word)");
  const int64_t K = layer.K, N = layer.N, G = layer.num_groups();
  AwqTensors t;
  t.qweight = pack_awq_qweight(layer.codes, K, N);
  t.qzeros = pack_awq_qzeros(zeros, G, N);
  t.scales = HostTensor::make(DType::f16, {G, N});
  std::copy(layer.scales.begin(), layer.scales.end(), t.scales.span<f16>().begin());
  return t;
}

QuantizedLinear unpack_awq(const AwqTensors& tensors, int group_size) {
  LOWBIT_CHECK_ARG(is_supported_group_size(group_size), "group_size", group_size,
                   "one of 32, 64, 128, 256, or -1 (per channel)");
  const TensorView qweight = tensors.qweight.view();
  check_tensor(qweight, "qweight", DType::i32, {-1, -1}, "AWQ qweight [K, N/8]", DType::u32);
  const int64_t K = qweight.shape[0];
  const int64_t N = qweight.shape[1] * 8;
  QuantizedLinear q = QuantizedLinear::allocate(K, N, group_size, ZeroPoint::integer);
  const int64_t G = q.num_groups();
  check_tensor(tensors.scales.view(), "scales", DType::f16, {G, N},
               "f16 [G, N] with G = K / group_size = " + std::to_string(G) + ", N = 8 * qweight columns");
  check_tensor(tensors.qzeros.view(), "qzeros", DType::i32, {G, N / 8},
               "[G, N/8] with G = " + std::to_string(G) + " and the columns of qweight", DType::u32);
  q.codes = unpack_along_n(qweight);
  q.zeros = unpack_along_n(tensors.qzeros.view());
  const auto scales = tensors.scales.span<f16>();
  q.scales.assign(scales.begin(), scales.end());
  q.validate();
  return q;
}

}  // namespace lowbit::formats
