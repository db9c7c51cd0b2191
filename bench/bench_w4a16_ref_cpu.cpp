// Google Benchmark of the CPU reference W4A16 GEMM (lowbit/w4a16/w4a16_gemm_ref.h)
// at K = N = 4096, group size 128, integer zeros, f16 activations, f32 output.
// bytes_per_second counts the packed weight bytes a W4A16 kernel reads per call
// (4-bit codes + f16 scales + 4-bit zeros), as Marlin's benchmark does.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "lowbit/core/half.h"
#include "lowbit/core/tensor.h"
#include "lowbit/formats/quantized_linear.h"
#include "lowbit/w4a16/w4a16_gemm_ref.h"

namespace {

using lowbit::formats::QuantizedLinear;
using lowbit::formats::ZeroPoint;

QuantizedLinear random_layer(int64_t K, int64_t N, int group_size) {
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  QuantizedLinear w = QuantizedLinear::allocate(K, N, group_size, ZeroPoint::integer);
  for (auto& c : w.codes) c = static_cast<uint8_t>(code(rng));
  for (auto& z : w.zeros) z = static_cast<uint8_t>(code(rng));
  for (auto& s : w.scales) s = lowbit::float_to_f16(scale(rng));
  return w;
}

void BM_W4a16GemmRef(benchmark::State& state) {
  const int64_t M = state.range(0), K = 4096, N = 4096;
  const int group_size = 128;
  const QuantizedLinear w = random_layer(K, N, group_size);
  std::vector<lowbit::f16> x(static_cast<size_t>(M * K));
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = lowbit::float_to_f16(normal(rng));
  std::vector<float> y(static_cast<size_t>(M * N));
  const auto xv = lowbit::TensorView::contiguous(x.data(), lowbit::DType::f16, {M, K});
  const auto yv = lowbit::TensorView::contiguous(y.data(), lowbit::DType::f32, {M, N});
  for (auto _ : state) {
    lowbit::w4a16_gemm_ref(xv, w, yv);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const int64_t G = K / group_size;
  const int64_t weight_bytes = K * N / 2 + G * N * 2 + G * N / 2;
  state.SetBytesProcessed(state.iterations() * weight_bytes);
  state.counters["flops"] = benchmark::Counter(static_cast<double>(2 * M * K * N),
                                               benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::OneK::kIs1000);
}

BENCHMARK(BM_W4a16GemmRef)->Arg(1)->Arg(16)->ArgName("M")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
