#include "lowbit/formats/gptq.h"

#include "packing.h"

namespace lowbit::formats {

using detail::check_nibbles;
using detail::check_tensor;
using detail::word_at;
using detail::words_tensor;

const char* gptq_zeros_name(GptqZeros zeros) { return zeros == GptqZeros::v1 ? "v1" : "v2"; }

HostTensor pack_gptq_qweight(std::span<const uint8_t> codes, int64_t K, int64_t N) {
  LOWBIT_CHECK_ARG(K > 0 && K % 8 == 0, "K", K, "a positive multiple of 8 (GPTQ packs 8 rows per word)");
  LOWBIT_CHECK_ARG(N > 0, "N", N, "a positive number of columns");
  check_nibbles(codes, K * N, N, "codes", "[K, N] row-major");
  std::vector<uint32_t> words(static_cast<size_t>(K / 8 * N), 0u);
  for (int64_t k = 0; k < K; ++k) {
    const uint32_t shift = static_cast<uint32_t>(4 * (k % 8));
    uint32_t* row = words.data() + (k / 8) * N;
    const uint8_t* src = codes.data() + k * N;
    for (int64_t n = 0; n < N; ++n) row[n] |= static_cast<uint32_t>(src[n]) << shift;
  }
  return words_tensor(words, {K / 8, N});
}

std::vector<uint8_t> unpack_gptq_qweight(const TensorView& qweight) {
  check_tensor(qweight, "qweight", DType::i32, {-1, -1}, "GPTQ qweight [K/8, N]", DType::u32);
  const int64_t K = qweight.shape[0] * 8;
  const int64_t N = qweight.shape[1];
  std::vector<uint8_t> codes(static_cast<size_t>(K * N));
  for (int64_t i = 0; i < K / 8; ++i)
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t w = word_at(qweight, i * N + n);
      for (int j = 0; j < 8; ++j)
        codes[static_cast<size_t>((8 * i + j) * N + n)] = static_cast<uint8_t>((w >> (4 * j)) & 0xFu);
    }
  return codes;
}

HostTensor pack_gptq_qzeros(std::span<const uint8_t> zeros, int64_t G, int64_t N,
                            GptqZeros convention) {
  LOWBIT_CHECK_ARG(G > 0, "G", G, "a positive number of groups");
  LOWBIT_CHECK_ARG(N > 0 && N % 8 == 0, "N", N,
                   "a positive multiple of 8 (GPTQ qzeros pack 8 columns per word)");
  check_nibbles(zeros, G * N, N, "zeros", "[G, N] row-major");
  std::vector<uint32_t> words(static_cast<size_t>(G * (N / 8)), 0u);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      uint32_t z = zeros[static_cast<size_t>(g * N + n)];
      if (convention == GptqZeros::v1) {
        if (z == 0)
          fail(ErrorKind::invalid_argument, "invalid argument 'zeros' = 0 at group ", g,
               ", column ", n,
               ": GPTQ v1 (checkpoint_format \"gptq\") stores z - 1, so z = 0 would wrap to 0xF "
               "and read back as 16; expected z in 1..15 for v1. Write GptqZeros::v2 "
               "(checkpoint_format \"gptq_v2\") instead, or quantize with RtnOptions::min_zero = 1");
        z -= 1;
      }
      words[static_cast<size_t>(g * (N / 8) + n / 8)] |= z << (4 * (n % 8));
    }
  return words_tensor(words, {G, N / 8});
}

std::vector<uint8_t> unpack_gptq_qzeros(const TensorView& qzeros, GptqZeros convention) {
  check_tensor(qzeros, "qzeros", DType::i32, {-1, -1}, "GPTQ qzeros [G, N/8]", DType::u32);
  const int64_t G = qzeros.shape[0];
  const int64_t N = qzeros.shape[1] * 8;
  std::vector<uint8_t> zeros(static_cast<size_t>(G * N));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      uint32_t z = (word_at(qzeros, g * (N / 8) + n / 8) >> (4 * (n % 8))) & 0xFu;
      if (convention == GptqZeros::v1) {
        if (z == 15)
          fail(ErrorKind::format, "tensor 'qzeros' holds 0xF at group ", g, ", column ", n,
               ": GPTQ v1 stores z - 1, so this is z = 16, outside the 4-bit range 0..15 "
               "(a v1 writer wrapped z = 0); expected stored values 0..14 for v1 — is the "
               "checkpoint really v1 (checkpoint_format \"gptq\"), not gptq_v2?");
        z += 1;
      }
      zeros[static_cast<size_t>(g * N + n)] = static_cast<uint8_t>(z);
    }
  return zeros;
}

GptqTensors pack_gptq(const QuantizedLinear& layer, GptqZeros convention) {
  layer.validate();
  const std::vector<uint8_t> zeros = detail::integer_zero_points(layer, "GPTQ");
  LOWBIT_CHECK_ARG(layer.N % 8 == 0, "N", layer.N,
                   "a multiple of 8 for GPTQ (qzeros pack 8 columns per word)");
  const int64_t K = layer.K, N = layer.N, G = layer.num_groups();
  GptqTensors t;
  t.qweight = pack_gptq_qweight(layer.codes, K, N);
  t.qzeros = pack_gptq_qzeros(zeros, G, N, convention);
  t.scales = HostTensor::make(DType::f16, {G, N});
  std::copy(layer.scales.begin(), layer.scales.end(), t.scales.span<f16>().begin());
  HostTensor g_idx = HostTensor::make(DType::i32, {K});
  auto gi = g_idx.span<int32_t>();
  for (int64_t k = 0; k < K; ++k) gi[static_cast<size_t>(k)] = static_cast<int32_t>(layer.group_of(k));
  t.g_idx = std::move(g_idx);
  return t;
}

QuantizedLinear unpack_gptq(const GptqTensors& tensors, GptqZeros convention, bool symmetric,
                            int group_size) {
  LOWBIT_CHECK_ARG(is_supported_group_size(group_size), "group_size", group_size,
                   "one of 32, 64, 128, 256, or -1 (per channel)");
  const TensorView qweight = tensors.qweight.view();
  check_tensor(qweight, "qweight", DType::i32, {-1, -1}, "GPTQ qweight [K/8, N]", DType::u32);
  const int64_t K = qweight.shape[0] * 8;
  const int64_t N = qweight.shape[1];
  if (N % 8 != 0)
    fail(ErrorKind::format, "tensor 'qweight' is ", qweight.shape_string(), ": N = ", N,
         " is not a multiple of 8, which GPTQ qzeros need (8 columns per word)");
  QuantizedLinear q = QuantizedLinear::allocate(
      K, N, group_size, symmetric ? ZeroPoint::symmetric : ZeroPoint::integer);
  const int64_t G = q.num_groups();
  check_tensor(tensors.scales.view(), "scales", DType::f16, {G, N},
               "f16 [G, N] with G = K / group_size = " + std::to_string(G) + ", N from qweight");
  check_tensor(tensors.qzeros.view(), "qzeros", DType::i32, {G, N / 8},
               "[G, N/8] with G = " + std::to_string(G) + ", N = " + std::to_string(N) + " from qweight",
               DType::u32);
  q.codes = unpack_gptq_qweight(qweight);
  const auto scales = tensors.scales.span<f16>();
  q.scales.assign(scales.begin(), scales.end());
  std::vector<uint8_t> zeros = unpack_gptq_qzeros(tensors.qzeros.view(), convention);
  if (symmetric) {
    for (size_t i = 0; i < zeros.size(); ++i)
      if (zeros[i] != 8)
        fail(ErrorKind::format, "tensor 'qzeros' gives z = ", int(zeros[i]), " at group ",
             static_cast<int64_t>(i) / N, ", column ", static_cast<int64_t>(i) % N,
             ": expected z = 8 everywhere for a symmetric (sym = true) GPTQ layer (",
             gptq_zeros_name(convention), " stores ", convention == GptqZeros::v1 ? 7 : 8, ")");
  } else {
    q.zeros = std::move(zeros);
  }
  if (tensors.g_idx) {
    const TensorView g_idx = tensors.g_idx->view();
    check_tensor(g_idx, "g_idx", DType::i32, {K}, "int32 [K] with K = 8 * qweight rows");
    const auto gi = tensors.g_idx->span<int32_t>();
    q.g_idx.assign(gi.begin(), gi.end());
    if (q.has_trivial_g_idx()) q.g_idx.clear();
  }
  q.validate();
  return q;
}

}  // namespace lowbit::formats
