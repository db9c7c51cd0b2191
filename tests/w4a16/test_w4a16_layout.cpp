// The tiled W4A16 layout (CPU side, runs in CI): prepare -> unpack gives the
// input back for every zero-point kind, group size, act-order and awkward
// shape, and hand-placed codes land in the nibble the kernel reads.
#include <gtest/gtest.h>

#include "error_matchers.h"
#include "lowbit/formats/layout_registry.h"
#include "lowbit/w4a16/w4a16_layout.h"
#include "random_layers.h"

namespace lowbit {
namespace {

using test::ZeroKind;

TEST(W4A16Layout, RoundTripsEveryKindGroupAndShape) {
  struct Shape { int64_t K, N; };
  uint64_t seed = 1;
  for (const Shape shape : {Shape{64, 64}, Shape{256, 136}, Shape{96, 8}, Shape{512, 200}, Shape{3584, 72}})
    for (int group : {32, 64, 128, 256, -1}) {
      if (group > 0 && shape.K % group != 0) continue;
      for (ZeroKind kind : {ZeroKind::sym, ZeroKind::asym, ZeroKind::float_min_f16})
        for (bool act_order : {false, true}) {
          SCOPED_TRACE(testing::Message() << "K=" << shape.K << " N=" << shape.N << " g=" << group << " "
                                          << test::zero_kind_name(kind) << " act_order=" << act_order);
          const auto layer = test::random_layer(shape.K, shape.N, group, kind, seed++, act_order);
          const auto packed = pack_w4a16_tiled(layer, DType::f16, /*allow_rounding=*/false);
          EXPECT_EQ(packed.has("perm"), !layer.has_trivial_g_idx());
          EXPECT_EQ(unpack_w4a16_tiled(packed), layer);
          if (kind != ZeroKind::float_min_f16) {  // random scales have 7 significant bits: exact in bf16
            EXPECT_EQ(unpack_w4a16_tiled(pack_w4a16_tiled(layer, DType::bf16)), layer);
          }
        }
    }
}

TEST(W4A16Layout, CodesLandWhereTheKernelReadsThem) {
  // One code set to 15 at (k, n); every other code 0. The word and nibble that
  // hold it follow the table in w4a16_layout.h.
  for (auto [k, n] : {std::pair<int64_t, int64_t>{0, 0}, {1, 0}, {8, 0}, {9, 3}, {17, 8}, {63, 15}, {64, 16},
                      {70, 63}, {130, 100}}) {
    auto layer = formats::QuantizedLinear::allocate(192, 128, 64, formats::ZeroPoint::symmetric);
    for (auto& s : layer.scales) s = float_to_f16(1.0f);
    layer.codes[static_cast<size_t>(k * 128 + n)] = 15;
    const auto packed = pack_w4a16_tiled(layer, DType::f16);
    const auto words = packed.tensor("qweight").span<uint32_t>();
    const int64_t nb = n / 64, i = k / 64, w = (n % 64) / 16, c = n % 16, r = k % 64;
    const int word = static_cast<int>(r / 16), within = static_cast<int>(r % 16);
    const int t = (within % 8) / 2, half = within % 2, upper_k = within >= 8 ? 1 : 0;
    const int g = static_cast<int>(c % 8), nsub = c >= 8 ? 1 : 0;
    const int lane = g * 4 + t, slot = half * 4 + nsub * 2 + upper_k;
    const int64_t NB = 128 / 64;
    const size_t index = static_cast<size_t>((((i * NB + nb) * 4 + w) * 32 + lane) * 4 + word);
    for (size_t x = 0; x < words.size(); ++x)
      EXPECT_EQ(words[x], x == index ? 0xFu << (4 * slot) : 0u) << "k=" << k << " n=" << n << " word " << x;
  }
}

TEST(W4A16Layout, ScalesAndZerosArePairedPerColumn) {
  auto layer = test::random_layer(128, 64, 64, ZeroKind::asym, 11);
  const auto packed = pack_w4a16_tiled(layer, DType::f16);
  const auto sz = packed.tensor("scale_zero").span<uint32_t>();
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t n = 0; n < 64; ++n) {
      const uint32_t v = sz[static_cast<size_t>(g * 64 + n)];
      EXPECT_EQ(v & 0xFFFFu, layer.scales[static_cast<size_t>(g * 64 + n)].bits);
      EXPECT_EQ(f16_to_float(f16::from_bits(static_cast<uint16_t>(v >> 16))),
                static_cast<float>(layer.zeros[static_cast<size_t>(g * 64 + n)]));
    }
}

TEST(W4A16Layout, RegisteredInTheFormatsRegistry) {
  register_w4a16_layouts();
  const auto layer = test::random_layer(128, 64, 32, ZeroKind::sym, 3);
  const auto gptq = formats::pack(layer, "gptq_v2");
  const auto tiled = formats::repack(gptq, "w4a16_tiled_f16");
  EXPECT_EQ(tiled.layout, "w4a16_tiled_f16");
  EXPECT_EQ(formats::unpack(tiled), layer);
  EXPECT_TRUE(test::throws_error([&] { (void)w4a16_layout_name(DType::f32); }, ErrorKind::invalid_argument,
                                 {"act_dtype", "f32"}));
  auto float_layer = test::random_layer(128, 64, 64, ZeroKind::float_min_f32, 4);
  EXPECT_TRUE(test::throws_error([&] { (void)pack_w4a16_tiled(float_layer, DType::f16, false); },
                                 ErrorKind::invalid_argument, {"offset m", "allow_rounding"}));
}

}  // namespace
}  // namespace lowbit
