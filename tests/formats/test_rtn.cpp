// Round-to-nearest quantizer: error bounds, AutoGPTQ semantics on hand-made
// groups, input dtypes and orientations.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "error_matchers.h"
#include "lowbit/formats/convert.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/formats/gptq.h"
#include "lowbit/formats/layout_registry.h"
#include "lowbit/formats/rtn.h"
#include "tolerances.h"

namespace lowbit::formats {
namespace {

// Random weights [N, K] (out_in), normal with std 0.02; with outliers, every
// 7th column (output feature) is 50x larger and has a few spikes.
std::vector<float> random_weights(int64_t N, int64_t K, bool outliers, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      float v = normal(rng);
      if (outliers && n % 7 == 3) v *= 50.0f;
      if (outliers && (k * 31 + n) % 97 == 0) v = (k % 2 ? 4.0f : -6.0f);
      w[static_cast<size_t>(n * K + k)] = v;
    }
  return w;
}

struct Mode {
  const char* name;
  RtnOptions options;
};

const Mode kModes[] = {
    {"symmetric", {128, ZeroPoint::symmetric, 0, false}},
    {"integer", {128, ZeroPoint::integer, 0, false}},
    {"integer_min_zero_1", {128, ZeroPoint::integer, 1, false}},
    {"float_min", {128, ZeroPoint::float_min, 0, false}},
    {"float_min_f16_mins", {128, ZeroPoint::float_min, 0, true}},
};

// Checks |w - dequant| <= (0.5 + slack)*s + abs_slack for every weight and
// returns the largest error in units of s.
double check_bound(const std::vector<float>& w_nk, const QuantizedLinear& q) {
  std::vector<float> dq(static_cast<size_t>(q.K * q.N));
  dequantize_ref(q, dq.data());
  double worst = 0;
  int failures = 0;
  for (int64_t k = 0; k < q.K; ++k)
    for (int64_t n = 0; n < q.N; ++n) {
      const double s = f16_to_float(q.scales[static_cast<size_t>(q.group_of(k) * q.N + n)]);
      const double w = w_nk[static_cast<size_t>(n * q.K + k)];
      const double err = std::fabs(w - dq[static_cast<size_t>(k * q.N + n)]);
      const double bound = (0.5 + test::kRtnScaleSlack) * s + test::kRtnAbsSlack;
      worst = std::max(worst, err / s);
      if (err > bound && ++failures <= 10)
        ADD_FAILURE() << "|w - dequant| = " << err << " > " << bound << " at k=" << k << " n=" << n
                      << " (w = " << w << ", s = " << s << ")";
    }
  return worst;
}

TEST(Rtn, ErrorBoundForEveryModeAndGroupSize) {
  const int64_t N = 40, K = 512;
  for (bool outliers : {false, true}) {
    const std::vector<float> w = random_weights(N, K, outliers, outliers ? 2 : 1);
    const TensorView view = TensorView::contiguous(const_cast<float*>(w.data()), DType::f32, {N, K});
    for (const Mode& mode : kModes)
      for (int group_size : kSupportedGroupSizes) {
        SCOPED_TRACE(std::string(mode.name) + " g" + std::to_string(group_size) +
                     (outliers ? " outliers" : " normal"));
        RtnOptions o = mode.options;
        o.group_size = group_size;
        const QuantizedLinear q = quantize_rtn(view, WeightOrientation::out_in, o);
        ASSERT_NO_THROW(q.validate());
        EXPECT_EQ(q.zero_point, o.zero_point);
        EXPECT_EQ(q.K, K);
        EXPECT_EQ(q.N, N);
        EXPECT_TRUE(q.g_idx.empty());
        const double worst = check_bound(w, q);
        EXPECT_GE(worst, test::kRtnMinUsefulError);
        for (uint8_t z : q.zeros) ASSERT_GE(z, o.min_zero);
        if (o.f16_mins) {
          for (float m : q.mins) ASSERT_EQ(f16_to_float(float_to_f16(m)), m);
        }
      }
  }
}

TEST(Rtn, MinZeroOneMakesGptqV1Possible) {
  // All-positive columns give z = 0 without min_zero.
  std::vector<float> w(8 * 64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f + 0.001f * static_cast<float>(i % 64);
  const TensorView view = TensorView::contiguous(w.data(), DType::f32, {8, 64});
  const QuantizedLinear plain = quantize_rtn(view, WeightOrientation::out_in, {64, ZeroPoint::integer, 0, false});
  EXPECT_EQ(plain.zeros[0], 0);
  EXPECT_THROW((void)pack_gptq(plain, GptqZeros::v1), Error);
  const QuantizedLinear v1ok = quantize_rtn(view, WeightOrientation::out_in, {64, ZeroPoint::integer, 1, false});
  EXPECT_EQ(v1ok.zeros[0], 1);
  // s = xmax/14 so that the top code 15 reaches xmax.
  EXPECT_EQ(v1ok.scales[0], float_to_f16(w[63] / 14.0f));
  EXPECT_EQ(unpack_gptq(pack_gptq(v1ok, GptqZeros::v1), GptqZeros::v1, false, 64), v1ok);
  check_bound(w, v1ok);
}

// AutoGPTQ semantics on one hand-made group of 32 values (one column).
TEST(Rtn, HandMadeGroupsFollowAutoGptq) {
  std::vector<float> w(32, 0.0f);
  w[0] = -0.5f;
  w[1] = 1.0f;
  w[2] = 0.25f;
  const TensorView view = TensorView::contiguous(w.data(), DType::f32, {1, 32});
  {  // asymmetric: xmin = -0.5, xmax = 1.0, s = 0.1 -> f16 0.0999755859375, z = round(5.0012) = 5
    const QuantizedLinear q = quantize_rtn(view, WeightOrientation::out_in, {32, ZeroPoint::integer, 0, false});
    const float s = f16_to_float(float_to_f16(0.1f));
    EXPECT_EQ(q.scales[0], float_to_f16(0.1f));
    EXPECT_EQ(q.zeros[0], 5);
    EXPECT_EQ(q.codes[0 * 1], static_cast<uint8_t>(std::nearbyint(-0.5f / s) + 5));  // 0
    EXPECT_EQ(q.codes[1], 15);                                                        // 10 + 5
    EXPECT_EQ(q.codes[2], static_cast<uint8_t>(std::nearbyint(0.25f / s) + 5));     // round(2.5006) + 5 = 8
    EXPECT_EQ(q.codes[3], 5);  // w = 0 -> z
  }
  {  // symmetric: amax = 1.0, s = 2/15, z = 8; 1.0/s = 7.5 (f16 s slightly below) -> 8 -> clamp 15
    const QuantizedLinear q = quantize_rtn(view, WeightOrientation::out_in, {32, ZeroPoint::symmetric, 0, false});
    EXPECT_EQ(q.scales[0], float_to_f16(2.0f / 15.0f));
    EXPECT_EQ(q.codes[1], 15);
    EXPECT_EQ(q.codes[3], 8);
    EXPECT_TRUE(q.zeros.empty());
  }
  {  // float_min: m = -0.5, s = 1.5/15 = 0.1
    const QuantizedLinear q = quantize_rtn(view, WeightOrientation::out_in, {32, ZeroPoint::float_min, 0, false});
    EXPECT_EQ(q.mins[0], -0.5f);
    EXPECT_EQ(q.scales[0], float_to_f16(0.1f));
    EXPECT_EQ(q.codes[0], 0);
    EXPECT_EQ(q.codes[1], 15);
  }
}

TEST(Rtn, AllZeroGroupGetsScaleOne) {
  std::vector<float> w(2 * 64, 0.0f);
  w[64 + 3] = 0.5f;  // column 1 is not all zero
  const TensorView view = TensorView::contiguous(w.data(), DType::f32, {2, 64});
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    RtnOptions o = mode.options;
    o.group_size = 32;
    const QuantizedLinear q = quantize_rtn(view, WeightOrientation::out_in, o);
    EXPECT_EQ(f16_to_float(q.scales[0]), 1.0f);  // group 0, column 0
    EXPECT_EQ(f16_to_float(q.scales[2]), 1.0f);  // group 1, column 0
    EXPECT_NE(f16_to_float(q.scales[1]), 1.0f);  // group 0, column 1
    for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(q.dequant(k, 0), 0.0f);
    check_bound(w, q);
  }
}

TEST(Rtn, Fp16AndBf16InputsQuantizeLikeTheirFp32Values) {
  const int64_t N = 24, K = 256;
  const std::vector<float> w = random_weights(N, K, true, 5);
  std::vector<f16> h(w.size());
  std::vector<bf16> b(w.size());
  std::vector<float> hf(w.size()), bf(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    h[i] = float_to_f16(w[i]);
    b[i] = float_to_bf16(w[i]);
    hf[i] = f16_to_float(h[i]);
    bf[i] = bf16_to_float(b[i]);
  }
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    const QuantizedLinear qh =
        quantize_rtn(TensorView::contiguous(h.data(), DType::f16, {N, K}), WeightOrientation::out_in, mode.options);
    const QuantizedLinear qhf =
        quantize_rtn(TensorView::contiguous(hf.data(), DType::f32, {N, K}), WeightOrientation::out_in, mode.options);
    EXPECT_EQ(qh, qhf);
    check_bound(hf, qh);
    const QuantizedLinear qb =
        quantize_rtn(TensorView::contiguous(b.data(), DType::bf16, {N, K}), WeightOrientation::out_in, mode.options);
    const QuantizedLinear qbf =
        quantize_rtn(TensorView::contiguous(bf.data(), DType::f32, {N, K}), WeightOrientation::out_in, mode.options);
    EXPECT_EQ(qb, qbf);
    check_bound(bf, qb);
  }
}

TEST(Rtn, InOutAndStridedViewsGiveTheSameLayer) {
  const int64_t N = 16, K = 128;
  const std::vector<float> w = random_weights(N, K, false, 6);
  std::vector<float> t(w.size());  // [K, N]
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) t[static_cast<size_t>(k * N + n)] = w[static_cast<size_t>(n * K + k)];
  const RtnOptions o{64, ZeroPoint::integer, 0, false};
  const QuantizedLinear a = quantize_rtn(TensorView::contiguous(const_cast<float*>(w.data()), DType::f32, {N, K}),
                                         WeightOrientation::out_in, o);
  const QuantizedLinear b = quantize_rtn(TensorView::contiguous(t.data(), DType::f32, {K, N}),
                                         WeightOrientation::in_out, o);
  EXPECT_EQ(a, b);
  // The [K, N] data seen as a transposed (strided) [N, K] view.
  TensorView transposed = TensorView::contiguous(t.data(), DType::f32, {N, K});
  transposed.strides = {1, N};
  EXPECT_EQ(quantize_rtn(transposed, WeightOrientation::out_in, o), a);
  // Rows padded to a larger stride.
  std::vector<float> padded(static_cast<size_t>(N * (K + 5)), NAN);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      padded[static_cast<size_t>(n * (K + 5) + k)] = w[static_cast<size_t>(n * K + k)];
  TensorView pv = TensorView::contiguous(padded.data(), DType::f32, {N, K});
  pv.strides = {K + 5, 1};
  EXPECT_EQ(quantize_rtn(pv, WeightOrientation::out_in, o), a);
}

TEST(Rtn, QuantizedLayerPacksIntoEveryIntegerLayout) {
  const std::vector<float> w = random_weights(32, 256, true, 8);
  const TensorView view = TensorView::contiguous(const_cast<float*>(w.data()), DType::f32, {32, 256});
  const QuantizedLinear q = quantize_rtn(view, WeightOrientation::out_in, {128, ZeroPoint::integer, 1, false});
  for (const char* layout : {"gptq", "gptq_v2", "awq", "float_zero"}) EXPECT_EQ(unpack(pack(q, layout)), q) << layout;
  const QuantizedLinear q41 =
      quantize_rtn(view, WeightOrientation::out_in, {32, ZeroPoint::float_min, 0, true});
  EXPECT_EQ(unpack(pack(q41, "q4_1")), q41);
}

TEST(Rtn, Errors) {
  std::vector<float> w(8 * 64, 0.1f);
  const TensorView view = TensorView::contiguous(w.data(), DType::f32, {8, 64});
  EXPECT_TRUE(test::throws_error(
      [&] { (void)quantize_rtn(view, WeightOrientation::out_in, {48, ZeroPoint::integer, 0, false}); },
      ErrorKind::invalid_argument, {"'group_size' = 48", "32, 64, 128, 256"}));
  EXPECT_TRUE(test::throws_error(
      [&] { (void)quantize_rtn(view, WeightOrientation::out_in, {128, ZeroPoint::integer, 0, false}); },
      ErrorKind::invalid_argument, {"'K' = 64", "group_size = 128"}));
  EXPECT_TRUE(test::throws_error(
      [&] { (void)quantize_rtn(view, WeightOrientation::out_in, {32, ZeroPoint::integer, 2, false}); },
      ErrorKind::invalid_argument, "'min_zero' = 2"));
  const TensorView bad_k = TensorView::contiguous(w.data(), DType::f32, {4, 100});
  EXPECT_TRUE(test::throws_error(
      [&] { (void)quantize_rtn(bad_k, WeightOrientation::out_in, {-1, ZeroPoint::integer, 0, false}); },
      ErrorKind::invalid_argument, {"'K' = 100", "multiple of 8"}));
  const TensorView rank3 = TensorView::contiguous(w.data(), DType::f32, {2, 4, 64});
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_rtn(rank3, WeightOrientation::out_in); },
                                 ErrorKind::invalid_argument, "'weight.rank' = 3"));
  const TensorView ints = TensorView::contiguous(w.data(), DType::i32, {8, 64});
  EXPECT_TRUE(test::throws_error([&] { (void)quantize_rtn(ints, WeightOrientation::out_in); },
                                 ErrorKind::invalid_argument, "'weight.dtype' = i32"));
  w[3 * 64 + 17] = NAN;
  EXPECT_TRUE(test::throws_error(
      [&] { (void)quantize_rtn(view, WeightOrientation::out_in, {32, ZeroPoint::integer, 0, false}); },
      ErrorKind::invalid_argument, {"weight[3, 17]", "finite"}));
  w[3 * 64 + 17] = 1e6f;  // scale 2e6/15 overflows f16
  EXPECT_TRUE(test::throws_error(
      [&] { (void)quantize_rtn(view, WeightOrientation::out_in, {32, ZeroPoint::symmetric, 0, false}); },
      ErrorKind::invalid_argument, {"'weight'", "65504"}));
}

}  // namespace
}  // namespace lowbit::formats
