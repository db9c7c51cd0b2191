// Zero-point conversions, cross-layout conversion identities, and the
// act-order row sort contract.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "error_matchers.h"
#include "lowbit/formats/convert.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/formats/layout_registry.h"
#include "random_layers.h"
#include "tolerances.h"

namespace lowbit::formats {
namespace {

using test::ZeroKind;

std::vector<float> dense(const QuantizedLinear& q) {
  std::vector<float> w(static_cast<size_t>(q.K * q.N));
  dequantize_ref(q, w.data());
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ZeroPointConversion, IntegerFloatMinSymmetricAreExactBothWays) {
  for (int group_size : kSupportedGroupSizes) {
    SCOPED_TRACE(group_size);
    const QuantizedLinear asym = test::random_layer(256, 16, group_size, ZeroKind::asym, 21);
    const QuantizedLinear fm = to_zero_point(asym, ZeroPoint::float_min);
    EXPECT_EQ(fm.zero_point, ZeroPoint::float_min);
    EXPECT_TRUE(fm.zeros.empty());
    EXPECT_TRUE(same_bits(dense(fm), dense(asym)));
    EXPECT_EQ(to_zero_point(fm, ZeroPoint::integer), asym);

    const QuantizedLinear sym = test::random_layer(256, 16, group_size, ZeroKind::sym, 22);
    const QuantizedLinear sym_int = to_zero_point(sym, ZeroPoint::integer);
    for (uint8_t z : sym_int.zeros) ASSERT_EQ(z, 8);
    const QuantizedLinear sym_fm = to_zero_point(sym, ZeroPoint::float_min);
    EXPECT_TRUE(same_bits(dense(sym_int), dense(sym)));
    EXPECT_TRUE(same_bits(dense(sym_fm), dense(sym)));
    EXPECT_EQ(to_zero_point(sym_int, ZeroPoint::symmetric), sym);
    EXPECT_EQ(to_zero_point(sym_fm, ZeroPoint::symmetric), sym);
    EXPECT_EQ(to_zero_point(sym_fm, ZeroPoint::integer), sym_int);
  }
}

TEST(ZeroPointConversion, DequantIsBitIdenticalToTheFormulaInEachConvention) {
  const QuantizedLinear asym = test::random_layer(64, 8, 32, ZeroKind::asym, 23);
  const QuantizedLinear fm = to_zero_point(asym, ZeroPoint::float_min);
  for (int64_t k = 0; k < 64; ++k)
    for (int64_t n = 0; n < 8; ++n) {
      const auto gi = static_cast<size_t>((k / 32) * 8 + n);
      const float s = f16_to_float(asym.scales[gi]);
      const float q = asym.codes[static_cast<size_t>(k * 8 + n)];
      const float z = asym.zeros[gi];
      // Exact in fp32: s has 11 significant bits and |q - z| <= 15.
      ASSERT_EQ(asym.dequant(k, n), s * (q - z));
      ASSERT_EQ(fm.dequant(k, n), std::fma(s, q, fm.mins[gi]));
    }
}

TEST(ZeroPointConversion, RefusesWhatIsNotRepresentable) {
  const QuantizedLinear fm = test::random_layer(64, 8, 32, ZeroKind::float_min_f32, 24);
  EXPECT_TRUE(test::throws_error([&] { (void)to_zero_point(fm, ZeroPoint::integer); },
                                 ErrorKind::invalid_argument, {"mins[", "-scale*z", "integer"}));
  EXPECT_TRUE(test::throws_error([&] { (void)to_zero_point(fm, ZeroPoint::symmetric); },
                                 ErrorKind::invalid_argument, "mins["));
  const QuantizedLinear asym = test::random_layer(64, 8, 32, ZeroKind::asym, 25);
  EXPECT_TRUE(test::throws_error([&] { (void)to_zero_point(asym, ZeroPoint::symmetric); },
                                 ErrorKind::invalid_argument, {"zeros[", "z = 8"}));
  // m = -s*z for a non-integer z (z = 2.5).
  QuantizedLinear half = QuantizedLinear::allocate(8, 8, -1, ZeroPoint::float_min);
  for (auto& s : half.scales) s = float_to_f16(0.5f);
  for (auto& m : half.mins) m = -1.25f;
  EXPECT_TRUE(test::throws_error([&] { (void)to_zero_point(half, ZeroPoint::integer); },
                                 ErrorKind::invalid_argument, {"mins[0, 0]", "2.5"}));
  // z = 16 is out of range.
  for (auto& m : half.mins) m = -8.0f;
  EXPECT_TRUE(test::throws_error([&] { (void)to_zero_point(half, ZeroPoint::integer); },
                                 ErrorKind::invalid_argument, "mins[0, 0]"));
  // z = 15 is fine.
  for (auto& m : half.mins) m = -7.5f;
  EXPECT_EQ(to_zero_point(half, ZeroPoint::integer).zeros, std::vector<uint8_t>(8, 15));
}

// gptq -> awq -> float_zero -> gptq_v2 -> gptq gives back the same tensors, and
// every intermediate layer dequantizes to the same bits.
TEST(CrossLayout, ChainGivesBackTheSameTensorsAndBits) {
  for (int group_size : kSupportedGroupSizes)
    for (ZeroKind kind : {ZeroKind::sym, ZeroKind::asym_v1}) {
      SCOPED_TRACE(std::to_string(group_size) + " " + test::zero_kind_name(kind));
      const QuantizedLinear layer = test::random_layer(512, 72, group_size, kind, 31);
      const std::vector<float> expected = dense(layer);
      const PackedLinear start = pack(layer, "gptq");
      PackedLinear p = start;
      for (const char* layout : {"awq", "float_zero", "gptq_v2", "gptq"}) {
        p = repack(p, layout);
        ASSERT_EQ(p.layout, layout);
        const QuantizedLinear q = unpack(p);
        EXPECT_EQ(q, layer) << layout;
        EXPECT_TRUE(same_bits(dense(q), expected)) << layout;
        // The layout's own natural convention dequantizes identically too.
        EXPECT_TRUE(same_bits(dense(to_zero_point(q, ZeroPoint::float_min)), expected)) << layout;
      }
      EXPECT_EQ(p.tensors, start.tensors);
      EXPECT_EQ(p.zero_point, start.zero_point);
    }
}

TEST(CrossLayout, Q4_1JoinsTheChainForGroupSize32) {
  const QuantizedLinear layer = test::random_layer(256, 16, 32, ZeroKind::asym, 32);
  const PackedLinear start = pack(layer, "gptq_v2");
  const PackedLinear q41 = repack(start, "q4_1");
  EXPECT_TRUE(same_bits(dense(unpack(q41)), dense(layer)));
  EXPECT_EQ(repack(repack(q41, "awq"), "gptq_v2").tensors, start.tensors);
}

TEST(CrossLayout, FloatMinLayerRepacksAsIntegerWhenItsMinsAreMinusScaleTimesZero) {
  const QuantizedLinear asym = test::random_layer(128, 8, 64, ZeroKind::asym_v1, 33);
  const QuantizedLinear fm = to_zero_point(asym, ZeroPoint::float_min);
  const PackedLinear g = pack(fm, "gptq");
  EXPECT_EQ(g.zero_point, ZeroPoint::float_min);
  EXPECT_EQ(unpack(g), fm);
  EXPECT_EQ(pack(asym, "gptq").tensors, g.tensors);
}

// ---- act-order --------------------------------------------------------------

TEST(ActOrder, UnpackWithRandomPermutationGIdxUsesEachRowsGroup) {
  const QuantizedLinear layer = test::random_layer(256, 16, 32, ZeroKind::asym_v1, 41, true);
  ASSERT_FALSE(layer.has_trivial_g_idx());
  const QuantizedLinear back = unpack(pack(layer, "gptq"));
  ASSERT_EQ(back.g_idx, layer.g_idx);
  const std::vector<float> w = dense(back);
  for (int64_t k = 0; k < 256; ++k)
    for (int64_t n = 0; n < 16; ++n) {
      const auto g = static_cast<size_t>(layer.g_idx[static_cast<size_t>(k)]);
      const float s = f16_to_float(layer.scales[g * 16 + static_cast<size_t>(n)]);
      const float z = layer.zeros[g * 16 + static_cast<size_t>(n)];
      ASSERT_EQ(w[static_cast<size_t>(k * 16 + n)],
                s * (static_cast<float>(layer.codes[static_cast<size_t>(k * 16 + n)]) - z));
    }
}

TEST(ActOrder, SortRowsByGroupContract) {
  for (int group_size : {32, 64, 128}) {
    SCOPED_TRACE(group_size);
    const int64_t K = 256, N = 24, M = 3;
    const QuantizedLinear layer = test::random_layer(K, N, group_size, ZeroKind::asym, 42, true);
    const SortedRows s = sort_rows_by_group(layer);
    // perm is a permutation, stable, grouping rows.
    std::vector<int32_t> sorted_perm = s.perm;
    std::sort(sorted_perm.begin(), sorted_perm.end());
    std::vector<int32_t> identity(static_cast<size_t>(K));
    std::iota(identity.begin(), identity.end(), 0);
    ASSERT_EQ(sorted_perm, identity);
    EXPECT_TRUE(s.sorted.g_idx.empty());
    for (int64_t i = 0; i < K; ++i) {
      const int32_t src = s.perm[static_cast<size_t>(i)];
      EXPECT_EQ(layer.g_idx[static_cast<size_t>(src)], i / group_size);
      if (i > 0 && i % group_size != 0) {
        EXPECT_LT(s.perm[static_cast<size_t>(i - 1)], src);  // stable
      }
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(s.sorted.codes[static_cast<size_t>(i * N + n)],
                  layer.codes[static_cast<size_t>(src * N + n)]);
    }
    EXPECT_EQ(s.sorted.scales, layer.scales);
    EXPECT_EQ(s.sorted.zeros, layer.zeros);
    // Numerically: y = x[:, perm] * W_sorted equals y = x * W.
    std::mt19937_64 rng(43);
    std::normal_distribution<double> normal;
    std::vector<double> x(static_cast<size_t>(M * K));
    for (auto& v : x) v = normal(rng);
    const std::vector<float> w = dense(layer), ws = dense(s.sorted);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double y = 0, y_sorted = 0, magnitude = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double xw = x[static_cast<size_t>(m * K + k)] * w[static_cast<size_t>(k * N + n)];
          y += xw;
          magnitude += std::fabs(xw);
          y_sorted += x[static_cast<size_t>(m * K + s.perm[static_cast<size_t>(k)])] *
                      ws[static_cast<size_t>(k * N + n)];
        }
        EXPECT_NEAR(y_sorted, y, test::kPermutedSumRtol * magnitude);
      }
    // The sorted layer fits layouts without g_idx.
    EXPECT_NO_THROW((void)pack(s.sorted, "awq"));
  }
}

TEST(ActOrder, SortOfATrivialLayerIsTheIdentity) {
  QuantizedLinear layer = test::random_layer(64, 8, 32, ZeroKind::sym, 44);
  layer.g_idx.resize(64);
  for (int64_t k = 0; k < 64; ++k) layer.g_idx[static_cast<size_t>(k)] = static_cast<int32_t>(k / 32);
  const SortedRows s = sort_rows_by_group(layer);
  for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(s.perm[static_cast<size_t>(k)], k);
  EXPECT_TRUE(s.sorted.g_idx.empty());
  EXPECT_EQ(s.sorted.codes, layer.codes);
}

TEST(ActOrder, SortRefusesGroupsOfTheWrongSize) {
  QuantizedLinear layer = test::random_layer(64, 8, 32, ZeroKind::sym, 45);
  layer.g_idx.assign(64, 0);
  layer.g_idx[5] = 1;  // group 0 has 63 rows, group 1 has 1
  EXPECT_TRUE(test::throws_error([&] { (void)sort_rows_by_group(layer); },
                                 ErrorKind::invalid_argument, {"g_idx", "group 0 has 63 rows"}));
}

}  // namespace
}  // namespace lowbit::formats
