// Known answers for the fp32 references of the decoder-layer ops: the CUDA
// kernels are tested against these, so these are tested against hand-worked
// values and invariants that a wrong pairing, sign or stride would break.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "error_matchers.h"
#include "lowbit/ops/layer_ops_ref.h"

namespace lowbit::ops {
namespace {

using test::throws_error;

TEST(OpsRef, RmsNormKnownAnswer) {
  // rms([3, 4]) = sqrt(12.5); y = x / rms * w.
  const std::vector<float> x = {3, 4, -1, 1}, w = {1, 2};
  std::vector<float> y(4);
  rms_norm_ref(x, w, 2, 2, 0.0f, y);
  const double r = std::sqrt(12.5);
  EXPECT_NEAR(y[0], 3 / r, 1e-6);
  EXPECT_NEAR(y[1], 8 / r, 1e-6);
  EXPECT_NEAR(y[2], -1.0, 1e-6);
  EXPECT_NEAR(y[3], 2.0, 1e-6);
  // eps is added to the mean square, not to the root.
  rms_norm_ref(std::vector<float>{0, 0}, w, 1, 2, 0.25f, y);
  EXPECT_EQ(y[0], 0.0f);
  rms_norm_ref(std::vector<float>{1, 1}, w, 1, 2, 3.0f, y);
  EXPECT_NEAR(y[0], 0.5, 1e-7);
}

TEST(OpsRef, AddRmsNormUpdatesResidualThenNormalizes) {
  std::vector<float> residual = {1, 2, 3, 4};
  const std::vector<float> x = {2, 2, -7, -4}, w = {1, 1};
  std::vector<float> y(4), expected(4);
  add_rms_norm_ref(residual, x, w, 2, 2, 1e-6f, y);
  EXPECT_EQ(residual, (std::vector<float>{3, 4, -4, 0}));
  rms_norm_ref(residual, w, 2, 2, 1e-6f, expected);
  EXPECT_EQ(y, expected);
}

TEST(OpsRef, RopePairsAndSigns) {
  const std::vector<float> inv_freq = {1.0f, 0.01f};
  const std::vector<int32_t> pos = {1};
  const double c0 = std::cos(1.0), s0 = std::sin(1.0);
  const double c1 = std::cos(static_cast<double>(0.01f)), s1 = std::sin(static_cast<double>(0.01f));
  std::vector<float> half = {1, 2, 3, 4};  // pairs (0, 2) and (1, 3)
  rope_ref(half, 1, 1, 4, 4, pos, inv_freq, RopeStyle::half);
  EXPECT_NEAR(half[0], 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(half[2], 3 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(half[1], 2 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(half[3], 4 * c1 + 2 * s1, 1e-6);
  std::vector<float> inter = {1, 2, 3, 4};  // pairs (0, 1) and (2, 3)
  rope_ref(inter, 1, 1, 4, 4, pos, inv_freq, RopeStyle::interleaved);
  EXPECT_NEAR(inter[0], 1 * c0 - 2 * s0, 1e-6);
  EXPECT_NEAR(inter[1], 2 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(inter[2], 3 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(inter[3], 4 * c1 + 3 * s1, 1e-6);
}

TEST(OpsRef, RopeDependsOnlyOnRelativePositionAndKeepsGaps) {
  // q(m) . k(n) must equal q(m + s) . k(n + s): the property RoPE exists for.
  const int64_t d = 8, heads = 2, stride = heads * d + 3;  // 3 untouched values per token
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / d);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(2 * stride), k(2 * stride);
  for (auto& v : q) v = normal(rng);
  for (auto& v : k) v = normal(rng);
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
    auto dot_at = [&](int32_t m, int32_t n) {
      std::vector<float> qq = q, kk = k;
      rope_ref(qq, 2, heads, d, stride, std::vector<int32_t>{m, m}, inv_freq, style);
      rope_ref(kk, 2, heads, d, stride, std::vector<int32_t>{n, n}, inv_freq, style);
      for (int64_t j = heads * d; j < stride; ++j) EXPECT_EQ(qq[j], q[j]) << "gap changed";
      double dot = 0;
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < d; ++i)
          dot += static_cast<double>(qq[stride + h * d + i]) * kk[stride + h * d + i];
      return dot;
    };
    EXPECT_NEAR(dot_at(5, 2), dot_at(105, 102), 1e-4) << rope_style_name(style);
    EXPECT_GT(std::abs(dot_at(5, 2) - dot_at(5, 3)), 1e-3) << rope_style_name(style);
    std::vector<float> same = q;
    rope_ref(same, 2, heads, d, stride, std::vector<int32_t>{0, 0}, inv_freq, style);
    EXPECT_EQ(same, q) << "position 0 must be the identity";
  }
}

TEST(OpsRef, SiluMulWithRowStride) {
  // Rows of a fused [gate | up] output: stride 4, width 2.
  const std::vector<float> fused = {0, 1, 5, 7, -2, 3, 2, 0.5f};
  std::vector<float> out(4);
  silu_mul_ref(std::span(fused).subspan(0), std::span(fused).subspan(2), 2, 2, 4, out);
  const auto silu = [](double g) { return g / (1 + std::exp(-g)); };
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], silu(1) * 7, 1e-6);
  EXPECT_NEAR(out[2], silu(-2) * 2, 1e-6);
  EXPECT_NEAR(out[3], silu(3) * 0.5, 1e-6);
}

TEST(OpsRef, EmbeddingAndArgmax) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};
  std::vector<float> out(4);
  embedding_ref(table, 3, 2, std::vector<int32_t>{2, 0}, out);
  EXPECT_EQ(out, (std::vector<float>{20, 21, 0, 1}));
  EXPECT_TRUE(throws_error([&] { embedding_ref(table, 3, 2, std::vector<int32_t>{3}, out); },
                           ErrorKind::invalid_argument, "token id 3"));
  const std::vector<float> x = {1, 5, 5, 2, NAN, -1, NAN, -3, NAN, NAN, NAN, NAN};
  std::vector<int32_t> best(3);
  argmax_ref(x, 3, 4, best);
  EXPECT_EQ(best, (std::vector<int32_t>{1, 1, 0}));  // first of equals; NaN skipped; all-NaN -> 0
}

TEST(OpsRef, ShortSpansAreErrors) {
  std::vector<float> y(3);
  EXPECT_TRUE(throws_error([&] { rms_norm_ref(std::vector<float>(4), std::vector<float>(2), 2, 2, 0, y); },
                           ErrorKind::invalid_argument, "rms_norm y"));
  std::vector<float> x(8);
  EXPECT_TRUE(throws_error(
      [&] { rope_ref(x, 1, 1, 3, 3, std::vector<int32_t>{0}, std::vector<float>(2), RopeStyle::half); },
      ErrorKind::invalid_argument, "even"));
}

}  // namespace
}  // namespace lowbit::ops
