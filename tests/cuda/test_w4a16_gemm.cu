// The CUDA W4A16 GEMM against the CPU reference (w4a16_gemm_ref), for every
// strategy x activation dtype x zero-point kind x group size, M from 1 to 257,
// N and K that are not multiples of the tile, act-order; outputs poisoned with
// NaN before each call so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <cstdio>
#include <utility>
#include <random>
#include <span>
#include <vector>

#include "error_matchers.h"
#include "gpu_test_util.h"
#include "lowbit/core/half.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/kv/rotation.h"
#include "lowbit/ops/layer_ops_cuda.h"
#include "lowbit/w4a16/w4a16_gemm.h"
#include "lowbit/w4a16/w4a16_gemm_ref.h"
#include "lowbit/w4a16/w4a16_tune_rule.h"
#include "random_layers.h"
#include "tolerances.h"

namespace lowbit {
namespace {

using test::ZeroKind;

uint16_t to_bits(float v, DType t) { return t == DType::f16 ? float_to_f16(v).bits : float_to_bf16(v).bits; }
float from_bits(uint16_t b, DType t) {
  return t == DType::f16 ? f16_to_float(f16::from_bits(b)) : bf16_to_float(bf16::from_bits(b));
}

struct Problem {
  int64_t M;
  formats::QuantizedLinear layer;
  DType dtype;
  std::vector<uint16_t> x;   // [M, K] host copy of the activations
  std::vector<float> ref;    // [M, N] CPU reference
  std::vector<double> scale; // [M, N] sum_k |x w| + |ref|
};

// The reference and error scale of p (M, layer, dtype and x already set).
Problem make_problem_from(Problem p) {
  const int64_t M = p.M, K = p.layer.K, N = p.layer.N;
  const DType dtype = p.dtype;
  p.ref.resize(static_cast<size_t>(M * N));
  w4a16_gemm_ref(TensorView::contiguous(p.x.data(), dtype, {M, K}), p.layer,
                 TensorView::contiguous(p.ref.data(), DType::f32, {M, N}));
  std::vector<float> w(static_cast<size_t>(K * N));
  formats::dequantize_ref(p.layer, w.data());
  p.scale.assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const double xv = std::fabs(from_bits(p.x[static_cast<size_t>(m * K + k)], dtype));
      for (int64_t n = 0; n < N; ++n) p.scale[static_cast<size_t>(m * N + n)] += xv * std::fabs(w[static_cast<size_t>(k * N + n)]);
    }
  for (size_t i = 0; i < p.scale.size(); ++i) p.scale[i] += std::fabs(p.ref[i]);
  return p;
}

Problem make_problem(int64_t M, formats::QuantizedLinear layer, DType dtype, uint64_t seed) {
  Problem p{M, std::move(layer), dtype, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.x.resize(static_cast<size_t>(M * p.layer.K));
  for (auto& v : p.x) v = to_bits(normal(rng), dtype);
  return make_problem_from(std::move(p));
}

// Runs the GEMM on `device` (weights, x, y and the workspace all there) and
// returns y; y is poisoned with NaN first.
std::vector<uint16_t> run_gpu_on(int device, const Problem& p, const W4A16Weights& w, W4A16Workspace& ws,
                                 const W4A16Options& o) {
  cuda::DeviceGuard guard(device);
  const int64_t M = p.M, K = p.layer.K, N = p.layer.N;
  Buffer x(static_cast<size_t>(M * K) * 2, Device::cuda, device), y(static_cast<size_t>(M * N) * 2, Device::cuda, device);
  Buffer::copy(x.data(), Device::cuda, p.x.data(), Device::cpu, x.size());
  LOWBIT_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.size()));
  w4a16_gemm(TensorView::contiguous(x.data(), p.dtype, {M, K}, Device::cuda), w,
             TensorView::contiguous(y.data(), p.dtype, {M, N}, Device::cuda), ws, o);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> out(static_cast<size_t>(M * N));
  Buffer::copy(out.data(), Device::cpu, y.data(), Device::cuda, y.size());
  return out;
}

// The same on device 0.
std::vector<uint16_t> run_gpu(const Problem& p, const W4A16Weights& w, W4A16Workspace& ws, const W4A16Options& o) {
  return run_gpu_on(0, p, w, ws, o);
}

::testing::AssertionResult matches_reference(const Problem& p, const std::vector<uint16_t>& y) {
  const double rtol = p.dtype == DType::f16 ? test::kW4A16GemmF16Rtol : test::kW4A16GemmBf16Rtol;
  int bad = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (size_t i = 0; i < y.size(); ++i) {
    const double v = from_bits(y[i], p.dtype), err = std::fabs(v - p.ref[i]);
    if (!(err <= rtol * p.scale[i])) {  // NaN fails too
      if (bad++ == 0) result = ::testing::AssertionFailure();
      if (bad <= 5)
        result << "y[" << i / p.layer.N << ", " << i % p.layer.N << "] = " << v << ", reference " << p.ref[i]
               << ", error " << err << " > " << rtol * p.scale[i] << "\n";
    }
  }
  if (bad > 0) result << bad << " of " << y.size() << " elements out of bounds";
  return result;
}

// Every strategy this device runs: wgmma joins on sm_90a devices (the test
// WgmmaRunsOnComputeCapability9 keeps an H100 from skipping it silently).
std::vector<W4A16Strategy> strategies() {
  std::vector<W4A16Strategy> s = {W4A16Strategy::data_parallel, W4A16Strategy::split_k_atomic, W4A16Strategy::stream_k,
                                  W4A16Strategy::split_k_deterministic, W4A16Strategy::decoupled,
                                  W4A16Strategy::gemv, W4A16Strategy::automatic};
  if (w4a16_wgmma_available()) s.push_back(W4A16Strategy::wgmma);
  return s;
}
TEST(W4A16Gemm, EveryStrategyDtypeZeroKindAndGroupSize) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  uint64_t seed = 100;
  for (DType dtype : {DType::f16, DType::bf16})
    for (ZeroKind kind : {ZeroKind::sym, ZeroKind::asym, ZeroKind::float_min_f16})
      for (int group : {32, 64, 128, 256, -1}) {
        const auto layer = test::random_layer(512, 136, group, kind, seed++);
        const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
        for (int64_t M : {1, 17, 64}) {
          const Problem p = make_problem(M, layer, dtype, seed++);
          for (W4A16Strategy s : strategies()) {
            SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << test::zero_kind_name(kind) << " g=" << group
                                            << " M=" << M << " " << w4a16_strategy_name(s));
            EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, {s, 0})));
          }
        }
      }
}

TEST(W4A16Gemm, EveryMAndAwkwardShapes) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  struct Shape { int64_t K, N; int group; };
  uint64_t seed = 7;
  for (const Shape shape : {Shape{96, 8, 32}, Shape{192, 200, 64}, Shape{3584, 72, 128}, Shape{1024, 1000, -1}}) {
    const auto layer = test::random_layer(shape.K, shape.N, shape.group, ZeroKind::asym, seed++);
    for (DType dtype : {DType::f16, DType::bf16}) {
      const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
      for (int64_t M : {1, 2, 3, 15, 16, 17, 63, 64, 65, 257}) {
        const Problem p = make_problem(M, layer, dtype, seed++);
        for (W4A16Strategy s : strategies()) {
          SCOPED_TRACE(testing::Message() << "K=" << shape.K << " N=" << shape.N << " g=" << shape.group << " "
                                          << dtype_name(dtype) << " M=" << M << " " << w4a16_strategy_name(s));
          EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, {s, 0})));
        }
      }
    }
  }
}

// The small engine test model's layers (tests/cuda/test_cuda_engine.cu) at
// the row counts its prefills use, with auto and the two sm_90a kernels.
TEST(W4A16Gemm, EngineTestLayersAtPrefillRows) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  uint64_t seed = 900;
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{256, 1024}, {512, 256}, {256, 384}}) {
    const auto layer = test::random_layer(K, N, 128, ZeroKind::sym, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
    for (int64_t M : {1, 2, 9, 12, 15, 16, 17, 20, 21}) {
      const Problem p = make_problem(M, layer, DType::f16, seed++);
      for (W4A16Strategy s : strategies()) {
        SCOPED_TRACE(testing::Message() << "K=" << K << " N=" << N << " M=" << M << " " << w4a16_strategy_name(s));
        EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, {s, 0})));
      }
    }
  }
}

TEST(W4A16Gemm, ActOrderAndExplicitSplits) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  const auto layer = test::random_layer(1024, 256, 128, ZeroKind::asym, 5, /*act_order=*/true);
  ASSERT_FALSE(layer.has_trivial_g_idx());
  for (DType dtype : {DType::f16, DType::bf16}) {
    const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
    EXPECT_TRUE(w.act_order());
    const Problem p = make_problem(5, layer, dtype, 9);
    for (W4A16Strategy s : strategies())
      for (int split : {1, 3, 16}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << w4a16_strategy_name(s) << " split " << split);
        EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, {s, split})));
      }
  }
}

TEST(W4A16Gemm, DeterministicSplitKIsBitwiseReproducibleAndAtomicReusesItsWorkspace) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  const auto layer = test::random_layer(4096, 512, 128, ZeroKind::sym, 21);
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
  const Problem p = make_problem(16, layer, DType::f16, 22);
  const auto first = run_gpu(p, w, ws, {W4A16Strategy::split_k_deterministic, 32});
  EXPECT_TRUE(matches_reference(p, first));
  for (int rep = 0; rep < 3; ++rep)
    EXPECT_EQ(run_gpu(p, w, ws, {W4A16Strategy::split_k_deterministic, 32}), first) << "rep " << rep;
  // The atomic variant keeps its fp32 workspace zero between calls: repeated
  // calls stay correct (a leftover sum would double the result).
  for (int rep = 0; rep < 3; ++rep)
    EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, {W4A16Strategy::split_k_atomic, 32}))) << "rep " << rep;
}

TEST(W4A16Gemm, LargeLayerAtDecodeShapes) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  const auto layer = test::random_layer(4096, 4096, 128, ZeroKind::asym, 31);
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
  for (int64_t M : {1, 16}) {
    const Problem p = make_problem(M, layer, DType::f16, 32 + static_cast<uint64_t>(M));
    for (W4A16Strategy s : strategies()) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " " << w4a16_strategy_name(s));
      EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, {s, 0})));
    }
  }
}

// The gemv strategy (128-column blocks, K split over the CTAs of a block):
// every row count of a pass (1..8) and several passes; K splits that cut
// the k-iterations unevenly (3, 7, 12) and one k-iteration per CTA (200 is
// clamped to that), their partials summed by the last CTA of a block in the
// shared memory its ring used (in chunks when they do not fit at once);
// blocks wider than N (N = 64 .. 200) and a narrow last block (N = 1100);
// group 32 (two scale groups per k-iteration), bf16, float zero-point, odd K
// and N; and the reduction repeats bit for bit.
TEST(W4A16Gemm, GemvEveryRowCountAndSplit) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  struct Case { int64_t K, N; int group; ZeroKind kind; DType dtype; };
  uint64_t seed = 300;
  for (const Case c : {Case{4096, 200, 128, ZeroKind::asym, DType::f16}, Case{1000, 72, -1, ZeroKind::sym, DType::bf16},
                       Case{576, 136, 32, ZeroKind::float_min_f16, DType::f16},
                       Case{448, 64, 64, ZeroKind::asym, DType::bf16},
                       Case{640, 1100, 128, ZeroKind::asym, DType::f16}}) {
    const auto layer = test::random_layer(c.K, c.N, c.group, c.kind, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, c.dtype);
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17}) {
      const Problem p = make_problem(M, layer, c.dtype, seed++);
      for (int split : {0, 1, 3, 7, 12, 200}) {
        SCOPED_TRACE(testing::Message() << "K=" << c.K << " N=" << c.N << " g=" << c.group << " "
                                        << test::zero_kind_name(c.kind) << " " << dtype_name(c.dtype) << " M=" << M
                                        << " split " << split);
        const W4A16Options o{W4A16Strategy::gemv, split};
        const W4A16Plan plan = w4a16_plan(M, w, o);
        EXPECT_EQ(plan.strategy, W4A16Strategy::gemv);
        EXPECT_EQ(plan.rows_per_pass, 8);
        EXPECT_GE(plan.split_k, 1);
        const auto first = run_gpu(p, w, ws, o);
        EXPECT_TRUE(matches_reference(p, first));
        if (split == 3 || split == 12) EXPECT_EQ(run_gpu(p, w, ws, o), first);
      }
    }
  }
  // K = 4096: 64 k-iterations, the largest split.
  const W4A16Weights big = W4A16Weights::random(4096, 1024, 128, DType::f16, 9);
  EXPECT_EQ(w4a16_plan(8, big, {W4A16Strategy::gemv, 1000}).split_k, 64);
  EXPECT_EQ(w4a16_plan(1, big, {W4A16Strategy::gemv, 5}).split_k, 5);
  EXPECT_GE(w4a16_plan(1, big, {W4A16Strategy::gemv, 0}).split_k, 1);
  EXPECT_LE(w4a16_plan(1, big, {W4A16Strategy::gemv, 0}).split_k, 64);
}

// Back-to-back calls on one stream with no host synchronization between
// them, each reading the previous call's output and all sharing one
// workspace (the engine's pattern: the gemv is launched with programmatic
// dependent launch, so its prologue overlaps the previous kernel). Each
// output is checked against the reference computed from the device's own
// input, so a read of a not-yet-written input or a workspace reused too early
// shows as a mismatch.
TEST(W4A16Gemm, GemvChainedCallsOnOneStream) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  cudaStream_t stream;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // K x N of each layer: the output of one is the input of the next.
  const std::vector<std::pair<int64_t, int64_t>> dims = {{512, 1024}, {1024, 256}, {256, 384}, {384, 512}};
  for (int64_t M : {1, 3}) {
    std::vector<formats::QuantizedLinear> layers;
    std::vector<W4A16Weights> weights;
    std::vector<Buffer> acts;
    for (size_t i = 0; i < dims.size(); ++i) {
      layers.push_back(test::random_layer(dims[i].first, dims[i].second, 128, ZeroKind::asym, 500 + i));
      weights.push_back(W4A16Weights::prepare(layers.back(), DType::f16));
      acts.emplace_back(static_cast<size_t>(M * dims[i].first) * 2, Device::cuda);
    }
    acts.emplace_back(static_cast<size_t>(M * dims.back().second) * 2, Device::cuda);
    std::mt19937_64 rng(77);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> x0(static_cast<size_t>(M * dims[0].first));
    for (auto& v : x0) v = to_bits(normal(rng), DType::f16);
    Buffer::copy(acts[0].data(), Device::cuda, x0.data(), Device::cpu, acts[0].size());
    for (size_t i = 1; i < acts.size(); ++i) LOWBIT_CUDA_CHECK(cudaMemset(acts[i].data(), 0xFF, acts[i].size()));
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    for (int rep = 0; rep < 3; ++rep)  // repeated: later calls overlap earlier ones' tails
      for (size_t i = 0; i < dims.size(); ++i)
        w4a16_gemm(TensorView::contiguous(acts[i].data(), DType::f16, {M, dims[i].first}, Device::cuda), weights[i],
                   TensorView::contiguous(acts[i + 1].data(), DType::f16, {M, dims[i].second}, Device::cuda), ws,
                   {W4A16Strategy::gemv, 0}, stream);
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < dims.size(); ++i) {
      Problem p{M, layers[i], DType::f16, {}, {}, {}};
      p.x.resize(static_cast<size_t>(M * dims[i].first));
      Buffer::copy(p.x.data(), Device::cpu, acts[i].data(), Device::cuda, acts[i].size());
      const Problem ref = make_problem_from(p);
      std::vector<uint16_t> y(static_cast<size_t>(M * dims[i].second));
      Buffer::copy(y.data(), Device::cpu, acts[i + 1].data(), Device::cuda, acts[i + 1].size());
      EXPECT_TRUE(matches_reference(ref, y)) << "M=" << M << " layer " << i;
    }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(stream));
}

// W4A16Options::l2_streaming (on by default): the launch's L2 access-policy
// window is a cache hint, so every call gives the bits of the same call
// without it. The gemv kernel at one pass of rows (window) and at two (none),
// the wgmma kernel at one row tile (window) and at several (none), both
// dtypes.
TEST(W4A16Gemm, L2StreamingWindowGivesTheSameBits) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  const formats::QuantizedLinear layer = test::random_layer(512, 1472, 128, ZeroKind::asym, 611);
  std::vector<std::pair<W4A16Strategy, int64_t>> cases = {
      {W4A16Strategy::gemv, 1}, {W4A16Strategy::gemv, 8}, {W4A16Strategy::gemv, 17}};
  if (w4a16_wgmma_available())
    cases.insert(cases.end(), {{W4A16Strategy::wgmma, 16}, {W4A16Strategy::wgmma, 64}, {W4A16Strategy::wgmma, 300}});
  for (const DType dtype : {DType::f16, DType::bf16}) {
    const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
    for (const auto& [strategy, M] : cases) {
      SCOPED_TRACE(std::string(dtype == DType::f16 ? "f16" : "bf16") + " " + w4a16_strategy_name(strategy) +
                   " M=" + std::to_string(M));
      const Problem p = make_problem(M, layer, dtype, 700 + static_cast<uint64_t>(M));
      W4A16Options with{strategy, 0};
      W4A16Options without = with;
      without.l2_streaming = false;
      const std::vector<uint16_t> y = run_gpu(p, w, ws, with);
      EXPECT_TRUE(matches_reference(p, y));
      EXPECT_EQ(run_gpu(p, w, ws, without), y) << "other bits without the L2 streaming window";
    }
  }
}

// W4A16Options::gemv_early_dependents_bytes: a gemv call lets the next
// kernel launch before its own wait (0: every call) or after its K loop (the
// default at this size). A chain of dependent calls launched back to back on
// one stream, each reading the previous one's output and reusing the same
// split-K partials and counters, must give the same bits either way (a
// dependent reading early would move them), and each link must match the
// CPU reference on its own input.
TEST(W4A16Gemm, GemvEarlyDependentLaunchGivesTheSameBits) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  constexpr int64_t K = 1024, kLinks = 6;
  const formats::QuantizedLinear layer = test::random_layer(K, K, 128, ZeroKind::asym, 733);
  // bf16: this layer grows the values ~8x per link, past fp16's range by the fifth.
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::bf16);
  for (const int64_t M : {1, 3})
    for (const int split : {0, 3}) {
      SCOPED_TRACE("M=" + std::to_string(M) + " split " + std::to_string(split));
      std::vector<std::vector<uint16_t>> chains[2];
      for (int early = 0; early < 2; ++early) {
        W4A16Options o{W4A16Strategy::gemv, split};
        o.gemv_early_dependents_bytes = early ? 0 : std::numeric_limits<int64_t>::max();
        const size_t bytes = static_cast<size_t>(M * K) * 2;
        std::vector<Buffer> y;
        for (int64_t i = 0; i <= kLinks; ++i) y.emplace_back(bytes, Device::cuda);
        const Problem first = make_problem(M, layer, DType::bf16, 740 + static_cast<uint64_t>(M));
        Buffer::copy(y[0].data(), Device::cuda, first.x.data(), Device::cpu, bytes);
        for (int64_t i = 1; i <= kLinks; ++i) LOWBIT_CUDA_CHECK(cudaMemset(y[i].data(), 0xFF, bytes));
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        for (int64_t i = 0; i < kLinks; ++i)
          w4a16_gemm(TensorView::contiguous(y[i].data(), DType::bf16, {M, K}, Device::cuda), w,
                     TensorView::contiguous(y[i + 1].data(), DType::bf16, {M, K}, Device::cuda), ws, o);
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        for (int64_t i = 0; i <= kLinks; ++i) {
          std::vector<uint16_t> host(static_cast<size_t>(M * K));
          Buffer::copy(host.data(), Device::cpu, y[i].data(), Device::cuda, bytes);
          chains[early].push_back(std::move(host));
        }
      }
      for (int64_t i = 1; i <= kLinks; ++i) {
        EXPECT_EQ(chains[1][i], chains[0][i]) << "link " << i << ": other bits with early dependents";
        Problem p{M, layer, DType::bf16, chains[1][i - 1], {}, {}};
        EXPECT_TRUE(matches_reference(make_problem_from(std::move(p)), chains[1][i])) << "link " << i;
      }
    }
}

// W4A16Options::x_silu_mul: the gemv kernel reading x = silu(gate) * up
// from a [M, 2K] gate | up buffer gives the bits of ops::silu_mul followed by
// the plain gemv (the engine's two launches it replaces), for both dtypes,
// group sizes 32 and 128 and per channel, several row counts and K splits, and
// a K that is not a multiple of 64; the options it does not support are
// refused.
TEST(W4A16Gemm, GemvSiluMulEqualsSiluKernelThenGemv) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  struct Case { int64_t K, N; int group; DType dtype; };
  uint64_t seed = 900;
  for (const Case c :
       {Case{512, 200, 128, DType::f16}, Case{576, 136, 32, DType::bf16}, Case{1000, 72, -1, DType::f16}}) {
    const auto layer = test::random_layer(c.K, c.N, c.group, ZeroKind::asym, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, c.dtype);
    for (int64_t M : {1, 3, 9}) {
      std::mt19937_64 rng(seed++);
      std::normal_distribution<float> normal(0.0f, 2.0f);
      std::vector<uint16_t> gate_up(static_cast<size_t>(M * 2 * c.K));
      for (auto& v : gate_up) v = to_bits(normal(rng), c.dtype);
      Buffer gu(gate_up.size() * 2, Device::cuda), act(static_cast<size_t>(M * c.K) * 2, Device::cuda),
          y(static_cast<size_t>(M * c.N) * 2, Device::cuda);
      Buffer::copy(gu.data(), Device::cuda, gate_up.data(), Device::cpu, gu.size());
      auto half_view = [&](int64_t offset) {
        TensorView v = TensorView::contiguous(static_cast<std::byte*>(gu.data()) + offset * 2, c.dtype, {M, c.K},
                                              Device::cuda);
        v.strides[0] = 2 * c.K;
        return v;
      };
      const TensorView act_view = TensorView::contiguous(act.data(), c.dtype, {M, c.K}, Device::cuda);
      ops::silu_mul(half_view(0), half_view(c.K), act_view);
      const TensorView y_view = TensorView::contiguous(y.data(), c.dtype, {M, c.N}, Device::cuda);
      for (int split : {0, 5}) {
        SCOPED_TRACE(testing::Message() << "K=" << c.K << " N=" << c.N << " g=" << c.group << " "
                                        << dtype_name(c.dtype) << " M=" << M << " split " << split);
        W4A16Options o{W4A16Strategy::gemv, split};
        LOWBIT_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.size()));
        w4a16_gemm(act_view, w, y_view, ws, o);
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> two_launches(static_cast<size_t>(M * c.N)), fused(two_launches.size());
        Buffer::copy(two_launches.data(), Device::cpu, y.data(), Device::cuda, y.size());
        o.x_silu_mul = true;
        LOWBIT_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.size()));
        w4a16_gemm(TensorView::contiguous(gu.data(), c.dtype, {M, 2 * c.K}, Device::cuda), w, y_view, ws, o);
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        Buffer::copy(fused.data(), Device::cpu, y.data(), Device::cuda, y.size());
        EXPECT_EQ(fused, two_launches);
        // And the reference on the product the silu kernel stored.
        Problem p{M, layer, c.dtype, {}, {}, {}};
        p.x.resize(static_cast<size_t>(M * c.K));
        Buffer::copy(p.x.data(), Device::cpu, act.data(), Device::cuda, act.size());
        EXPECT_TRUE(matches_reference(make_problem_from(std::move(p)), fused));
      }
    }
  }
  // Refused: another strategy, x of K columns, act-order weights.
  const auto layer = test::random_layer(256, 64, 64, ZeroKind::sym, 3);
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
  Buffer x(2 * 512 * 2, Device::cuda), y(2 * 64 * 2, Device::cuda);
  const auto yv = TensorView::contiguous(y.data(), DType::f16, {2, 64}, Device::cuda);
  const auto xv = TensorView::contiguous(x.data(), DType::f16, {2, 512}, Device::cuda);
  W4A16Options automatic;
  automatic.x_silu_mul = true;
  EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(xv, w, yv, ws, automatic); }, ErrorKind::unsupported,
                                 {"x_silu_mul", "gemv", "auto"}));
  W4A16Options gemv{W4A16Strategy::gemv, 0};
  gemv.x_silu_mul = true;
  EXPECT_TRUE(test::throws_error(
      [&] { w4a16_gemm(TensorView::contiguous(x.data(), DType::f16, {2, 256}, Device::cuda), w, yv, ws, gemv); },
      ErrorKind::invalid_argument, {"'x'", "[2, 256]", "512"}));
  const W4A16Weights act_order =
      W4A16Weights::prepare(test::random_layer(256, 64, 64, ZeroKind::sym, 4, /*act_order=*/true), DType::f16);
  EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(xv, act_order, yv, ws, gemv); }, ErrorKind::unsupported,
                                 {"x_silu_mul", "act-order"}));
}

// W4A16Options::residual_row_sq and x_norm_weight: a gemv GEMM that adds its
// output to a residual (and sums each row's squares per 128 columns), then a
// gemv GEMM that reads the residual through RMSNorm, against the three
// launches they replace in a decode step (plain gemv, ops::add_rms_norm, gemv
// of the normalized rows). The residual must have the same bits; the sums of
// squares must match a float64 sum of the stored residual; the second GEMM
// must match the separate path (its norm sums in another order: rounding
// only) and the CPU reference on the normalized rows. Residual widths of
// 1000 (a partial last block), 384 and 640; both dtypes; group 32, 64
// (act-order, which the residual side takes), 128 and per channel; 1-9
// rows; automatic and forced K splits. The options it cannot honour are
// refused.
TEST(W4A16Gemm, GemvResidualAddAndRmsNormEqualTheSeparateKernels) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  // K -> H (the residual width) -> N.
  struct Case { int64_t K, H, N; int first_group, second_group; DType dtype; bool act_order; };
  uint64_t seed = 1300;
  const float eps = 1e-5f;
  for (const Case c : {Case{512, 1000, 200, 128, -1, DType::f16, false}, Case{576, 384, 136, 32, 32, DType::bf16, false},
                       Case{256, 640, 72, 64, 128, DType::f16, true}}) {
    const auto first_layer = test::random_layer(c.K, c.H, c.first_group, ZeroKind::asym, seed++, c.act_order);
    const auto second_layer = test::random_layer(c.H, c.N, c.second_group, ZeroKind::asym, seed++);
    const W4A16Weights first = W4A16Weights::prepare(first_layer, c.dtype);
    const W4A16Weights second = W4A16Weights::prepare(second_layer, c.dtype);
    const int64_t blocks = w4a16_row_sq_blocks(c.H), row_floats = w4a16_row_sq_floats(c.H);
    std::mt19937_64 rng(seed++);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> norm_weight(static_cast<size_t>(c.H));
    for (auto& v : norm_weight) v = to_bits(1.0f + 0.3f * normal(rng), c.dtype);
    Buffer nw(norm_weight.size() * 2, Device::cuda);
    Buffer::copy(nw.data(), Device::cuda, norm_weight.data(), Device::cpu, nw.size());
    for (int64_t M : {1, 3, 9}) {
      std::vector<uint16_t> x(static_cast<size_t>(M * c.K)), residual(static_cast<size_t>(M * c.H));
      for (auto& v : x) v = to_bits(normal(rng), c.dtype);
      for (auto& v : residual) v = to_bits(4.0f * normal(rng), c.dtype);
      Buffer xb(x.size() * 2, Device::cuda), tmp(residual.size() * 2, Device::cuda),
          normed(residual.size() * 2, Device::cuda), res_separate(residual.size() * 2, Device::cuda),
          res_fused(residual.size() * 2, Device::cuda), row_sq(static_cast<size_t>(M * row_floats) * 4, Device::cuda),
          out(static_cast<size_t>(M * c.N) * 2, Device::cuda);
      Buffer::copy(xb.data(), Device::cuda, x.data(), Device::cpu, xb.size());
      auto view = [&](const Buffer& b, int64_t cols) {
        return TensorView::contiguous(const_cast<void*>(b.data()), c.dtype, {M, cols}, Device::cuda);
      };
      auto bits_of = [&](const Buffer& b) {
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> h(b.size() / 2);
        Buffer::copy(h.data(), Device::cpu, b.data(), Device::cuda, b.size());
        return h;
      };
      for (int split : {0, 5}) {
        SCOPED_TRACE(testing::Message() << "K=" << c.K << " H=" << c.H << " N=" << c.N << " "
                                        << dtype_name(c.dtype) << " M=" << M << " split " << split);
        const W4A16Options plain{W4A16Strategy::gemv, split};
        // The separate launches.
        Buffer::copy(res_separate.data(), Device::cuda, residual.data(), Device::cpu, res_separate.size());
        LOWBIT_CUDA_CHECK(cudaMemset(tmp.data(), 0xFF, tmp.size()));
        LOWBIT_CUDA_CHECK(cudaMemset(normed.data(), 0xFF, normed.size()));
        LOWBIT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.size()));
        w4a16_gemm(view(xb, c.K), first, view(tmp, c.H), ws, plain);
        ops::add_rms_norm(view(res_separate, c.H), view(tmp, c.H),
                          TensorView::contiguous(nw.data(), c.dtype, {c.H}, Device::cuda), eps, view(normed, c.H));
        w4a16_gemm(view(normed, c.H), second, view(out, c.N), ws, plain);
        const std::vector<uint16_t> want_residual = bits_of(res_separate), want_out = bits_of(out),
                                    normed_bits = bits_of(normed);
        // The fused pair.
        Buffer::copy(res_fused.data(), Device::cuda, residual.data(), Device::cpu, res_fused.size());
        LOWBIT_CUDA_CHECK(cudaMemset(row_sq.data(), 0xFF, row_sq.size()));
        LOWBIT_CUDA_CHECK(cudaMemset(out.data(), 0xFF, out.size()));
        W4A16Options adds = plain;
        adds.residual_row_sq = row_sq.as<float>();
        w4a16_gemm(view(xb, c.K), first, view(res_fused, c.H), ws, adds);
        W4A16Options normalizes = plain;
        normalizes.x_norm_weight = nw.data();
        normalizes.x_norm_row_sq = row_sq.as<float>();
        normalizes.x_norm_eps = eps;
        w4a16_gemm(view(res_fused, c.H), second, view(out, c.N), ws, normalizes);
        const std::vector<uint16_t> got_residual = bits_of(res_fused), got_out = bits_of(out);
        std::vector<float> sums(static_cast<size_t>(M * row_floats));
        Buffer::copy(sums.data(), Device::cpu, row_sq.data(), Device::cuda, row_sq.size());

        EXPECT_EQ(got_residual, want_residual);
        // Every copy of the sums (the second GEMM's CTAs each read one).
        const int64_t stride = (blocks + 31) / 32 * 32;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t copy = 1; copy < row_floats / stride; ++copy)
            for (int64_t b = 0; b < blocks; ++b)
              EXPECT_EQ(sums[static_cast<size_t>(m * row_floats + copy * stride + b)],
                        sums[static_cast<size_t>(m * row_floats + b)]) << "copy " << copy;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t b = 0; b < blocks; ++b) {
            double want = 0;
            for (int64_t col = b * 128; col < std::min(c.H, (b + 1) * 128); ++col) {
              const double v = from_bits(got_residual[static_cast<size_t>(m * c.H + col)], c.dtype);
              want += v * v;
            }
            EXPECT_NEAR(sums[static_cast<size_t>(m * row_floats + b)], want, 1e-5 * want) << "row " << m << " block " << b;
          }
        double err = 0, scale = 0;
        for (size_t i = 0; i < want_out.size(); ++i) {
          const double a = from_bits(got_out[i], c.dtype), b = from_bits(want_out[i], c.dtype);
          ASSERT_TRUE(std::isfinite(a)) << "element " << i;
          err = std::max(err, std::fabs(a - b));
          scale = std::max(scale, std::fabs(b));
        }
        EXPECT_LE(err, 2e-3 * scale);
        Problem p{M, second_layer, c.dtype, normed_bits, {}, {}};
        EXPECT_TRUE(matches_reference(make_problem_from(std::move(p)), got_out));
      }
    }
  }
  // Refused: another strategy; act-order weights, the residual or x_silu_mul
  // with the norm; the norm without its sums.
  const W4A16Weights w = W4A16Weights::prepare(test::random_layer(256, 64, 64, ZeroKind::sym, 3), DType::f16);
  Buffer x(2 * 512 * 2, Device::cuda), y(2 * 64 * 2, Device::cuda), sums(64, Device::cuda);
  const auto xv = TensorView::contiguous(x.data(), DType::f16, {2, 256}, Device::cuda);
  const auto yv = TensorView::contiguous(y.data(), DType::f16, {2, 64}, Device::cuda);
  W4A16Options automatic;
  automatic.residual_row_sq = sums.as<float>();
  EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(xv, w, yv, ws, automatic); }, ErrorKind::unsupported,
                                 {"residual_row_sq", "gemv", "auto"}));
  W4A16Options norm{W4A16Strategy::gemv, 0};
  norm.x_norm_weight = x.data();
  EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(xv, w, yv, ws, norm); }, ErrorKind::invalid_argument,
                                 {"x_norm_row_sq"}));
  norm.x_norm_row_sq = sums.as<float>();
  const W4A16Weights act_order =
      W4A16Weights::prepare(test::random_layer(256, 64, 64, ZeroKind::sym, 4, /*act_order=*/true), DType::f16);
  EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(xv, act_order, yv, ws, norm); }, ErrorKind::unsupported,
                                 {"x_norm_weight", "act-order"}));
  W4A16Options with_residual = norm;
  with_residual.residual_row_sq = sums.as<float>();
  EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(xv, w, yv, ws, with_residual); }, ErrorKind::unsupported,
                                 {"x_norm_weight", "residual_row_sq"}));
  W4A16Options both = norm;
  both.x_silu_mul = true;
  EXPECT_TRUE(test::throws_error(
      [&] { w4a16_gemm(TensorView::contiguous(x.data(), DType::f16, {2, 512}, Device::cuda), w, yv, ws, both); },
      ErrorKind::unsupported, {"x_norm_weight", "x_silu_mul"}));
}

// The per-head norm weights (q, then k: fp16 around 1) and the RoPE
// frequencies of a head_dim, on the device, for the attention-inputs tests.
struct HeadTables {
  Buffer norms, freq;
  TensorView q_norm, k_norm;
};
HeadTables make_head_tables(int64_t hd, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> norm_bits(static_cast<size_t>(2 * hd));
  for (auto& v : norm_bits) v = to_bits(1.0f + 0.2f * normal(rng), DType::f16);
  std::vector<float> inv_freq(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    inv_freq[static_cast<size_t>(i)] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / hd));
  HeadTables t{Buffer(norm_bits.size() * 2, Device::cuda), Buffer(inv_freq.size() * 4, Device::cuda), {}, {}};
  Buffer::copy(t.norms.data(), Device::cuda, norm_bits.data(), Device::cpu, t.norms.size());
  Buffer::copy(t.freq.data(), Device::cuda, inv_freq.data(), Device::cpu, t.freq.size());
  t.q_norm = TensorView::contiguous(t.norms.data(), DType::f16, {hd}, Device::cuda);
  t.k_norm = TensorView::contiguous(static_cast<std::byte*>(t.norms.data()) + hd * 2, DType::f16, {hd}, Device::cuda);
  return t;
}

// W4A16AttentionInputs with the per-head norms, eps 1e-6, half RoPE.
W4A16AttentionInputs attention_inputs_of(int64_t heads, int64_t kv_heads, int64_t hd, const HeadTables& t,
                                         const Buffer& positions) {
  W4A16AttentionInputs inputs;
  inputs.num_heads = heads;
  inputs.num_kv_heads = kv_heads;
  inputs.head_dim = hd;
  inputs.q_norm = t.q_norm.data;
  inputs.k_norm = t.k_norm.data;
  inputs.eps = 1e-6f;
  inputs.positions = positions.as<int32_t>();
  inputs.inv_freq = t.freq.as<float>();
  return inputs;
}

// W4A16AttentionInputs::q_rotation_signs: the QKV epilogue writes the
// queries rotated and scaled exactly as the host's Hadamard rotation does
// (Rotation::rotate, then the scale: the decode attention's own rotation
// has the same bits), and k/v as without it; head_dim 128 and 64, one and
// three rows, auto and forced K splits.
TEST(W4A16Gemm, GemvAttentionInputsRotateQueriesAsTheHostRotation) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  constexpr int64_t kHeads = 4, kKvHeads = 2, K = 256;
  constexpr float kScale = 0.1275f;  // ~ log2(e) / sqrt(128)
  uint64_t seed = 2900;
  for (const int64_t hd : {128, 64}) {
    const int64_t N = (kHeads + 2 * kKvHeads) * hd;
    const auto layer = test::random_layer(K, N, 128, ZeroKind::asym, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
    std::mt19937_64 rng(seed++);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const HeadTables tables = make_head_tables(hd, rng);
    const kv::Rotation rot = kv::Rotation::hadamard(static_cast<int>(hd), seed++);
    Buffer signs(static_cast<size_t>(hd) * 4, Device::cuda);
    Buffer::copy(signs.data(), Device::cuda, rot.signs().data(), Device::cpu, signs.size());
    for (const int64_t M : {1, 3}) {
      const std::vector<int32_t> positions = {16, 15, 39};
      std::vector<uint16_t> x(static_cast<size_t>(M * K));
      for (auto& v : x) v = to_bits(normal(rng), DType::f16);
      Buffer xb(x.size() * 2, Device::cuda), y(static_cast<size_t>(M * N) * 2, Device::cuda),
          pos(static_cast<size_t>(M) * 4, Device::cuda);
      Buffer::copy(xb.data(), Device::cuda, x.data(), Device::cpu, xb.size());
      Buffer::copy(pos.data(), Device::cuda, positions.data(), Device::cpu, pos.size());
      Buffer outs[2][3];
      for (auto& o : outs)
        for (int k = 0; k < 3; ++k)
          o[k] = Buffer(static_cast<size_t>(M * (k == 0 ? kHeads : kKvHeads) * hd) * 4, Device::cuda);
      auto host_floats = [&](const Buffer& b) {
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> h(b.size() / 4);
        Buffer::copy(h.data(), Device::cpu, b.data(), Device::cuda, b.size());
        return h;
      };
      const auto y_view = TensorView::contiguous(y.data(), DType::f16, {M, N}, Device::cuda);
      const auto x_view = TensorView::contiguous(xb.data(), DType::f16, {M, K}, Device::cuda);
      for (const int split : {0, 3}) {
        SCOPED_TRACE(testing::Message() << "head_dim " << hd << " M=" << M << " split " << split);
        for (auto& o : outs)
          for (Buffer& b : o) LOWBIT_CUDA_CHECK(cudaMemset(b.data(), 0xFF, b.size()));
        W4A16Options options{W4A16Strategy::gemv, split};
        for (int fused = 0; fused < 2; ++fused) {
          W4A16AttentionInputs inputs = attention_inputs_of(kHeads, kKvHeads, hd, tables, pos);
          inputs.q_out = outs[fused][0].as<float>();
          inputs.k_out = outs[fused][1].as<float>();
          inputs.v_out = outs[fused][2].as<float>();
          if (fused == 1) {
            inputs.q_rotation_signs = signs.as<float>();
            inputs.q_scale = kScale;
          }
          options.attention_inputs = &inputs;
          w4a16_gemm(x_view, w, y_view, ws, options);
        }
        for (int k = 1; k < 3; ++k)
          EXPECT_EQ(host_floats(outs[1][k]), host_floats(outs[0][k])) << "k, v"[3 * (k - 1)];
        const std::vector<float> q = host_floats(outs[0][0]), got = host_floats(outs[1][0]);
        std::vector<float> rotated(static_cast<size_t>(hd));
        size_t mismatches = 0;
        for (int64_t h = 0; h < M * kHeads; ++h) {
          rot.rotate(std::span<const float>(q.data() + h * hd, static_cast<size_t>(hd)), rotated);
          for (int64_t i = 0; i < hd; ++i) {
            const float want = rotated[static_cast<size_t>(i)] * kScale;
            mismatches += std::memcmp(&want, &got[static_cast<size_t>(h * hd + i)], 4) != 0;
          }
        }
        EXPECT_EQ(mismatches, 0u) << "of " << q.size() << " rotated query elements";
      }
    }
  }
}

// W4A16Options::attention_inputs: the QKV GEMM's epilogue doing the q/k
// norm, RoPE and fp32 widening gives the bits of the plain gemv followed by
// ops::qkv_to_attention_inputs, for head dimensions 128 and 64 (one and two
// heads per block of 128 columns), with and without the per-head norms, both
// RoPE layouts, positions up to 70000 (large angles), 1 and 3 rows, K split
// automatic and 5, and with x read through RMSNorm (the engine's qkv GEMM
// of every layer after the first). The options it cannot honour are refused.
TEST(W4A16Gemm, GemvAttentionInputsEqualTheGemmThenTheirKernel) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  constexpr int64_t kHeads = 4, kKvHeads = 2, K = 256;
  uint64_t seed = 1700;
  for (const int64_t hd : {128, 64}) {
    const int64_t N = (kHeads + 2 * kKvHeads) * hd;
    const auto layer = test::random_layer(K, N, 128, ZeroKind::asym, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
    std::mt19937_64 rng(seed++);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const HeadTables tables = make_head_tables(hd, rng);
    const TensorView& q_norm_view = tables.q_norm;
    const TensorView& k_norm_view = tables.k_norm;
    const Buffer& freq = tables.freq;
    for (const int64_t M : {1, 3}) {
      std::vector<uint16_t> x(static_cast<size_t>(M * K));
      for (auto& v : x) v = to_bits(normal(rng), DType::f16);
      const std::vector<int32_t> positions = {5, 70000, 1234};
      Buffer xb(x.size() * 2, Device::cuda), y(static_cast<size_t>(M * N) * 2, Device::cuda),
          pos(static_cast<size_t>(M) * 4, Device::cuda);
      Buffer::copy(xb.data(), Device::cuda, x.data(), Device::cpu, xb.size());
      Buffer::copy(pos.data(), Device::cuda, positions.data(), Device::cpu, pos.size());
      Buffer outs[2][3];
      for (auto& o : outs)
        for (int k = 0; k < 3; ++k)
          o[k] = Buffer(static_cast<size_t>(M * (k == 0 ? kHeads : kKvHeads) * hd) * 4, Device::cuda);
      auto f32_view = [&](Buffer& b, int64_t heads) {
        return TensorView::contiguous(b.data(), DType::f32, {M, heads * hd}, Device::cuda);
      };
      auto bits_of = [&](const Buffer& b) {
        LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint32_t> h(b.size() / 4);
        Buffer::copy(h.data(), Device::cpu, b.data(), Device::cuda, b.size());
        return h;
      };
      for (const bool with_norms : {true, false})
        for (const bool interleaved : {false, true})
          for (const int split : {0, 5}) {
            SCOPED_TRACE(testing::Message() << "head_dim " << hd << " M=" << M << " norms " << with_norms
                                            << " interleaved " << interleaved << " split " << split);
            for (auto& o : outs)
              for (Buffer& b : o) LOWBIT_CUDA_CHECK(cudaMemset(b.data(), 0xFF, b.size()));
            const W4A16Options plain{W4A16Strategy::gemv, split};
            const auto y_view = TensorView::contiguous(y.data(), DType::f16, {M, N}, Device::cuda);
            const auto x_view = TensorView::contiguous(xb.data(), DType::f16, {M, K}, Device::cuda);
            w4a16_gemm(x_view, w, y_view, ws, plain);
            ops::qkv_to_attention_inputs(y_view, kHeads, kKvHeads, hd, with_norms ? &q_norm_view : nullptr,
                                         with_norms ? &k_norm_view : nullptr, 1e-6f,
                                         TensorView::contiguous(pos.data(), DType::i32, {M}, Device::cuda),
                                         TensorView::contiguous(freq.data(), DType::f32, {hd / 2}, Device::cuda),
                                         interleaved ? ops::RopeStyle::interleaved : ops::RopeStyle::half,
                                         f32_view(outs[0][0], kHeads), f32_view(outs[0][1], kKvHeads),
                                         f32_view(outs[0][2], kKvHeads));
            W4A16AttentionInputs inputs = attention_inputs_of(kHeads, kKvHeads, hd, tables, pos);
            if (!with_norms) inputs.q_norm = inputs.k_norm = nullptr;
            inputs.rope_interleaved = interleaved;
            inputs.q_out = outs[1][0].as<float>();
            inputs.k_out = outs[1][1].as<float>();
            inputs.v_out = outs[1][2].as<float>();
            W4A16Options fused = plain;
            fused.attention_inputs = &inputs;
            w4a16_gemm(x_view, w, y_view, ws, fused);
            for (int k = 0; k < 3; ++k) EXPECT_EQ(bits_of(outs[1][k]), bits_of(outs[0][k])) << "q, k, v"[3 * k];
          }
      // With x read through RMSNorm: a residual GEMM (128 -> K) writes the
      // sums, then the norm-reading GEMM, plain or making the inputs.
      const auto first_layer = test::random_layer(128, K, 128, ZeroKind::asym, seed++);
      const W4A16Weights first = W4A16Weights::prepare(first_layer, DType::f16);
      std::vector<uint16_t> x0(static_cast<size_t>(M * 128)), residual(static_cast<size_t>(M * K)),
          weight(static_cast<size_t>(K));
      for (auto& v : x0) v = to_bits(normal(rng), DType::f16);
      for (auto& v : residual) v = to_bits(3.0f * normal(rng), DType::f16);
      for (auto& v : weight) v = to_bits(1.0f + 0.3f * normal(rng), DType::f16);
      Buffer x0b(x0.size() * 2, Device::cuda), res(residual.size() * 2, Device::cuda), nw(weight.size() * 2, Device::cuda),
          sums(static_cast<size_t>(M * w4a16_row_sq_floats(K)) * 4, Device::cuda);
      Buffer::copy(x0b.data(), Device::cuda, x0.data(), Device::cpu, x0b.size());
      Buffer::copy(res.data(), Device::cuda, residual.data(), Device::cpu, res.size());
      Buffer::copy(nw.data(), Device::cuda, weight.data(), Device::cpu, nw.size());
      W4A16Options adds{W4A16Strategy::gemv, 0};
      adds.residual_row_sq = sums.as<float>();
      w4a16_gemm(TensorView::contiguous(x0b.data(), DType::f16, {M, 128}, Device::cuda), first,
                 TensorView::contiguous(res.data(), DType::f16, {M, K}, Device::cuda), ws, adds);
      W4A16Options normalizes{W4A16Strategy::gemv, 0};
      normalizes.x_norm_weight = nw.data();
      normalizes.x_norm_row_sq = sums.as<float>();
      normalizes.x_norm_eps = 1e-6f;
      const auto res_view = TensorView::contiguous(res.data(), DType::f16, {M, K}, Device::cuda);
      const auto y_view = TensorView::contiguous(y.data(), DType::f16, {M, N}, Device::cuda);
      for (auto& o : outs)
        for (Buffer& b : o) LOWBIT_CUDA_CHECK(cudaMemset(b.data(), 0xFF, b.size()));
      w4a16_gemm(res_view, w, y_view, ws, normalizes);
      ops::qkv_to_attention_inputs(y_view, kHeads, kKvHeads, hd, &q_norm_view, &k_norm_view, 1e-6f,
                                   TensorView::contiguous(pos.data(), DType::i32, {M}, Device::cuda),
                                   TensorView::contiguous(freq.data(), DType::f32, {hd / 2}, Device::cuda),
                                   ops::RopeStyle::half, f32_view(outs[0][0], kHeads), f32_view(outs[0][1], kKvHeads),
                                   f32_view(outs[0][2], kKvHeads));
      W4A16AttentionInputs inputs = attention_inputs_of(kHeads, kKvHeads, hd, tables, pos);
      inputs.q_out = outs[1][0].as<float>();
      inputs.k_out = outs[1][1].as<float>();
      inputs.v_out = outs[1][2].as<float>();
      normalizes.attention_inputs = &inputs;
      w4a16_gemm(res_view, w, y_view, ws, normalizes);
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(bits_of(outs[1][k]), bits_of(outs[0][k])) << "with the norm, head_dim " << hd << " M=" << M;

      // Refused: another strategy, with the residual, a head_dim that does
      // not divide 128, heads that are not N.
      W4A16Options bad{W4A16Strategy::automatic, 0};
      bad.attention_inputs = &inputs;
      EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(res_view, w, y_view, ws, bad); }, ErrorKind::unsupported,
                                     {"attention_inputs", "gemv", "auto"}));
      bad.strategy = W4A16Strategy::gemv;
      bad.residual_row_sq = sums.as<float>();
      EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(res_view, w, y_view, ws, bad); }, ErrorKind::unsupported,
                                     {"attention_inputs", "residual_row_sq"}));
      bad.residual_row_sq = nullptr;
      W4A16AttentionInputs odd = inputs;
      odd.head_dim = 96;
      bad.attention_inputs = &odd;
      EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(res_view, w, y_view, ws, bad); }, ErrorKind::unsupported,
                                     {"attention_inputs", "96", "divides 128"}));
      odd = inputs;
      odd.head_dim = 32;
      odd.num_heads = kHeads * hd / 32;
      odd.num_kv_heads = kKvHeads * hd / 32;
      odd.q_rotation_signs = freq.as<float>();  // any device pointer: refused before use
      EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(res_view, w, y_view, ws, bad); }, ErrorKind::unsupported,
                                     {"attention_inputs", "64 and 128", "32"}));
      odd = inputs;
      odd.num_heads = 5;
      EXPECT_TRUE(test::throws_error([&] { w4a16_gemm(res_view, w, y_view, ws, bad); }, ErrorKind::invalid_argument,
                                     {"attention_inputs", std::to_string(N)}));
    }
  }
}

TEST(W4A16Gemm, WgmmaRunsOnComputeCapability9) {
  LOWBIT_REQUIRE_GPU();
  int major = 0;
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major != 9) {
    EXPECT_FALSE(w4a16_wgmma_available());
    return;
  }
  // The default build compiles sm_90a; a Hopper device must get the wgmma
  // path from five rows up.
  EXPECT_TRUE(w4a16_wgmma_available());
  const auto layer = test::random_layer(256, 64, 64, ZeroKind::sym, 3);
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
  EXPECT_EQ(w4a16_plan(256, w).strategy, W4A16Strategy::wgmma);
  EXPECT_EQ(w4a16_plan(5, w).strategy, W4A16Strategy::wgmma);
  // One to four rows: the gemv kernel, at the untimed split rule
  // (gemv_split_rule).
  for (const int64_t M : {1, 2, 3, 4}) {
    const W4A16Plan plan = w4a16_plan(M, w);
    EXPECT_EQ(plan.strategy, W4A16Strategy::gemv) << "M = " << M;
    // (One column block: a single round, so the resident CTAs do not matter.)
    EXPECT_EQ(plan.split_k, gemv_split_rule(4, 1, cuda_device_info(0).sm_count, 1, M)) << "M = " << M;
  }
  // M > 512: wgmma when its 256-row tiles fill the waves of the device,
  // decoupled when they do not (here: 4 tiles).
  EXPECT_EQ(w4a16_plan(1024, w).strategy, W4A16Strategy::decoupled);
  const W4A16Weights big = W4A16Weights::random(1024, 33792, 128, DType::f16, 5);  // 264 column tiles
  EXPECT_EQ(w4a16_plan(1024, big).strategy, W4A16Strategy::wgmma);
  // 257-384 rows: 128-row tiles where two rows of 256-row tiles would fill
  // the wave poorly (choose_wgmma_tile_rows); the tile is what the plan
  // runs, and the output is right.
  const int sms = cuda_device_info(0).sm_count;
  const auto o_layer = test::random_layer(256, 5120, 128, ZeroKind::asym, 6);  // 40 column tiles; short K for the reference
  const W4A16Weights o_proj = W4A16Weights::prepare(o_layer, DType::f16);
  if (4 * 80 < 3 * sms) {
    EXPECT_EQ(w4a16_plan(384, o_proj).rows_per_pass, 128);
    EXPECT_EQ(w4a16_plan(257, o_proj).rows_per_pass, 128);
  }
  EXPECT_EQ(w4a16_plan(448, o_proj).rows_per_pass, 256);
  EXPECT_EQ(w4a16_plan(256, o_proj).rows_per_pass, 256);
  W4A16Workspace ws;
  const Problem p = make_problem(384, o_layer, DType::f16, 7);
  EXPECT_TRUE(matches_reference(p, run_gpu(p, o_proj, ws, {W4A16Strategy::automatic, 0})));
}

// auto over 256 rows: the rows past the last whole 256-row tile as a GEMM of
// their own (choose_row_remainder). Forced, on layers small enough for the
// CPU reference (f16 and bf16, odd N, act-order, row counts whose remainder
// takes the gemv kernel, a 16-, a 128- and a 256-row wgmma tile; up to 512
// rows, where the plan is wgmma's whatever the fill), every row is
// the reference's; by the rule, a layer whose row of 256-row tiles costs
// far more than re-reading its weights splits at 257 rows and a small one
// does not.
TEST(W4A16Gemm, AutoRunsTheRowsPastTheLast256RowTileAsASecondGemm) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "the remainder split is part of the wgmma plan (sm_90a)";
  struct Case { int64_t M, K, N; DType dtype; bool act_order; };
  uint64_t seed = 800;
  for (const Case& c : {Case{257, 512, 1000, DType::f16, false}, Case{260, 512, 1000, DType::bf16, false},
                        Case{270, 256, 392, DType::f16, true}, Case{400, 256, 392, DType::f16, false},
                        Case{384, 256, 392, DType::bf16, false}}) {
    const auto layer = test::random_layer(c.K, c.N, 128, ZeroKind::asym, seed++, c.act_order);
    const W4A16Weights w = W4A16Weights::prepare(layer, c.dtype);
    W4A16Options forced{W4A16Strategy::automatic, 0};
    forced.row_remainder = 2;
    const W4A16Plan plan = w4a16_plan(c.M, w, forced);
    const std::string where = "M = " + std::to_string(c.M) + ", N = " + std::to_string(c.N);
    ASSERT_EQ(plan.remainder_rows, c.M % 256) << where;
    EXPECT_EQ(plan.strategy, W4A16Strategy::wgmma) << where;
    EXPECT_EQ(w4a16_plan(c.M, w, {W4A16Strategy::automatic, 0}).remainder_rows, 0) << where << ": a small layer";
    W4A16Workspace ws;
    const Problem p = make_problem(c.M, layer, c.dtype, seed++);
    EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, forced))) << where;
    EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, {W4A16Strategy::automatic, 0}))) << where;
  }
  // By the rule, with the device's SM count: Qwen3-14B's gate/up projection
  // (272 column tiles of 80 k-iterations) splits 1, 64 and 128 rows off,
  // not 129 (kMaxRemainderRows), and nothing at 256 or 512; an explicit
  // strategy never splits.
  const W4A16Weights gateup = W4A16Weights::random(5120, 34816, 128, DType::f16, 9);
  if (cuda_device_info(0).sm_count <= 144) {
    EXPECT_EQ(w4a16_plan(257, gateup).remainder_rows, 1);
    EXPECT_EQ(w4a16_plan(320, gateup).remainder_rows, 64);
    EXPECT_EQ(w4a16_plan(384, gateup).remainder_rows, 128);
  }
  EXPECT_EQ(w4a16_plan(1025, gateup).remainder_rows, 1);
  EXPECT_EQ(w4a16_plan(385, gateup).remainder_rows, 0);
  EXPECT_EQ(w4a16_plan(256, gateup).remainder_rows, 0);
  EXPECT_EQ(w4a16_plan(512, gateup).remainder_rows, 0);
  EXPECT_EQ(w4a16_plan(257, gateup, {W4A16Strategy::wgmma, 0}).remainder_rows, 0);
  W4A16Options never{W4A16Strategy::automatic, 0};
  never.row_remainder = 1;
  EXPECT_EQ(w4a16_plan(257, gateup, never).remainder_rows, 0);
}

// Every kernel that opts in to more than 48 KB of shared memory does so on
// each device it runs on (lowbit/cuda/kernel_smem.h): device 0 first, then
// every other device with the same kernels, which a per-kernel "configured
// once" flag failed with a launch error. One device checks device 0 only.
TEST(W4A16Gemm, EveryDeviceRunsTheSameKernels) {
  LOWBIT_REQUIRE_GPU();
  const auto layer = test::random_layer(1024, 320, 128, ZeroKind::asym, 91);
  for (int device = 0; device < cuda_device_count(); ++device) {
    const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16, device);
    EXPECT_EQ(w.device(), device);
    W4A16Workspace ws;
    std::vector<W4A16Strategy> run = {W4A16Strategy::gemv, W4A16Strategy::split_k_deterministic,
                                      W4A16Strategy::decoupled};
    if (w4a16_wgmma_available(device)) run.push_back(W4A16Strategy::wgmma);
    for (int64_t M : {1, 64, 300}) {
      const Problem p = make_problem(M, layer, DType::f16, 92 + static_cast<uint64_t>(M));
      for (W4A16Strategy s : run) {
        SCOPED_TRACE(testing::Message() << "device " << device << " M=" << M << " " << w4a16_strategy_name(s));
        EXPECT_TRUE(matches_reference(p, run_gpu_on(device, p, w, ws, {s, 0})));
      }
    }
  }
  if (cuda_device_count() < 2) std::printf("[ note     ] one CUDA device: checked device 0 only\n");
}

TEST(W4A16Gemm, WgmmaLargeMAndDeterministicSplits) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  uint64_t seed = 70;
  for (DType dtype : {DType::f16, DType::bf16})
    for (ZeroKind kind : {ZeroKind::asym, ZeroKind::float_min_f16}) {
      const auto layer = test::random_layer(1024, 320, 64, kind, seed++);
      const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
      for (int64_t M : {129, 600}) {
        const Problem p = make_problem(M, layer, dtype, seed++);
        for (int split : {0, 1, 5}) {
          SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << test::zero_kind_name(kind) << " M=" << M
                                          << " split " << split);
          const auto first = run_gpu(p, w, ws, {W4A16Strategy::wgmma, split});
          EXPECT_TRUE(matches_reference(p, first));
          if (split == 5) EXPECT_EQ(run_gpu(p, w, ws, {W4A16Strategy::wgmma, split}), first);
        }
      }
    }
}

TEST(W4A16Gemm, WgmmaEveryTileAndOddColumnBlocks) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  // N = 200 pads to 256 (two full column tiles); N = 136 pads to 192 (the
  // second tile has one 64-column block: its other warpgroup stores nothing).
  uint64_t seed = 90;
  for (int64_t N : {200, 136}) {
    const auto layer = test::random_layer(576, N, 32, ZeroKind::asym, seed++);
    for (DType dtype : {DType::f16, DType::bf16}) {
      const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
      for (int64_t M : {1, 40, 100, 300}) {
        const Problem p = make_problem(M, layer, dtype, seed++);
        for (int rows : {16, 32, 64, 128, 256})
          for (int split : {1, 4}) {
            SCOPED_TRACE(testing::Message() << "N=" << N << " " << dtype_name(dtype) << " M=" << M << " rows " << rows
                                            << " split " << split);
            W4A16Options o{W4A16Strategy::wgmma, split};
            o.rows_per_tile = rows;
            EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, o)));
          }
      }
    }
  }
  W4A16Options bad{W4A16Strategy::wgmma, 0};
  bad.rows_per_tile = 48;
  const auto layer = test::random_layer(128, 64, 64, ZeroKind::sym, 1);
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
  EXPECT_TRUE(test::throws_error([&] { (void)w4a16_plan(4, w, bad); }, ErrorKind::invalid_argument, {"rows_per_tile"}));
}

// The 16-row tile with integer zero points and one scale group per
// k-iteration or per channel applies the scales after the wgmma (kScaleAfter in
// w4a16_wgmma.cu): each scale group's sums start afresh and are scaled after
// its last k-iteration (7 rows). 23 rows run the 32-row tile, which multiplies
// each weight by its scale (v40 scaled after the product there too) with the
// one-group instances of v41 (kOneGroup). K splits whose ranges start and end inside a group
// (K = 1280, 20 k-iterations; groups of 256 rows are 4 of them; split 3 cuts
// at 6 and 13), groups of 64 and 128, per channel, and group 32 (which keeps
// the multiply per weight) beside them; a row count for each tile and both
// dtypes. A group scaled twice, or not restarted, is off by whole terms.
TEST(W4A16Gemm, WgmmaScaleAfterTheProductAtEveryGroupAndSplit) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  uint64_t seed = 160;
  for (int group : {256, 128, 64, -1, 32})
    for (ZeroKind kind : {ZeroKind::asym, ZeroKind::sym}) {
      const auto layer = test::random_layer(1280, 328, group, kind, seed++);
      for (DType dtype : {DType::f16, DType::bf16}) {
        const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
        for (int64_t M : {7, 23}) {
          const Problem p = make_problem(M, layer, dtype, seed++);
          for (int split : {1, 3, 7}) {
            SCOPED_TRACE(testing::Message() << "g=" << group << " " << test::zero_kind_name(kind) << " "
                                            << dtype_name(dtype) << " M=" << M << " split " << split);
            const auto first = run_gpu(p, w, ws, {W4A16Strategy::wgmma, split});
            EXPECT_TRUE(matches_reference(p, first));
            EXPECT_EQ(run_gpu(p, w, ws, {W4A16Strategy::wgmma, split}), first);
          }
        }
      }
    }
}

// Grids of more than one wave whose leftover tiles are split along K
// (w4a16_wave_rule.h): 150 column tiles of 19136 columns (the last with one
// 64-column block) at M = 300 (partial last row tiles at 64, 128 and 256
// rows per tile), forced tail splits (the rule itself is tested on the CPU).
TEST(W4A16Gemm, WgmmaTailTilesSplitAlongK) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  uint64_t seed = 120;
  for (DType dtype : {DType::f16, DType::bf16}) {
    const ZeroKind kind = dtype == DType::f16 ? ZeroKind::asym : ZeroKind::float_min_f16;
    const auto layer = test::random_layer(384, 19100, 128, kind, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
    const Problem p = make_problem(300, layer, dtype, seed++);
    for (int rows : {64, 128, 256})
      for (int tail_split : {2, 3, 6}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " rows " << rows << " tail split " << tail_split);
        W4A16Options o{W4A16Strategy::wgmma, 0};
        o.rows_per_tile = rows;
        o.tail_split = tail_split;
        const W4A16Plan plan = w4a16_plan(p.M, w, o);
        ASSERT_GT(plan.tail_tiles, 0) << "the grid must not be a whole number of waves of resident CTAs";
        EXPECT_EQ(plan.tail_split, tail_split);
        EXPECT_EQ(plan.split_k, 1);
        const auto first = run_gpu(p, w, ws, o);
        EXPECT_TRUE(matches_reference(p, first));
        EXPECT_EQ(run_gpu(p, w, ws, o), first);  // the fix-up sums splits in a fixed order
      }
  }
  // The rule's own choice on Qwen3-14B's gate/up layer at 256 rows (272
  // tiles on fewer SMs): a tail, except when the caller fixes split_k or
  // asks for none.
  const W4A16Weights gate_up = W4A16Weights::random(5120, 34816, 128, DType::f16, 7);
  EXPECT_GT(w4a16_plan(256, gate_up).tail_tiles, 0);
  EXPECT_EQ(w4a16_plan(256, gate_up, {W4A16Strategy::wgmma, 1}).tail_tiles, 0);
  W4A16Options none{W4A16Strategy::wgmma, 0};
  none.tail_split = 1;
  EXPECT_EQ(w4a16_plan(256, gate_up, none).tail_tiles, 0);
  W4A16Options bad{W4A16Strategy::wgmma, 0};
  bad.tail_split = -1;
  EXPECT_TRUE(test::throws_error([&] { (void)w4a16_plan(256, gate_up, bad); }, ErrorKind::invalid_argument,
                                 {"tail_split"}));
}

// The shared fix-up of K splits (W4A16Plan::shared_fixup): the split CTAs
// of a tile sum its partials together, a part each. It must give the
// bits of the last CTA's sum (the same order of additions) for uniform
// splits and tail splits on every tile that holds it, odd N (a last column
// tile with one 64-column block) and partial row tiles, and leave its
// counters zero (a second call gives the same bits). Forced past one wave
// (shared_fixup = 2), CTAs of the first wave wait for splits that cannot
// start until they leave: their bounded wait must run out and the last CTA of
// each tile sum the parts of those that gave up.
TEST(W4A16Gemm, WgmmaSharedFixupGivesTheLastCtasBits) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  uint64_t seed = 400;
  for (DType dtype : {DType::f16, DType::bf16}) {
    const ZeroKind kind = dtype == DType::f16 ? ZeroKind::asym : ZeroKind::float_min_f16;
    const auto layer = test::random_layer(1280, 328, 128, kind, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
    for (int64_t M : {50, 100, 300}) {
      const Problem p = make_problem(M, layer, dtype, seed++);
      for (int rows : {64, 128, 256})
        for (int split : {2, 3, 7, 16}) {
          SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " M=" << M << " rows " << rows << " split "
                                          << split);
          W4A16Options shared{W4A16Strategy::wgmma, split};
          shared.rows_per_tile = rows;
          W4A16Options alone = shared;
          alone.shared_fixup = 1;
          const int64_t ctas = (M + rows - 1) / rows * 3 * split;  // 328 columns: 3 column tiles
          if (ctas <= cuda_device_info(0).sm_count)  // one CTA per SM at least: within one wave
            EXPECT_TRUE(w4a16_plan(M, w, shared).shared_fixup);
          ASSERT_FALSE(w4a16_plan(M, w, alone).shared_fixup);
          const auto first = run_gpu(p, w, ws, shared);
          EXPECT_TRUE(matches_reference(p, first));
          EXPECT_EQ(run_gpu(p, w, ws, alone), first);
          EXPECT_EQ(run_gpu(p, w, ws, shared), first);  // the counters were left zero
        }
    }
  }
  // Tail splits on 150 column tiles (the last with one 64-column block).
  {
    const auto layer = test::random_layer(384, 19100, 128, ZeroKind::asym, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
    const Problem p = make_problem(300, layer, DType::f16, seed++);
    for (int rows : {64, 128, 256})
      for (int tail_split : {2, 3}) {
        SCOPED_TRACE(testing::Message() << "tail: rows " << rows << " tail split " << tail_split);
        W4A16Options shared{W4A16Strategy::wgmma, 0};
        shared.rows_per_tile = rows;
        shared.tail_split = tail_split;
        W4A16Options alone = shared;
        alone.shared_fixup = 1;
        const W4A16Plan plan = w4a16_plan(p.M, w, shared);
        ASSERT_GT(plan.tail_tiles, 0);
        // 256-row tiles: 300 tiles, a last wave of 300 - 2 x SMs, tail_split
        // CTAs each: within one wave on an H100 / H200.
        if (rows == 256 && plan.tail_tiles * plan.tail_split <= cuda_device_info(0).sm_count)
          EXPECT_TRUE(plan.shared_fixup);
        const auto first = run_gpu(p, w, ws, shared);
        EXPECT_TRUE(matches_reference(p, first));
        EXPECT_EQ(run_gpu(p, w, ws, alone), first);
        EXPECT_EQ(run_gpu(p, w, ws, shared), first);
      }
  }
  // Past one wave: 256-row tiles, one CTA per SM, 160 column tiles split 4
  // ways (640 CTAs). The rule keeps the last CTA's sum; forced, the first
  // wave's CTAs give up their waits.
  {
    const auto layer = test::random_layer(1024, 20480, 128, ZeroKind::sym, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
    const Problem p = make_problem(200, layer, DType::f16, seed++);
    W4A16Options rule{W4A16Strategy::wgmma, 4};
    rule.rows_per_tile = 256;
    EXPECT_FALSE(w4a16_plan(p.M, w, rule).shared_fixup) << "640 waiting CTAs do not fit in one wave";
    W4A16Options forced = rule;
    forced.shared_fixup = 2;
    ASSERT_TRUE(w4a16_plan(p.M, w, forced).shared_fixup);
    const auto first = run_gpu(p, w, ws, rule);
    EXPECT_TRUE(matches_reference(p, first));
    EXPECT_EQ(run_gpu(p, w, ws, forced), first);
    EXPECT_EQ(run_gpu(p, w, ws, forced), first);
    EXPECT_EQ(run_gpu(p, w, ws, rule), first);
  }
  // Kernels without it (16-, 32-row tiles, the three-CTA 64-row build) and
  // stream-K never share; bad values are named.
  const auto layer = test::random_layer(1280, 328, 128, ZeroKind::asym, 1);
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
  for (int rows : {16, 32}) {
    W4A16Options o{W4A16Strategy::wgmma, 4};
    o.rows_per_tile = rows;
    o.shared_fixup = 2;
    EXPECT_FALSE(w4a16_plan(rows, w, o).shared_fixup) << rows << " rows";
  }
  W4A16Options dense{W4A16Strategy::wgmma, 4};
  dense.rows_per_tile = 64;
  dense.wgmma_ctas_per_sm = 3;
  dense.shared_fixup = 2;
  EXPECT_FALSE(w4a16_plan(64, w, dense).shared_fixup);
  W4A16Options stream_k{W4A16Strategy::wgmma, 0};
  stream_k.rows_per_tile = 64;
  stream_k.stream_k_ctas = 20;
  stream_k.shared_fixup = 2;
  const W4A16Plan sk = w4a16_plan(64, w, stream_k);
  EXPECT_GT(sk.stream_k_ctas, 0);
  EXPECT_FALSE(sk.shared_fixup);
  W4A16Options bad{W4A16Strategy::wgmma, 0};
  bad.shared_fixup = 3;
  EXPECT_TRUE(test::throws_error([&] { (void)w4a16_plan(64, w, bad); }, ErrorKind::invalid_argument,
                                 {"shared_fixup"}));
}

TEST(W4A16Gemm, WgmmaStreamKRangesAcrossTiles) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  uint64_t seed = 140;
  for (DType dtype : {DType::f16, DType::bf16}) {
    const ZeroKind kind = dtype == DType::f16 ? ZeroKind::asym : ZeroKind::float_min_f16;
    // 15 column blocks of 64: the last column tile has one block only.
    const auto layer = test::random_layer(3584, 950, 128, kind, seed++);
    const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
    const Problem p = make_problem(300, layer, dtype, seed++);
    const int iters = static_cast<int>(w.K_padded() / 64);
    for (int rows : {64, 128, 256}) {
      const int tiles = (p.M + rows - 1) / rows * 8;
      // One CTA per tile (no partials); one more (every range but one
      // crosses a tile boundary); about two and five per tile (first, middle
      // and last pieces); one per k-iteration for the 256-row tile. Fewer
      // CTAs than tiles: ranges a little longer than a tile (one whole tile
      // between a first and a last piece in some), about two tiles, and all
      // tiles on two or three CTAs (many whole tiles inside each range).
      std::vector<int> ctas = {tiles, tiles + 1, 2 * tiles + 3, 5 * tiles + 1, tiles - 1, tiles / 2 + 1, 3, 2};
      if (rows == 256) ctas.push_back(tiles * iters);
      for (int g : ctas) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " rows " << rows << " tiles " << tiles << " CTAs "
                                        << g);
        W4A16Options o{W4A16Strategy::wgmma, 0};
        o.rows_per_tile = rows;
        o.stream_k_ctas = g;
        const W4A16Plan plan = w4a16_plan(p.M, w, o);
        ASSERT_EQ(plan.stream_k_ctas, g);
        EXPECT_EQ(plan.split_k, 1);
        EXPECT_EQ(plan.tail_tiles, 0);
        const auto first = run_gpu(p, w, ws, o);
        EXPECT_TRUE(matches_reference(p, first));
        EXPECT_EQ(run_gpu(p, w, ws, o), first);  // each tile is summed in a fixed order
      }
    }
  }
  // The rule's own choice on Qwen3-14B's down projection at 512 rows: 80
  // tiles of 256 rows, fewer than a wave on an H100 (132 SMs), one whole
  // tile per CTA under the uniform split.
  const W4A16Weights down = W4A16Weights::random(17408, 5120, 128, DType::f16, 8);
  const int sms = cuda_device_info(0).sm_count;
  if (sms > 80) {
    const W4A16Plan plan = w4a16_plan(512, down);
    EXPECT_EQ(plan.strategy, W4A16Strategy::wgmma);
    EXPECT_EQ(plan.stream_k_ctas, sms);
    EXPECT_EQ(plan.split_k, 1);
  }
  EXPECT_EQ(w4a16_plan(512, down, {W4A16Strategy::wgmma, 2}).stream_k_ctas, 0);
  W4A16Options none{W4A16Strategy::wgmma, 0};
  none.stream_k_ctas = 1;
  EXPECT_EQ(w4a16_plan(512, down, none).stream_k_ctas, 0);
  W4A16Options bad{W4A16Strategy::wgmma, 0};
  bad.stream_k_ctas = -1;
  EXPECT_TRUE(test::throws_error([&] { (void)w4a16_plan(512, down, bad); }, ErrorKind::invalid_argument,
                                 {"stream_k_ctas"}));
}

// The 64-row tile's two builds, two and three resident CTAs per SM
// (W4A16Options::wgmma_ctas_per_sm), run the same code in the same order:
// bit-identical outputs under the same plan, both within the reference's
// bound, through the uniform split, stream-K and a tail split; and the
// three-CTA build really keeps three per SM (its wave shows in the plan).
TEST(W4A16Gemm, WgmmaThreeCtaBuildMatchesTwoCtaBuild) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  uint64_t seed = 170;
  for (DType dtype : {DType::f16, DType::bf16}) {
    const ZeroKind kind = dtype == DType::f16 ? ZeroKind::asym : ZeroKind::float_min_f16;
    const auto layer = test::random_layer(3584, 950, 128, kind, seed++);  // 8 column tiles, the last one block
    const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
    for (int64_t M : {33, 64}) {
      const Problem p = make_problem(M, layer, dtype, seed++);
      // split 1 and 3; stream-K over 9 and 19 CTAs (8 tiles); the rule.
      for (int variant = 0; variant < 5; ++variant) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " M " << M << " variant " << variant);
        W4A16Options o{W4A16Strategy::wgmma, variant == 0 ? 1 : (variant == 1 ? 3 : 0)};
        if (variant == 2) o.stream_k_ctas = 9;
        if (variant == 3) o.stream_k_ctas = 19;
        W4A16Options two = o, three = o;
        two.wgmma_ctas_per_sm = 2;
        three.wgmma_ctas_per_sm = 3;
        const W4A16Plan plan_two = w4a16_plan(M, w, two), plan_three = w4a16_plan(M, w, three);
        ASSERT_EQ(plan_three.rows_per_pass, 64);
        EXPECT_TRUE(plan_three.wgmma_dense);
        EXPECT_FALSE(plan_two.wgmma_dense);
        const auto y_three = run_gpu(p, w, ws, three);
        EXPECT_TRUE(matches_reference(p, y_three));
        if (variant < 4) {  // the same plan: the same sums
          ASSERT_EQ(plan_two.split_k, plan_three.split_k);
          ASSERT_EQ(plan_two.stream_k_ctas, plan_three.stream_k_ctas);
          EXPECT_EQ(run_gpu(p, w, ws, two), y_three);
        } else {
          EXPECT_TRUE(matches_reference(p, run_gpu(p, w, ws, two)));
        }
      }
    }
  }
  // A grid of 3 x SMs + 4 tiles of 64 rows: the three-CTA wave leaves 4
  // tiles over, which the tail rule splits along K (8 k-iterations: 2 ways);
  // the two-CTA wave leaves SMs + 4, too many to split.
  const int sms = cuda_device_info(0).sm_count;
  const auto wide = test::random_layer(512, (3 * sms + 4) * 128, 128, ZeroKind::sym, seed++);
  const W4A16Weights ww = W4A16Weights::prepare(wide, DType::f16);
  const Problem pw = make_problem(40, wide, DType::f16, seed++);
  W4A16Options three{W4A16Strategy::wgmma, 0}, two{W4A16Strategy::wgmma, 0};
  three.wgmma_ctas_per_sm = 3;
  two.wgmma_ctas_per_sm = 2;
  const W4A16Plan tail = w4a16_plan(pw.M, ww, three);
  EXPECT_EQ(tail.tail_tiles, 4);
  EXPECT_EQ(tail.tail_split, 2);
  EXPECT_EQ(w4a16_plan(pw.M, ww, two).tail_tiles, 0);
  EXPECT_TRUE(matches_reference(pw, run_gpu(pw, ww, ws, three)));
  // The rule: K longer than 128 k-iterations takes the three-CTA build
  // (Qwen3-14B down, 272); a short-K grid of fewer tiles than a two-CTA
  // wave does not (4096 x 4096: 32 tiles, 64 k-iterations).
  EXPECT_TRUE(w4a16_plan(64, W4A16Weights::random(17408, 5120, 128, DType::f16, 9)).wgmma_dense);
  if (sms > 16) EXPECT_FALSE(w4a16_plan(64, W4A16Weights::random(4096, 4096, 128, DType::f16, 10)).wgmma_dense);
  EXPECT_FALSE(w4a16_plan(128, ww, three).wgmma_dense);  // other tiles have one build
  W4A16Options bad{W4A16Strategy::wgmma, 0};
  bad.wgmma_ctas_per_sm = 4;
  EXPECT_TRUE(test::throws_error([&] { (void)w4a16_plan(64, ww, bad); }, ErrorKind::invalid_argument,
                                 {"wgmma_ctas_per_sm"}));
}

// The order in which the wgmma grid hands out its tiles (groups of row
// tiles, W4A16Options::wgmma_group_rows) changes which CTA computes a tile,
// not how: every order gives the plain order's bits, with and without a K
// split, and the partial last row tile and column tile land where they
// belong. With leftover tiles split along K the split tiles are the last of
// the order, so there only the reference is compared.
TEST(W4A16Gemm, WgmmaTileGroupsGiveThePlainOrdersOutputs) {
  LOWBIT_REQUIRE_GPU();
  if (!w4a16_wgmma_available()) GTEST_SKIP() << "no sm_90a device/build (WgmmaRunsOnComputeCapability9 checks)";
  W4A16Workspace ws;
  uint64_t seed = 180;
  for (DType dtype : {DType::f16, DType::bf16}) {
    const ZeroKind kind = dtype == DType::f16 ? ZeroKind::asym : ZeroKind::float_min_f16;
    const auto layer = test::random_layer(1024, 950, 128, kind, seed++);  // 8 column tiles, the last one partial
    const W4A16Weights w = W4A16Weights::prepare(layer, dtype);
    const Problem p = make_problem(600, layer, dtype, seed++);  // 3 row tiles of 256, the last 88 rows
    for (int split : {1, 2}) {
      W4A16Options plain{W4A16Strategy::wgmma, split};
      plain.wgmma_group_rows = 3;
      const W4A16Plan plain_plan = w4a16_plan(p.M, w, plain);
      ASSERT_EQ(plain_plan.rows_per_pass, 256);
      ASSERT_EQ(plain_plan.split_k, split);
      ASSERT_EQ(plain_plan.stream_k_ctas, 0);
      ASSERT_EQ(plain_plan.tail_tiles, 0);
      ASSERT_EQ(plain_plan.wgmma_group_rows, 3);
      const auto y_plain = run_gpu(p, w, ws, plain);
      EXPECT_TRUE(matches_reference(p, y_plain));
      for (int group : {1, 2, 7}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " split " << split << " groups of " << group);
        W4A16Options o = plain;
        o.wgmma_group_rows = group;
        EXPECT_EQ(w4a16_plan(p.M, w, o).wgmma_group_rows, std::min(group, 3));
        EXPECT_EQ(run_gpu(p, w, ws, o), y_plain);
      }
    }
  }
  // More tiles than a wave (one 256-row CTA per SM): 3 row tiles x (SMs / 2 +
  // 3) column tiles leave tiles over for the tail split.
  const int sms = cuda_device_info(0).sm_count;
  const auto wide = test::random_layer(512, (sms / 2 + 3) * 128 - 40, 128, ZeroKind::sym, seed++);
  const W4A16Weights ww = W4A16Weights::prepare(wide, DType::f16);
  const Problem pw = make_problem(700, wide, DType::f16, seed++);
  for (int group : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "tail tiles, groups of " << group);
    W4A16Options o{W4A16Strategy::wgmma, 0};
    o.wgmma_group_rows = group;
    o.tail_split = 2;
    const W4A16Plan plan = w4a16_plan(pw.M, ww, o);
    EXPECT_GT(plan.tail_tiles, 0);
    EXPECT_TRUE(matches_reference(pw, run_gpu(pw, ww, ws, o)));
  }
  // The rule: x of 3 x 256 rows of 1024 halves fits in L2, so the plain
  // order; stream-K grids (fewer tiles than a wave) have no tile order; a
  // bad option is named.
  const W4A16Weights small = W4A16Weights::random(1024, 950, 128, DType::f16, 11);
  EXPECT_EQ(w4a16_plan(600, small, W4A16Options{W4A16Strategy::wgmma, 1}).wgmma_group_rows, 3);
  const W4A16Plan stream_k = w4a16_plan(600, small);
  if (stream_k.stream_k_ctas > 0) EXPECT_EQ(stream_k.wgmma_group_rows, 0);
  W4A16Options bad{W4A16Strategy::wgmma, 0};
  bad.wgmma_group_rows = -1;
  EXPECT_TRUE(test::throws_error([&] { (void)w4a16_plan(600, ww, bad); }, ErrorKind::invalid_argument,
                                 {"wgmma_group_rows"}));
}

TEST(W4A16Gemm, BadArgumentsAreNamed) {
  LOWBIT_REQUIRE_GPU();
  W4A16Workspace ws;
  const auto layer = test::random_layer(128, 64, 64, ZeroKind::sym, 1);
  const W4A16Weights w = W4A16Weights::prepare(layer, DType::f16);
  Buffer x(2 * 128 * 2, Device::cuda), y(2 * 64 * 2, Device::cuda);
  const auto yv = TensorView::contiguous(y.data(), DType::f16, {2, 64}, Device::cuda);
  EXPECT_TRUE(test::throws_error(
      [&] { w4a16_gemm(TensorView::contiguous(x.data(), DType::bf16, {2, 128}, Device::cuda), w, yv, ws); },
      ErrorKind::invalid_argument, {"'x'", "bf16", "f16"}));
  EXPECT_TRUE(test::throws_error(
      [&] { w4a16_gemm(TensorView::contiguous(x.data(), DType::f16, {4, 64}, Device::cuda), w, yv, ws); },
      ErrorKind::invalid_argument, {"'x'", "[4, 64]", "128"}));
  std::vector<uint16_t> host(256);
  EXPECT_TRUE(test::throws_error(
      [&] { w4a16_gemm(TensorView::contiguous(host.data(), DType::f16, {2, 128}), w, yv, ws); },
      ErrorKind::invalid_argument, {"x", "cpu"}));
  EXPECT_TRUE(test::throws_error([&] { (void)W4A16Weights::prepare(layer, DType::f32); },
                                 ErrorKind::invalid_argument, {"act_dtype"}));
}

}  // namespace
}  // namespace lowbit
