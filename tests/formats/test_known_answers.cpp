// Hand-built known answers: the exact words and bytes each layout must hold
// for small matrices with chosen codes, written out from the format specs
// (AutoGPTQ pack, AutoAWQ pack with order [0,2,4,6,1,3,5,7], ggml block_q4_1),
// not computed by the code under test.
#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "lowbit/formats/awq.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/formats/float_zero.h"
#include "lowbit/formats/gptq.h"

namespace lowbit::formats {
namespace {

uint32_t word(const HostTensor& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, t.bytes.data() + i * 4, 4);
  return w;
}

// A 16 x 8 (K x N) symmetric per-channel layer with chosen codes:
// column 0 holds code k in row k (0..15), column 1 holds 5 everywhere, the
// other columns 0.
QuantizedLinear hand_layer() {
  QuantizedLinear q = QuantizedLinear::allocate(16, 8, -1, ZeroPoint::symmetric);
  for (auto& s : q.scales) s = float_to_f16(0.25f);
  for (int64_t k = 0; k < 16; ++k) q.codes[static_cast<size_t>(k * 8 + 0)] = static_cast<uint8_t>(k);
  for (int64_t k = 0; k < 16; ++k) q.codes[static_cast<size_t>(k * 8 + 1)] = 5;
  return q;
}

TEST(KnownAnswers, GptqQweightWordsPackDownK) {
  const QuantizedLinear q = hand_layer();
  const HostTensor qw = pack_gptq_qweight(q.codes, 16, 8);
  ASSERT_EQ(qw.dtype, DType::i32);
  ASSERT_EQ(qw.shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(word(qw, 0 * 8 + 0), 0x76543210u);  // rows 0..7 of column 0, row 0 in bits 0..3
  EXPECT_EQ(word(qw, 1 * 8 + 0), 0xFEDCBA98u);  // rows 8..15 of column 0
  EXPECT_EQ(word(qw, 0 * 8 + 1), 0x55555555u);
  EXPECT_EQ(word(qw, 1 * 8 + 1), 0x55555555u);
  EXPECT_EQ(word(qw, 0 * 8 + 2), 0x00000000u);
  EXPECT_EQ(unpack_gptq_qweight(qw.view()), q.codes);
}

TEST(KnownAnswers, AwqQweightWordsPackAcrossNInterleaved) {
  QuantizedLinear q = QuantizedLinear::allocate(16, 8, -1, ZeroPoint::symmetric);
  for (int64_t n = 0; n < 8; ++n) {
    q.codes[static_cast<size_t>(0 * 8 + n)] = static_cast<uint8_t>(n);      // row 0: 0..7
    q.codes[static_cast<size_t>(1 * 8 + n)] = static_cast<uint8_t>(7 - n);  // row 1: 7..0
    q.codes[static_cast<size_t>(2 * 8 + n)] = static_cast<uint8_t>(8 + n);  // row 2: 8..15
  }
  const HostTensor qw = pack_awq_qweight(q.codes, 16, 8);
  ASSERT_EQ(qw.shape, (std::vector<int64_t>{16, 1}));
  // Slot j holds column [0,2,4,6,1,3,5,7][j]: nibbles (low to high) 0,2,4,6,1,3,5,7.
  EXPECT_EQ(word(qw, 0), 0x75316420u);
  // Row 1: slot j holds 7 - order[j] = 7,5,3,1,6,4,2,0 (low to high).
  EXPECT_EQ(word(qw, 1), 0x02461357u);
  // Row 2: 8 + order[j] = 8,A,C,E,9,B,D,F.
  EXPECT_EQ(word(qw, 2), 0xFDB9ECA8u);
  EXPECT_EQ(word(qw, 3), 0x00000000u);
  EXPECT_EQ(unpack_awq_qweight(qw.view()), q.codes);
}

TEST(KnownAnswers, SymmetricQzerosAreSevensForV1AndEightsForV2) {
  const QuantizedLinear q = hand_layer();
  const GptqTensors v1 = pack_gptq(q, GptqZeros::v1);
  const GptqTensors v2 = pack_gptq(q, GptqZeros::v2);
  ASSERT_EQ(v1.qzeros.shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(word(v1.qzeros, 0), 0x77777777u);
  EXPECT_EQ(word(v2.qzeros, 0), 0x88888888u);
  // AWQ stores z itself.
  EXPECT_EQ(word(pack_awq(q).qzeros, 0), 0x88888888u);
  // g_idx is written as AutoGPTQ does (all 0 for per channel).
  ASSERT_TRUE(v1.g_idx.has_value());
  for (int32_t g : v1.g_idx->span<int32_t>()) EXPECT_EQ(g, 0);
}

TEST(KnownAnswers, AsymmetricQzerosPerConvention) {
  // zeros 1..8 across columns 0..7.
  const std::array<uint8_t, 8> z = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(word(pack_gptq_qzeros(z, 1, 8, GptqZeros::v1), 0), 0x76543210u);  // z - 1
  EXPECT_EQ(word(pack_gptq_qzeros(z, 1, 8, GptqZeros::v2), 0), 0x87654321u);  // z
  // AWQ: slot j holds z of column order[j] = 1,3,5,7,2,4,6,8 (low to high).
  EXPECT_EQ(word(pack_awq_qzeros(z, 1, 8), 0), 0x86427531u);
}

TEST(KnownAnswers, GptqV1DequantizesWithZPlusOne) {
  // One word of qweight with code 12 in row 0, qzeros 0x77777777 (v1: z = 8),
  // scale 0.25: w = 0.25 * (12 - 8) = 1.0; code 0 gives -2.0.
  GptqTensors t;
  t.qweight = HostTensor::make(DType::i32, {1, 8});
  const uint32_t w0 = 0x0000000Cu;
  std::memcpy(t.qweight.bytes.data(), &w0, 4);
  t.qzeros = HostTensor::make(DType::i32, {1, 1});
  const uint32_t z = 0x77777777u;
  std::memcpy(t.qzeros.bytes.data(), &z, 4);
  t.scales = HostTensor::make(DType::f16, {1, 8});
  for (auto& s : t.scales.span<f16>()) s = float_to_f16(0.25f);
  const QuantizedLinear q = unpack_gptq(t, GptqZeros::v1, /*symmetric=*/true, -1);
  EXPECT_EQ(q.zero_point, ZeroPoint::symmetric);
  EXPECT_EQ(q.dequant(0, 0), 1.0f);
  EXPECT_EQ(q.dequant(1, 0), -2.0f);
  EXPECT_EQ(q.dequant(0, 1), -2.0f);
  // The same bits read as v2 mean z = 7: w = 0.25 * (12 - 7).
  const QuantizedLinear q2 = unpack_gptq(t, GptqZeros::v2, /*symmetric=*/false, -1);
  EXPECT_EQ(q2.dequant(0, 0), 1.25f);
}

TEST(KnownAnswers, Q4_1BlockByHand) {
  // K = 32, N = 1: element j has code j for j < 16 and 15 - (j - 16) for j >= 16,
  // d = 0.5 (f16 0x3800), m = -1.0 (f16 0xBC00).
  QuantizedLinear q = QuantizedLinear::allocate(32, 1, 32, ZeroPoint::float_min);
  for (int j = 0; j < 32; ++j)
    q.codes[static_cast<size_t>(j)] = static_cast<uint8_t>(j < 16 ? j : 15 - (j - 16));
  q.scales[0] = float_to_f16(0.5f);
  q.mins[0] = -1.0f;
  const std::vector<BlockQ4_1> blocks = pack_q4_1(q);
  ASSERT_EQ(blocks.size(), 1u);
  // qs[j] = code(j) | code(j + 16) << 4 = j | (15 - j) << 4.
  const std::array<uint8_t, 20> expected = {0x00, 0x38, 0x00, 0xBC,  // d, m little-endian
                                            0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                                            0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};
  std::array<uint8_t, 20> bytes{};
  std::memcpy(bytes.data(), blocks.data(), 20);
  EXPECT_EQ(bytes, expected);
  const QuantizedLinear back = unpack_q4_1(blocks, 32, 1);
  EXPECT_EQ(back, q);
  EXPECT_EQ(back.dequant(0, 0), -1.0f);   // 0.5*0 - 1
  EXPECT_EQ(back.dequant(15, 0), 6.5f);   // 0.5*15 - 1
  EXPECT_EQ(back.dequant(16, 0), 6.5f);   // code 15
  EXPECT_EQ(back.dequant(31, 0), -1.0f);  // code 0
}

TEST(KnownAnswers, Q4_1BlocksRunAlongKPerOutputRow) {
  // K = 64, N = 2: block b of row n covers rows 32b..32b+31 of column n.
  QuantizedLinear q = QuantizedLinear::allocate(64, 2, 32, ZeroPoint::float_min);
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t n = 0; n < 2; ++n) {
      q.scales[static_cast<size_t>(g * 2 + n)] = float_to_f16(static_cast<float>(1 + g * 2 + n));
      q.mins[static_cast<size_t>(g * 2 + n)] = 0.0f;
    }
  const std::vector<BlockQ4_1> blocks = pack_q4_1(q);
  ASSERT_EQ(blocks.size(), 4u);
  // [N][K/32]: (n0, b0), (n0, b1), (n1, b0), (n1, b1) -> scales 1, 3, 2, 4.
  EXPECT_EQ(f16_to_float(blocks[0].d), 1.0f);
  EXPECT_EQ(f16_to_float(blocks[1].d), 3.0f);
  EXPECT_EQ(f16_to_float(blocks[2].d), 2.0f);
  EXPECT_EQ(f16_to_float(blocks[3].d), 4.0f);
}

TEST(KnownAnswers, FloatZeroFromIntegerStoresMinusScaleTimesZero) {
  QuantizedLinear q = QuantizedLinear::allocate(8, 8, -1, ZeroPoint::integer);
  for (int64_t n = 0; n < 8; ++n) {
    q.scales[static_cast<size_t>(n)] = float_to_f16(0.125f);
    q.zeros[static_cast<size_t>(n)] = static_cast<uint8_t>(n + 3);
  }
  const FloatZeroTensors t = pack_float_zero(q);
  ASSERT_EQ(t.mins.dtype, DType::f32);
  for (int64_t n = 0; n < 8; ++n)
    EXPECT_EQ(t.mins.span<float>()[static_cast<size_t>(n)], -0.125f * static_cast<float>(n + 3));
  EXPECT_FALSE(t.g_idx.has_value());
}

TEST(KnownAnswers, DequantFormulaPerConvention) {
  QuantizedLinear q = QuantizedLinear::allocate(8, 8, -1, ZeroPoint::integer);
  q.scales[0] = float_to_f16(0.5f);
  q.zeros[0] = 3;
  q.codes[0] = 10;
  EXPECT_EQ(q.dequant(0, 0), 3.5f);  // 0.5 * (10 - 3)
  q.zero_point = ZeroPoint::symmetric;
  q.zeros.clear();
  EXPECT_EQ(q.dequant(0, 0), 1.0f);  // 0.5 * (10 - 8)
  q.zero_point = ZeroPoint::float_min;
  q.mins.assign(8, 0.0f);
  q.mins[0] = -0.75f;
  EXPECT_EQ(q.dequant(0, 0), 4.25f);  // 0.5 * 10 - 0.75
  float out[64];
  dequantize_ref(q, out);
  EXPECT_EQ(out[0], 4.25f);
}

}  // namespace
}  // namespace lowbit::formats
