// The CPU reference W4A16 GEMM against a float64 product of the same fp32
// activations and dequantized weights, an exact integer case, and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>

#include "error_matchers.h"
#include "lowbit/w4a16/w4a16_gemm_ref.h"
#include "random_layers.h"
#include "tolerances.h"

namespace lowbit {
namespace {

using formats::QuantizedLinear;
using formats::ZeroPoint;
using test::ZeroKind;

// Activations [M, K] in `dtype`, stored with a row stride of ld >= K.
struct Activations {
  DType dtype;
  int64_t M, K, ld;
  std::vector<std::byte> bytes;
  std::vector<float> values;  // [M, K], the exact fp32 value of each element

  TensorView view() const {
    TensorView v = TensorView::contiguous(const_cast<std::byte*>(bytes.data()), dtype, {M, K});
    v.strides = {ld, 1};
    return v;
  }
};

Activations random_activations(int64_t M, int64_t K, DType dtype, uint64_t seed, int64_t pad = 0) {
  Activations a{dtype, M, K, K + pad, {}, std::vector<float>(static_cast<size_t>(M * K))};
  a.bytes.resize(dtype_bytes(dtype, static_cast<size_t>(M * a.ld)));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const float v = normal(rng);
      const size_t i = static_cast<size_t>(m * a.ld + k);
      float exact = v;
      if (dtype == DType::f16) {
        const f16 h = float_to_f16(v);
        std::memcpy(a.bytes.data() + i * 2, &h, 2);
        exact = f16_to_float(h);
      } else if (dtype == DType::bf16) {
        const bf16 h = float_to_bf16(v);
        std::memcpy(a.bytes.data() + i * 2, &h, 2);
        exact = bf16_to_float(h);
      } else {
        std::memcpy(a.bytes.data() + i * 4, &v, 4);
      }
      a.values[static_cast<size_t>(m * K + k)] = exact;
    }
  return a;
}

// y [M, N] in `dtype` with row stride ld, poisoned with NaN.
struct Output {
  DType dtype;
  int64_t M, N, ld;
  std::vector<std::byte> bytes;

  Output(DType dt, int64_t m, int64_t n, int64_t pad = 0) : dtype(dt), M(m), N(n), ld(n + pad) {
    bytes.resize(dtype_bytes(dt, static_cast<size_t>(M * ld)));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i < static_cast<size_t>(M * ld); ++i) {
      if (dt == DType::f32) {
        std::memcpy(bytes.data() + i * 4, &nan, 4);
      } else {
        const uint16_t bits = dt == DType::f16 ? float_to_f16(nan).bits : float_to_bf16(nan).bits;
        std::memcpy(bytes.data() + i * 2, &bits, 2);
      }
    }
  }
  TensorView view() {
    TensorView v = TensorView::contiguous(bytes.data(), dtype, {M, N});
    v.strides = {ld, 1};
    return v;
  }
  float at(int64_t m, int64_t n) const {
    const size_t i = static_cast<size_t>(m * ld + n);
    if (dtype == DType::f32) {
      float f;
      std::memcpy(&f, bytes.data() + i * 4, 4);
      return f;
    }
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + i * 2, 2);
    return dtype == DType::f16 ? f16_to_float(f16::from_bits(bits)) : bf16_to_float(bf16::from_bits(bits));
  }
};

// Compares y with the float64 product of x and dequant(w), the weights taken
// element by element from QuantizedLinear::dequant (the definition), not from
// the tiled dequantizer the GEMM uses.
void expect_matches_float64(const Activations& x, const QuantizedLinear& w, const Output& y) {
  std::vector<float> dense(static_cast<size_t>(w.K * w.N));
  for (int64_t k = 0; k < w.K; ++k)
    for (int64_t n = 0; n < w.N; ++n) dense[static_cast<size_t>(k * w.N + n)] = w.dequant(k, n);
  const double out_rtol = y.dtype == DType::f32    ? 0.0
                          : y.dtype == DType::f16 ? test::kGemmF16OutRtol
                                                  : test::kGemmBf16OutRtol;
  double err2 = 0, ref2 = 0;
  int failures = 0;
  for (int64_t m = 0; m < x.M; ++m)
    for (int64_t n = 0; n < w.N; ++n) {
      double ref = 0, magnitude = 0;
      for (int64_t k = 0; k < w.K; ++k) {
        const double t = static_cast<double>(x.values[static_cast<size_t>(m * x.K + k)]) *
                         dense[static_cast<size_t>(k * w.N + n)];
        ref += t;
        magnitude += std::fabs(t);
      }
      const double got = y.at(m, n);
      const double err = std::fabs(got - ref);
      const double tol = test::kGemmF32Rtol * magnitude + out_rtol * std::fabs(ref);
      if (!(err <= tol) && ++failures <= 10)  // also catches NaN (an unwritten output)
        ADD_FAILURE() << "y[" << m << ", " << n << "] = " << got << ", float64 reference " << ref
                      << ", |error| " << err << " > " << tol;
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  if (y.dtype == DType::f32) {
    EXPECT_LE(std::sqrt(err2 / ref2), test::kGemmF32Nrmse);
  }
}

struct Case {
  int64_t M, K, N;
  int group_size;
  ZeroKind kind;
  bool act_order;
  DType x_dtype, y_dtype;
};

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.M) + " K=" + std::to_string(c.K) + " N=" + std::to_string(c.N) +
         " g=" + std::to_string(c.group_size) + " " + test::zero_kind_name(c.kind) +
         (c.act_order ? " act_order" : "") + " x=" + dtype_name(c.x_dtype) + " y=" + dtype_name(c.y_dtype);
}

void run_case(const Case& c, uint64_t seed, int64_t x_pad = 0, int64_t y_pad = 0) {
  SCOPED_TRACE(describe(c));
  const QuantizedLinear w = test::random_layer(c.K, c.N, c.group_size, c.kind, seed, c.act_order);
  const Activations x = random_activations(c.M, c.K, c.x_dtype, seed + 1, x_pad);
  Output y(c.y_dtype, c.M, c.N, y_pad);
  w4a16_gemm_ref(x.view(), w, y.view());
  expect_matches_float64(x, w, y);
}

TEST(W4a16GemmRef, MatchesFloat64ForEveryMAndActivationDtype) {
  uint64_t seed = 100;
  for (int64_t M : {1, 2, 3, 15, 16, 17, 64})
    for (DType x_dtype : {DType::f16, DType::bf16, DType::f32})
      run_case({M, 512, 136, 128, ZeroKind::asym, false, x_dtype, DType::f32}, seed++);
}

TEST(W4a16GemmRef, MatchesFloat64ForEveryGroupSizeAndZeroPoint) {
  uint64_t seed = 200;
  for (int group_size : formats::kSupportedGroupSizes)
    for (ZeroKind kind : test::kAllZeroKinds)
      for (bool act_order : {false, true}) {
        if (act_order && group_size == -1) continue;
        run_case({5, 1024, 72, group_size, kind, act_order, DType::f16, DType::f32}, seed++);
      }
}

TEST(W4a16GemmRef, OddShapesStridesAndOutputDtypes) {
  uint64_t seed = 300;
  for (int64_t N : {8, 136, 200})
    for (DType y_dtype : {DType::f32, DType::f16, DType::bf16})
      run_case({17, 256, N, 32, ZeroKind::sym, true, DType::bf16, y_dtype}, seed++, /*x_pad=*/13,
               /*y_pad=*/5);
}

TEST(W4a16GemmRef, PaddingOfXAndYIsNeitherReadNorWritten) {
  const QuantizedLinear w = test::random_layer(64, 16, 32, ZeroKind::asym, 400);
  Activations x = random_activations(3, 64, DType::f32, 401, /*pad=*/4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t m = 0; m < 3; ++m)
    for (int64_t k = 64; k < 68; ++k) std::memcpy(x.bytes.data() + (m * 68 + k) * 4, &nan, 4);
  Output y(DType::f32, 3, 16, /*pad=*/2);
  w4a16_gemm_ref(x.view(), w, y.view());
  expect_matches_float64(x, w, y);
  EXPECT_TRUE(std::isnan(y.at(0, 16)));  // padding keeps its poison
  EXPECT_TRUE(std::isnan(y.at(2, 17)));
}

// Small integer activations and power-of-two scales: every product and
// partial sum is exactly representable in fp32, so the result is exact.
TEST(W4a16GemmRef, ExactForIntegerActivationsAndPowerOfTwoScales) {
  const int64_t M = 17, K = 512, N = 72;
  for (ZeroPoint zp : {ZeroPoint::symmetric, ZeroPoint::integer, ZeroPoint::float_min})
    for (int group_size : {32, -1}) {
      SCOPED_TRACE(std::string(formats::zero_point_name(zp)) + " g" + std::to_string(group_size));
      std::mt19937_64 rng(500 + static_cast<uint64_t>(zp));
      QuantizedLinear w = QuantizedLinear::allocate(K, N, group_size, zp);
      std::uniform_int_distribution<int> code(0, 15), exponent(-3, 0), small(-4, 4);
      for (auto& c : w.codes) c = static_cast<uint8_t>(code(rng));
      for (auto& s : w.scales) s = float_to_f16(std::ldexp(1.0f, exponent(rng)));
      for (auto& z : w.zeros) z = static_cast<uint8_t>(code(rng));
      for (size_t i = 0; i < w.mins.size(); ++i)  // m = -s*z: a multiple of s
        w.mins[i] = -f16_to_float(w.scales[i]) * static_cast<float>(code(rng));
      std::vector<f16> x(static_cast<size_t>(M * K));
      std::vector<int64_t> xi(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xi[i] = small(rng);
        x[i] = float_to_f16(static_cast<float>(xi[i]));
      }
      // Exact expected value in units of 2^-3 (the smallest scale).
      std::vector<float> expected(static_cast<size_t>(M * N));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          int64_t sum = 0;
          for (int64_t k = 0; k < K; ++k) {
            const auto gi = static_cast<size_t>(w.group_of(k) * N + n);
            const auto s8 = static_cast<int64_t>(f16_to_float(w.scales[gi]) * 8.0f);
            const int64_t q = w.codes[static_cast<size_t>(k * N + n)];
            const int64_t w8 = zp == ZeroPoint::float_min
                                   ? s8 * q + static_cast<int64_t>(w.mins[gi] * 8.0f)
                                   : s8 * (q - (zp == ZeroPoint::symmetric ? 8 : w.zeros[gi]));
            sum += xi[static_cast<size_t>(m * K + k)] * w8;
          }
          ASSERT_LT(std::llabs(sum), int64_t{1} << 24);  // exact in fp32
          expected[static_cast<size_t>(m * N + n)] = static_cast<float>(sum) / 8.0f;
        }
      std::vector<float> y(static_cast<size_t>(M * N), std::numeric_limits<float>::quiet_NaN());
      w4a16_gemm_ref(TensorView::contiguous(x.data(), DType::f16, {M, K}), w,
                     TensorView::contiguous(y.data(), DType::f32, {M, N}));
      EXPECT_EQ(std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)), 0);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], expected[i]) << "element " << i;
    }
}

TEST(W4a16GemmRef, ResultDoesNotDependOnTheThreadCount) {
  const QuantizedLinear w = test::random_layer(512, 200, 64, ZeroKind::float_min_f32, 600, true);
  const Activations x = random_activations(9, 512, DType::f32, 601);
  std::vector<std::vector<float>> results;
  const char* saved = std::getenv("LOWBIT_NUM_THREADS");
  const std::string restore = saved ? saved : "";
  for (const char* threads : {"1", "2", "3"}) {
    setenv("LOWBIT_NUM_THREADS", threads, 1);
    std::vector<float> y(9 * 200);
    w4a16_gemm_ref(x.view(), w, TensorView::contiguous(y.data(), DType::f32, {9, 200}));
    results.push_back(std::move(y));
  }
  if (saved) setenv("LOWBIT_NUM_THREADS", restore.c_str(), 1); else unsetenv("LOWBIT_NUM_THREADS");
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(W4a16GemmRef, EmptyBatchIsANoOp) {
  const QuantizedLinear w = test::random_layer(64, 8, 32, ZeroKind::sym, 700);
  std::vector<float> x(1), y(1, 7.0f);
  w4a16_gemm_ref(TensorView::contiguous(x.data(), DType::f32, {0, 64}), w,
                 TensorView::contiguous(y.data(), DType::f32, {0, 8}));
  EXPECT_EQ(y[0], 7.0f);
}

TEST(W4a16GemmRef, ShapeAndTypeErrorsNameTheArgument) {
  using test::throws_error;
  const QuantizedLinear w = test::random_layer(64, 16, 32, ZeroKind::sym, 800);
  std::vector<float> x(4 * 128), y(4 * 32);
  auto xv = [&](std::initializer_list<int64_t> s, DType dt = DType::f32) {
    return TensorView::contiguous(x.data(), dt, s);
  };
  auto yv = [&](std::initializer_list<int64_t> s, DType dt = DType::f32) {
    return TensorView::contiguous(y.data(), dt, s);
  };
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(xv({4, 128}), w, yv({4, 16})); }, ErrorKind::invalid_argument,
                           {"'x' with shape [4, 128]", "[K, N] = [64, 16]", "x [M, 64]"}));
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(xv({4, 64}), w, yv({4, 32})); }, ErrorKind::invalid_argument,
                           {"'y' with shape [4, 32]", "x is [4, 64]", "y [4, 16]"}));
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(xv({4, 64}), w, yv({3, 16})); }, ErrorKind::invalid_argument,
                           {"'y' with shape [3, 16]", "y [4, 16]"}));
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(xv({2, 2, 64}), w, yv({4, 16})); }, ErrorKind::invalid_argument,
                           {"'x' with shape [2, 2, 64]", "2-D"}));
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(xv({4, 64}, DType::i8), w, yv({4, 16})); },
                           ErrorKind::invalid_argument, "'x.dtype' = i8"));
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(xv({4, 64}), w, yv({4, 16}, DType::i32)); },
                           ErrorKind::invalid_argument, "'y.dtype' = i32"));
  QuantizedLinear bad = w;
  bad.group_size = 48;
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(xv({4, 64}), bad, yv({4, 16})); }, ErrorKind::invalid_argument,
                           "'group_size' = 48"));
  TensorView on_device = xv({4, 64});
  on_device.device = Device::cuda;
  EXPECT_TRUE(throws_error([&] { w4a16_gemm_ref(on_device, w, yv({4, 16})); }, ErrorKind::invalid_argument,
                           {"'x'", "cuda", "CPU"}));
}

}  // namespace
}  // namespace lowbit
