// Every error path of lowbit/formats: the ErrorKind and a message naming the
// argument (and what was expected).
#include <gtest/gtest.h>

#include <cstring>

#include "error_matchers.h"
#include "lowbit/formats/awq.h"
#include "lowbit/formats/convert.h"
#include "lowbit/formats/float_zero.h"
#include "lowbit/formats/gptq.h"
#include "lowbit/formats/layout_registry.h"
#include "random_layers.h"

namespace lowbit::formats {
namespace {

using test::throws_error;
using test::ZeroKind;

TEST(FormatErrors, ValidateNamesTheField) {
  const QuantizedLinear good = test::random_layer(64, 8, 32, ZeroKind::asym, 1);
  ASSERT_NO_THROW(good.validate());
  {
    QuantizedLinear q = good;
    q.group_size = 48;
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::invalid_argument,
                             {"'group_size' = 48", "32, 64, 128, 256, or -1"}));
  }
  {
    QuantizedLinear q = good;
    q.group_size = 128;  // K = 64 is not a multiple
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::invalid_argument,
                             {"'K' = 64", "not a multiple of group_size = 128"}));
  }
  {
    EXPECT_TRUE(throws_error([&] { (void)QuantizedLinear::allocate(100, 8, -1, ZeroPoint::symmetric); },
                             ErrorKind::invalid_argument, {"'K' = 100", "multiple of 8"}));
    EXPECT_TRUE(throws_error([&] { (void)QuantizedLinear::allocate(64, 0, 32, ZeroPoint::symmetric); },
                             ErrorKind::invalid_argument, "'N' = 0"));
  }
  {
    QuantizedLinear q = good;
    q.codes.pop_back();
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::invalid_argument,
                             {"'codes' has 511 elements", "expected 512"}));
  }
  {
    QuantizedLinear q = good;
    q.scales.resize(8);
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::invalid_argument, {"'scales'", "expected 16"}));
  }
  {
    QuantizedLinear q = good;
    q.zero_point = ZeroPoint::symmetric;  // zeros still present
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::invalid_argument, {"'zeros'", "symmetric"}));
  }
  {
    QuantizedLinear q = good;
    q.zero_point = ZeroPoint::float_min;
    q.zeros.clear();  // mins missing
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::invalid_argument, {"'mins'", "expected 16"}));
  }
  {
    QuantizedLinear q = good;
    q.codes[3 * 8 + 5] = 16;
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::format, {"codes[3, 5] = 16", "0..15"}));
  }
  {
    QuantizedLinear q = good;
    q.zeros[9] = 200;
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::format, {"zeros[1, 1] = 200", "0..15"}));
  }
  {
    QuantizedLinear q = good;
    q.scales[2] = f16::from_bits(0x7C00);  // inf
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::format, {"scales[0, 2]", "finite"}));
  }
  {
    QuantizedLinear q = good;
    q.g_idx.assign(64, 0);
    q.g_idx[7] = 2;  // G = 2
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::format, {"g_idx[7] = 2", "0..1"}));
    q.g_idx.resize(10);
    EXPECT_TRUE(throws_error([&] { q.validate(); }, ErrorKind::invalid_argument, {"'g_idx' has 10", "64"}));
  }
}

TEST(FormatErrors, GptqV1CannotStoreZeroZero) {
  QuantizedLinear q = test::random_layer(64, 16, 32, ZeroKind::asym_v1, 2);
  q.zeros[1 * 16 + 9] = 0;  // group 1, column 9
  EXPECT_TRUE(throws_error([&] { (void)pack_gptq(q, GptqZeros::v1); }, ErrorKind::invalid_argument,
                           {"'zeros' = 0 at group 1, column 9", "v2", "min_zero"}));
  EXPECT_TRUE(throws_error([&] { (void)pack(q, "gptq"); }, ErrorKind::invalid_argument, "group 1, column 9"));
  EXPECT_NO_THROW((void)pack_gptq(q, GptqZeros::v2));
}

TEST(FormatErrors, GptqV1NibbleFifteenReadsAsSixteen) {
  const QuantizedLinear q = test::random_layer(64, 16, 32, ZeroKind::asym_v1, 3);
  GptqTensors t = pack_gptq(q, GptqZeros::v2);  // v2 can hold z = 15 ...
  uint32_t w;
  std::memcpy(&w, t.qzeros.bytes.data() + 4, 4);  // group 0, columns 8..15
  w |= 0xFu << 4;                                  // column 9 := 15
  std::memcpy(t.qzeros.bytes.data() + 4, &w, 4);
  // ... which read as v1 is z = 16.
  EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(t, GptqZeros::v1, false, 32); }, ErrorKind::format,
                           {"'qzeros'", "group 0, column 9", "z = 16"}));
}

TEST(FormatErrors, GptqSymmetricFlagNeedsEights) {
  const QuantizedLinear q = test::random_layer(64, 8, 32, ZeroKind::asym_v1, 4);
  const GptqTensors t = pack_gptq(q, GptqZeros::v1);
  EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(t, GptqZeros::v1, true, 32); }, ErrorKind::format,
                           {"'qzeros'", "z = 8"}));
}

TEST(FormatErrors, GptqTensorShapesAreChecked) {
  const QuantizedLinear q = test::random_layer(64, 16, 32, ZeroKind::sym, 5);
  {
    GptqTensors t = pack_gptq(q, GptqZeros::v2);
    EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(t, GptqZeros::v2, true, 64); }, ErrorKind::format,
                             {"'scales'", "[1, 16]"}));  // group 64 means G = 1, scales hold 2
  }
  {
    GptqTensors t = pack_gptq(q, GptqZeros::v2);
    t.qzeros = HostTensor::make(DType::i32, {2, 3});
    EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(t, GptqZeros::v2, true, 32); }, ErrorKind::format,
                             {"'qzeros' is i32 [2, 3]", "[2, 2]"}));
  }
  {
    GptqTensors t = pack_gptq(q, GptqZeros::v2);
    t.scales = HostTensor::make(DType::f32, {2, 16});
    EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(t, GptqZeros::v2, true, 32); }, ErrorKind::format,
                             {"'scales' is f32", "f16"}));
  }
  {
    GptqTensors t = pack_gptq(q, GptqZeros::v2);
    t.g_idx = HostTensor::make(DType::i32, {63});
    EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(t, GptqZeros::v2, true, 32); }, ErrorKind::format,
                             {"'g_idx'", "[64]"}));
  }
  {
    GptqTensors t = pack_gptq(q, GptqZeros::v2);
    t.g_idx->span<int32_t>()[0] = 9;
    EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(t, GptqZeros::v2, true, 32); }, ErrorKind::format,
                             "g_idx[0] = 9"));
  }
  EXPECT_TRUE(throws_error([&] { (void)unpack_gptq(pack_gptq(q, GptqZeros::v2), GptqZeros::v2, true, 48); },
                           ErrorKind::invalid_argument, "'group_size' = 48"));
  // N not a multiple of 8.
  const QuantizedLinear odd = test::random_layer(64, 12, 32, ZeroKind::sym, 6);
  EXPECT_TRUE(throws_error([&] { (void)pack_gptq(odd, GptqZeros::v1); }, ErrorKind::invalid_argument,
                           {"'N' = 12", "multiple of 8"}));
}

TEST(FormatErrors, FloatMinLayersNeedConversionForIntegerLayouts) {
  const QuantizedLinear fm = test::random_layer(64, 8, 32, ZeroKind::float_min_f32, 7);
  EXPECT_TRUE(throws_error([&] { (void)pack_gptq(fm, GptqZeros::v2); }, ErrorKind::invalid_argument,
                           {"'zero_point' = float_min", "to_zero_point"}));
  EXPECT_TRUE(throws_error([&] { (void)pack_awq(fm); }, ErrorKind::invalid_argument, "'zero_point' = float_min"));
  // Through the registry the conversion is attempted and refused with the reason.
  EXPECT_TRUE(throws_error([&] { (void)pack(fm, "gptq_v2"); }, ErrorKind::invalid_argument,
                           {"mins[", "-scale*z"}));
}

TEST(FormatErrors, AwqRefusesActOrder) {
  const QuantizedLinear q = test::random_layer(128, 8, 32, ZeroKind::asym, 8, /*act_order=*/true);
  EXPECT_TRUE(throws_error([&] { (void)pack_awq(q); }, ErrorKind::invalid_argument,
                           {"'g_idx'", "act-order", "sort_rows_by_group"}));
  EXPECT_TRUE(throws_error([&] { (void)pack(q, "awq"); }, ErrorKind::invalid_argument, "sort_rows_by_group"));
  EXPECT_TRUE(throws_error([&] { (void)pack_q4_1(to_zero_point(q, ZeroPoint::float_min)); },
                           ErrorKind::invalid_argument, {"'g_idx'", "sort_rows_by_group"}));
}

TEST(FormatErrors, AwqShapes) {
  const QuantizedLinear q = test::random_layer(64, 16, 32, ZeroKind::asym, 9);
  AwqTensors t = pack_awq(q);
  t.qzeros = HostTensor::make(DType::i32, {1, 2});
  EXPECT_TRUE(throws_error([&] { (void)unpack_awq(t, 32); }, ErrorKind::format, {"'qzeros'", "[2, 2]"}));
  EXPECT_TRUE(throws_error([&] { (void)pack_awq_qweight(q.codes, 64, 12); }, ErrorKind::invalid_argument,
                           {"'N' = 12", "multiple of 8"}));
  std::vector<uint8_t> bad = q.codes;
  bad[17] = 99;
  EXPECT_TRUE(throws_error([&] { (void)pack_awq_qweight(bad, 64, 16); }, ErrorKind::invalid_argument,
                           {"'codes[1, 1]' = 99", "0..15"}));
}

TEST(FormatErrors, Q4_1AndF16Mins) {
  const QuantizedLinear g64 = test::random_layer(128, 8, 64, ZeroKind::float_min_f16, 10);
  EXPECT_TRUE(throws_error([&] { (void)pack_q4_1(g64); }, ErrorKind::invalid_argument,
                           {"'group_size' = 64", "32 for GGUF Q4_1"}));
  const QuantizedLinear f32mins = test::random_layer(64, 8, 32, ZeroKind::float_min_f32, 11);
  EXPECT_TRUE(throws_error([&] { (void)pack_q4_1(f32mins); }, ErrorKind::invalid_argument,
                           {"mins[0, 0]", "not exact in f16", "allow_rounding"}));
  EXPECT_TRUE(throws_error([&] { (void)pack_float_zero(f32mins, {DType::f16, false}); },
                           ErrorKind::invalid_argument, {"mins[0, 0]", "allow_rounding"}));
  EXPECT_TRUE(throws_error([&] { (void)pack_float_zero(f32mins, {DType::bf16, false}); },
                           ErrorKind::invalid_argument, {"'mins_dtype' = bf16", "f32 or f16"}));
  const std::vector<BlockQ4_1> blocks(3);
  EXPECT_TRUE(throws_error([&] { (void)unpack_q4_1(blocks, 64, 2); }, ErrorKind::invalid_argument,
                           {"'blocks' has 3 blocks", "expected N * K/32 = 4"}));
  EXPECT_TRUE(throws_error([&] { (void)unpack_q4_1(blocks, 48, 2); }, ErrorKind::invalid_argument,
                           {"'K' = 48", "multiple of 32"}));
}

TEST(FormatErrors, UnknownLayoutListsTheKnownOnes) {
  const QuantizedLinear q = test::random_layer(64, 8, 32, ZeroKind::sym, 12);
  EXPECT_TRUE(throws_error([&] { (void)pack(q, "marlin_v9"); }, ErrorKind::invalid_argument,
                           {"'layout' = \"marlin_v9\"", "awq", "float_zero", "gptq", "gptq_v2", "q4_1"}));
  PackedLinear p = pack(q, "gptq");
  p.layout = "nope";
  EXPECT_TRUE(throws_error([&] { (void)unpack(p); }, ErrorKind::invalid_argument, "'layout' = \"nope\""));
  EXPECT_TRUE(throws_error([&] { (void)repack(pack(q, "gptq"), "nope"); }, ErrorKind::invalid_argument,
                           "'layout' = \"nope\""));
}

TEST(FormatErrors, PackedLinearMissingTensorOrWrongMetadata) {
  const QuantizedLinear q = test::random_layer(64, 8, 32, ZeroKind::sym, 13);
  PackedLinear p = pack(q, "gptq");
  p.tensors.erase("qzeros");
  EXPECT_TRUE(throws_error([&] { (void)unpack(p); }, ErrorKind::format,
                           {"no tensor 'qzeros'", "g_idx, qweight, scales"}));
  PackedLinear wrong = pack(q, "awq");
  wrong.N = 16;
  EXPECT_TRUE(throws_error([&] { (void)unpack(wrong); }, ErrorKind::format, {"N = 8", "metadata", "N = 16"}));
}

}  // namespace
}  // namespace lowbit::formats
