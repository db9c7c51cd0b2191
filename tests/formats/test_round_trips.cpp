// Pack/unpack round trips on random layers: every built-in layout x group size
// x zero-point data x act-order. A layout either gives back exactly the layer
// it was given, or refuses it with an Error (never a silently different layer).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>

#include "error_matchers.h"
#include "lowbit/formats/awq.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/formats/float_zero.h"
#include "lowbit/formats/gptq.h"
#include "lowbit/formats/layout_registry.h"
#include "random_layers.h"

namespace lowbit::formats {
namespace {

using test::ZeroKind;

constexpr int64_t kK = 512;  // a multiple of every group size
constexpr int64_t kN = 24;   // a multiple of 8 but not of 16

// Whether `layout` can hold a layer with this group size, zero data and act-order.
bool accepts(const std::string& layout, int group_size, ZeroKind kind, bool act_order) {
  const bool integer_zeros = kind == ZeroKind::sym || kind == ZeroKind::asym || kind == ZeroKind::asym_v1;
  if (layout == "gptq") return kind == ZeroKind::sym || kind == ZeroKind::asym_v1;
  if (layout == "gptq_v2") return integer_zeros;
  if (layout == "awq") return integer_zeros && !act_order;
  if (layout == "float_zero") return true;
  if (layout == "q4_1")
    return group_size == 32 && !act_order && kind != ZeroKind::float_min_f32;
  ADD_FAILURE() << "unknown layout " << layout;
  return false;
}

// The tensors and shapes each built-in layout must produce.
void expect_tensor_shapes(const PackedLinear& p, int64_t G) {
  auto shape = [&](const char* name) { return p.tensor(name).shape; };
  using S = std::vector<int64_t>;
  if (p.layout == "gptq" || p.layout == "gptq_v2") {
    EXPECT_EQ(shape("qweight"), (S{kK / 8, kN}));
    EXPECT_EQ(shape("qzeros"), (S{G, kN / 8}));
    EXPECT_EQ(shape("scales"), (S{G, kN}));
    EXPECT_EQ(shape("g_idx"), (S{kK}));
    EXPECT_EQ(p.tensor("qweight").dtype, DType::i32);
    EXPECT_EQ(p.tensor("scales").dtype, DType::f16);
  } else if (p.layout == "awq") {
    EXPECT_EQ(shape("qweight"), (S{kK, kN / 8}));
    EXPECT_EQ(shape("qzeros"), (S{G, kN / 8}));
    EXPECT_EQ(shape("scales"), (S{G, kN}));
    EXPECT_FALSE(p.has("g_idx"));
  } else if (p.layout == "float_zero") {
    EXPECT_EQ(shape("qweight"), (S{kK / 8, kN}));
    EXPECT_EQ(shape("scales"), (S{G, kN}));
    EXPECT_EQ(shape("mins"), (S{G, kN}));
    EXPECT_EQ(p.tensor("mins").dtype, DType::f32);
  } else if (p.layout == "q4_1") {
    EXPECT_EQ(shape("blocks"), (S{kN, kK / 32, 20}));
    EXPECT_EQ(p.tensor("blocks").dtype, DType::u8);
  }
}

using Param = std::tuple<std::string, int, ZeroKind, bool>;

class LayoutRoundTrip : public ::testing::TestWithParam<Param> {};

TEST_P(LayoutRoundTrip, GivesBackTheSameLayerOrRefuses) {
  const auto& [layout, group_size, kind, act_order_requested] = GetParam();
  const bool act_order = act_order_requested && group_size != -1;  // per channel has one group
  const QuantizedLinear layer =
      test::random_layer(kK, kN, group_size, kind, 1000 + static_cast<uint64_t>(group_size) * 7 +
                                                       static_cast<uint64_t>(kind), act_order);
  ASSERT_NO_THROW(layer.validate());
  if (!accepts(layout, group_size, kind, act_order)) {
    EXPECT_TRUE(test::throws_error([&] { (void)pack(layer, layout); }, ErrorKind::invalid_argument,
                                   "invalid argument"));
    return;
  }
  const PackedLinear packed = pack(layer, layout);
  EXPECT_EQ(packed.layout, layout);
  EXPECT_EQ(packed.K, kK);
  EXPECT_EQ(packed.N, kN);
  EXPECT_EQ(packed.group_size, group_size);
  EXPECT_EQ(packed.zero_point, layer.zero_point);
  expect_tensor_shapes(packed, layer.num_groups());
  // 4 bits per weight in the code tensor.
  const std::string code_tensor = layout == "q4_1" ? "blocks" : "qweight";
  if (layout != "q4_1") {
    EXPECT_EQ(packed.tensor(code_tensor).bytes.size(), size_t(kK * kN / 2));
  }

  const QuantizedLinear back = unpack(packed);
  EXPECT_EQ(back.codes, layer.codes);
  EXPECT_EQ(back.scales, layer.scales);
  EXPECT_EQ(back.zeros, layer.zeros);
  EXPECT_EQ(back.mins, layer.mins);
  EXPECT_EQ(back.g_idx, layer.g_idx);
  EXPECT_EQ(back.zero_point, layer.zero_point);
  EXPECT_EQ(back, layer);

  // Repacking into the same layout gives the same bytes.
  const PackedLinear again = repack(packed, layout);
  EXPECT_EQ(again.tensors, packed.tensors);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto& [layout, group_size, kind, act_order] = info.param;
  return layout + "_g" + (group_size < 0 ? std::string("pc") : std::to_string(group_size)) + "_" +
         test::zero_kind_name(kind) + (act_order ? "_actorder" : "");
}

INSTANTIATE_TEST_SUITE_P(
    AllLayouts, LayoutRoundTrip,
    ::testing::Combine(::testing::Values("gptq", "gptq_v2", "awq", "float_zero", "q4_1"),
                       ::testing::Values(32, 64, 128, 256, -1),
                       ::testing::ValuesIn(test::kAllZeroKinds), ::testing::Bool()),
    param_name);

// The format-specific entry points, with each GPTQ convention and f16 mins.
TEST(FormatRoundTrip, GptqEachConventionAndSymmetryFlag) {
  for (int group_size : kSupportedGroupSizes)
    for (GptqZeros conv : {GptqZeros::v1, GptqZeros::v2})
      for (ZeroKind kind : {ZeroKind::sym, ZeroKind::asym_v1, ZeroKind::asym}) {
        if (conv == GptqZeros::v1 && kind == ZeroKind::asym) continue;  // refused, see test_errors
        SCOPED_TRACE(std::string(gptq_zeros_name(conv)) + " " + test::zero_kind_name(kind) +
                     " g" + std::to_string(group_size));
        const QuantizedLinear layer = test::random_layer(256, 40, group_size, kind, 7, group_size > 0);
        const GptqTensors t = pack_gptq(layer, conv);
        const QuantizedLinear back =
            unpack_gptq(t, conv, layer.zero_point == ZeroPoint::symmetric, group_size);
        EXPECT_EQ(back, layer);
        // Without g_idx, rows are read in group order.
        GptqTensors no_gidx = t;
        no_gidx.g_idx.reset();
        const QuantizedLinear plain =
            unpack_gptq(no_gidx, conv, layer.zero_point == ZeroPoint::symmetric, group_size);
        EXPECT_TRUE(plain.g_idx.empty());
        EXPECT_EQ(plain.codes, layer.codes);
      }
}

TEST(FormatRoundTrip, AwqAndFloatZeroAndQ4_1) {
  for (int group_size : kSupportedGroupSizes) {
    SCOPED_TRACE(group_size);
    const QuantizedLinear asym = test::random_layer(256, 16, group_size, ZeroKind::asym, 11);
    EXPECT_EQ(unpack_awq(pack_awq(asym), group_size), asym);

    for (ZeroKind kind : {ZeroKind::float_min_f16, ZeroKind::float_min_f32}) {
      const QuantizedLinear fm = test::random_layer(256, 12, group_size, kind, 12, group_size > 0);
      EXPECT_EQ(unpack_float_zero(pack_float_zero(fm), group_size), fm);
    }
    // f16 mins hold f16-exact mins exactly.
    const QuantizedLinear fm16 = test::random_layer(256, 12, group_size, ZeroKind::float_min_f16, 13);
    const FloatZeroTensors t16 = pack_float_zero(fm16, {DType::f16, false});
    EXPECT_EQ(t16.mins.dtype, DType::f16);
    EXPECT_EQ(unpack_float_zero(t16, group_size), fm16);
  }
  const QuantizedLinear q41 = test::random_layer(256, 5, 32, ZeroKind::float_min_f16, 14);
  EXPECT_EQ(unpack_q4_1(pack_q4_1(q41), 256, 5), q41);
}

TEST(FormatRoundTrip, F16MinsWithRoundingAllowedRoundToNearest) {
  const QuantizedLinear fm = test::random_layer(64, 8, 32, ZeroKind::float_min_f32, 15);
  const FloatZeroTensors t = pack_float_zero(fm, {DType::f16, /*allow_rounding=*/true});
  const QuantizedLinear back = unpack_float_zero(t, 32);
  EXPECT_EQ(back.codes, fm.codes);
  for (size_t i = 0; i < fm.mins.size(); ++i)
    EXPECT_EQ(back.mins[i], f16_to_float(float_to_f16(fm.mins[i])));
  const std::vector<BlockQ4_1> blocks = pack_q4_1(fm, /*allow_rounding=*/true);
  EXPECT_EQ(unpack_q4_1(blocks, 64, 8).mins, back.mins);
}

}  // namespace
}  // namespace lowbit::formats
