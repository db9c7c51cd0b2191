// The CPU matrix products (AVX2 and portable) against the double-precision
// reference over the same weights, for every weight format, on random data
// with outputs poisoned (NaN) first; plus the w4 layout against the canonical
// QuantizedLinear it came from, and the thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "error_matchers.h"
#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"
#include "lowbit/engine/cpu_kernels.h"
#include "lowbit/engine/thread_pool.h"
#include "lowbit/engine/weights.h"
#include "lowbit/formats/rtn.h"
#include "tolerances.h"

namespace lowbit::test {
namespace {

using engine::MatrixFormat;
using engine::WeightMatrix;
namespace cpu = engine::cpu;

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

WeightMatrix make_matrix(MatrixFormat f, int64_t rows, int64_t cols, uint64_t seed, int group = 128) {
  std::vector<float> w = random_floats(static_cast<size_t>(rows * cols), seed, 0.05f);
  const TensorView view = TensorView::contiguous(w.data(), DType::f32, {rows, cols});
  switch (f) {
    case MatrixFormat::f32: return WeightMatrix::from_floats(rows, cols, w);
    case MatrixFormat::f16: {
      std::vector<f16> h(w.size());
      for (size_t i = 0; i < w.size(); ++i) h[i] = float_to_f16(w[i]);
      return WeightMatrix::from_dense(TensorView::contiguous(h.data(), DType::f16, {rows, cols}));
    }
    case MatrixFormat::w4: return WeightMatrix::quantize_w4(view, group);
    case MatrixFormat::q8: {
      // GGUF Q8_0 semantics: d = max|w| / 127 per 32 columns, q = round(w / d).
      WeightMatrix m;
      m.format = MatrixFormat::q8;
      m.rows = rows;
      m.cols = cols;
      m.group_size = engine::kQ8BlockCols;
      m.codes.resize(static_cast<size_t>(rows * cols));
      m.scales.resize(static_cast<size_t>(rows * cols / 32));
      for (int64_t b = 0; b < rows * cols / 32; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(w[static_cast<size_t>(b * 32 + j)]));
        const float d = f16_to_float(float_to_f16(amax / 127.0f));
        m.scales[static_cast<size_t>(b)] = d;
        for (int j = 0; j < 32; ++j) {
          const float q = std::clamp(std::nearbyint(w[static_cast<size_t>(b * 32 + j)] / d), -127.0f, 127.0f);
          m.codes[static_cast<size_t>(b * 32 + j)] = static_cast<uint8_t>(static_cast<int8_t>(q));
        }
      }
      m.check();
      return m;
    }
  }
  return {};
}

// |y - ref| <= rtol * sum_k |w x| + atol for every element.
void expect_close(const WeightMatrix& w, const std::vector<float>& x, int64_t M, const std::vector<float>& y,
                  const std::vector<float>& ref, const std::string& what) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  int bad = 0;
  for (int64_t n = 0; n < w.rows && bad < 10; ++n) {
    w.dequant_row(n, row.data());
    for (int64_t m = 0; m < M; ++m) {
      double mag = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) mag += std::fabs(static_cast<double>(row[static_cast<size_t>(k)]) * x[static_cast<size_t>(m * w.cols + k)]);
      const size_t i = static_cast<size_t>(m * w.rows + n);
      const double bound = kEngineMatmulRtol * mag + kEngineMatmulAtol;
      if (!(std::fabs(static_cast<double>(y[i]) - ref[i]) <= bound)) {
        ADD_FAILURE() << what << ": y[" << m << "][" << n << "] = " << y[i] << ", reference " << ref[i] << ", bound "
                      << bound;
        ++bad;
      }
    }
  }
}

struct KernelCase {
  MatrixFormat format;
  int64_t rows, cols;
  int group;
};

class MatmulKernels : public ::testing::TestWithParam<KernelCase> {};

TEST_P(MatmulKernels, MatchReferenceForEveryIsaAndRowCount) {
  const KernelCase c = GetParam();
  const WeightMatrix w = make_matrix(c.format, c.rows, c.cols, 11 + static_cast<uint64_t>(c.cols));
  engine::ThreadPool pool(2);
  std::vector<cpu::Isa> isas = {cpu::Isa::portable};
  if (cpu::best_isa() == cpu::Isa::avx2) isas.push_back(cpu::Isa::avx2);
  for (const int64_t M : {1, 2, 3, 4, 5, 9}) {
    const std::vector<float> x = random_floats(static_cast<size_t>(M * c.cols), 100 + static_cast<uint64_t>(M));
    std::vector<float> ref(static_cast<size_t>(M * c.rows));
    cpu::matmul_ref(w, x.data(), M, ref.data());
    for (const cpu::Isa isa : isas) {
      cpu::set_isa(isa);
      for (engine::ThreadPool* p : {static_cast<engine::ThreadPool*>(nullptr), &pool}) {
        std::vector<float> y(ref.size(), std::numeric_limits<float>::quiet_NaN());
        cpu::matmul(w, x.data(), M, y.data(), p);
        expect_close(w, x, M, y, ref,
                     std::string(cpu::isa_name(isa)) + " " + w.describe() + " M=" + std::to_string(M) +
                         (p ? " pool" : " serial"));
      }
    }
  }
  cpu::set_isa(cpu::best_isa());
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulKernels,
                         ::testing::Values(KernelCase{MatrixFormat::f32, 37, 72, 0},
                                           KernelCase{MatrixFormat::f16, 40, 100, 0},
                                           KernelCase{MatrixFormat::w4, 48, 256, 128},
                                           KernelCase{MatrixFormat::w4, 33, 576, 64},
                                           KernelCase{MatrixFormat::w4, 20, 96, 32},
                                           KernelCase{MatrixFormat::q8, 29, 576, 32}));

TEST(WeightMatrixW4, RoundTripsTheCanonicalLayerAndDequantizesAsItDoes) {
  const int64_t N = 24, K = 256;
  std::vector<float> w = random_floats(static_cast<size_t>(N * K), 5, 0.1f);
  formats::RtnOptions o;
  o.group_size = 64;
  const formats::QuantizedLinear q =
      formats::quantize_rtn(TensorView::contiguous(w.data(), DType::f32, {N, K}), formats::WeightOrientation::out_in, o);
  const WeightMatrix m = WeightMatrix::from_quantized(q);
  EXPECT_EQ(m.format, MatrixFormat::w4);
  EXPECT_EQ(m.group_size, 64);
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    m.dequant_row(n, row.data());
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(row[static_cast<size_t>(k)], q.dequant(k, n)) << n << "," << k;
  }
  const formats::QuantizedLinear back = m.to_quantized();
  EXPECT_EQ(back.codes, q.codes);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(back.dequant(k, n), q.dequant(k, n));
}

TEST(WeightMatrixW4, RejectsActOrderAndOddShapes) {
  formats::QuantizedLinear q = formats::QuantizedLinear::allocate(64, 8, 32, formats::ZeroPoint::integer);
  for (auto& s : q.scales) s = float_to_f16(1.0f);
  q.g_idx.resize(64);
  for (int k = 0; k < 64; ++k) q.g_idx[static_cast<size_t>(k)] = (k + 1) % 2;
  EXPECT_THROW(WeightMatrix::from_quantized(q), Error);
  std::vector<float> w(8 * 40, 0.5f);
  EXPECT_THROW(WeightMatrix::quantize_w4(TensorView::contiguous(w.data(), DType::f32, {8, 40})), Error);
}

TEST(ThreadPool, CoversTheRangeOnceAndRethrows) {
  engine::ThreadPool pool(3);
  for (int rep = 0; rep < 200; ++rep) {
    std::vector<std::atomic<int>> hits(1000);
    pool.run(0, 1000, 7, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  EXPECT_THROW(pool.run(0, 100, 1,
                        [](int64_t a, int64_t b) {
                          if (a <= 50 && 50 < b) fail(ErrorKind::internal, "boom");
                        }),
               Error);
  // Still usable after an exception.
  std::atomic<int64_t> sum{0};
  pool.run(0, 100, 1, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

// A pool of more than lowbit::kMaxThreads threads is refused before any
// thread starts: 100000 of them took minutes to start on two cores.
TEST(ThreadPool, RefusesMoreThanTheBound) {
  EXPECT_TRUE(throws_error([] { engine::ThreadPool pool(kMaxThreads + 1); }, ErrorKind::invalid_argument,
                           {"threads", "1025", "at most 1024"}));
}

}  // namespace
}  // namespace lowbit::test

namespace lowbit::test {
namespace {

TEST(AttentionLoops, DotAndAxpyMatchDoubleSumsForEveryIsa) {
  std::vector<cpu::Isa> isas = {cpu::Isa::portable};
  if (cpu::best_isa() == cpu::Isa::avx2) isas.push_back(cpu::Isa::avx2);
  for (const int64_t n : {5, 64, 100, 128}) {
    const std::vector<float> a = random_floats(static_cast<size_t>(n), 1), b = random_floats(static_cast<size_t>(n), 2);
    std::vector<f16> bh(b.size());
    for (size_t i = 0; i < b.size(); ++i) bh[i] = float_to_f16(b[i]);
    double want = 0.0, want_h = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      want += static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
      want_h += static_cast<double>(a[static_cast<size_t>(i)]) * f16_to_float(bh[static_cast<size_t>(i)]);
      mag += std::fabs(static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)]);
    }
    const double bound = kEngineMatmulRtol * mag + kEngineMatmulAtol;
    for (const cpu::Isa isa : isas) {
      cpu::set_isa(isa);
      EXPECT_NEAR(cpu::dot(a.data(), b.data(), n), want, bound) << cpu::isa_name(isa) << " n=" << n;
      EXPECT_NEAR(cpu::dot(a.data(), bh.data(), n), want_h, bound) << cpu::isa_name(isa) << " n=" << n;
      std::vector<float> y = b, yh = b;
      cpu::axpy(0.75f, a.data(), y.data(), n);
      std::vector<f16> ah(a.size());
      for (size_t i = 0; i < a.size(); ++i) ah[i] = float_to_f16(a[i]);
      cpu::axpy(-1.5f, ah.data(), yh.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(i);
        // FMA rounds once, mul + add twice: equal to a few ulps of the terms.
        const double t1 = std::fabs(b[k]) + std::fabs(0.75 * a[k]);
        const double t2 = std::fabs(b[k]) + std::fabs(1.5 * f16_to_float(ah[k]));
        EXPECT_NEAR(y[k], b[k] + 0.75 * a[k], t1 * 0x1p-22);
        EXPECT_NEAR(yh[k], b[k] - 1.5 * f16_to_float(ah[k]), t2 * 0x1p-22);
      }
    }
    cpu::set_isa(cpu::best_isa());
  }
}

}  // namespace
}  // namespace lowbit::test
