// bench_w4a16_gemm [--json FILE] [--quick] [--m 1,16,64] [--shapes sq4096,llama70-down] [--reps N]
//
// Every W4A16 strategy and `auto` beside cuBLAS FP16 on the same problem, in
// one run: the nine layer shapes of the peer anchors (K x N), M in
// {1, 16, 32, 64, 128, 256, 1024}, fp16 activations, group size 128, random
// weights and activations (never zeros), L2 flushed before every timed call
// (lowbit::cuda::time_cuda), median of the reps.
//
// Bytes counted per call (the floor a memory-bound kernel can approach):
// packed weights + scale/zero pairs + x + y for W4A16; W + x + y in fp16 for
// cuBLAS. The summary gives, per M, the geometric mean over the shapes of the
// speedup over cuBLAS FP16 measured in this run, Marlin's from the anchors
// (measured by the peer harness on the same H100, same method) beside it, and
// at M = 1 the achieved bandwidth against the measured copy bandwidth.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/cublas_gemm.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/random.h"
#include "lowbit/cuda/timer.h"
#include "lowbit/w4a16/w4a16_gemm.h"

using namespace lowbit;

namespace {

struct Shape {
  const char* label;
  int64_t K, N;
};
constexpr Shape kShapes[] = {{"sq4096", 4096, 4096},      {"sq8192", 8192, 8192},       {"sq16384", 16384, 16384},
                             {"qwen3-qkv", 5120, 7168},   {"qwen3-o", 5120, 5120},      {"qwen3-gateup", 5120, 34816},
                             {"qwen3-down", 17408, 5120}, {"llama70-gateup", 8192, 57344}, {"llama70-down", 28672, 8192}};
// Marlin's geometric-mean speedup over cuBLAS FP16 on these nine shapes,
// measured by the peer harness on the same H100 (shared anchors README,
// 2026-11-22); only M = 1, 16, 64 were measured.
const std::map<int64_t, double> kMarlinGeomean = {{1, 2.16}, {16, 2.13}, {64, 1.47}};

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    if (end == p) fail(ErrorKind::invalid_argument, "--m: cannot parse '", s, "': expected numbers like 1,16,64");
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string json_path, shape_filter;
  bool quick = false;
  int reps = 50;
  std::vector<int64_t> ms = {1, 16, 32, 64, 128, 256, 1024};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--m") && i + 1 < argc) ms = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) shape_filter = std::string(",") + argv[++i] + ",";
    else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--quick] [--m 1,16,64] [--shapes LABEL,...] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_w4a16_gemm: no CUDA device\n");
    return 1;
  }
  if (quick) ms = {1, 16, 64};
  const CudaDeviceInfo dev = cuda_device_info(0);
  const double copy_GBps = measure_copy_bandwidth_GBps(0);
  std::printf("device: %s, %d SMs; measured copy bandwidth %.0f GB/s\n", dev.name.c_str(), dev.sm_count, copy_GBps);
  std::unique_ptr<bench::JsonRowsWriter> json;
  if (!json_path.empty()) json = std::make_unique<bench::JsonRowsWriter>(json_path);

  cuda::CublasHandle cublas;
  W4A16Workspace workspace;
  cuda::CudaTimerOptions timer;
  timer.reps = reps;
  timer.warmup = 5;
  const W4A16Strategy strategies[] = {W4A16Strategy::automatic, W4A16Strategy::data_parallel,
                                      W4A16Strategy::split_k_atomic, W4A16Strategy::split_k_deterministic,
                                      W4A16Strategy::stream_k,
                                      W4A16Strategy::decoupled};
  // impl -> M -> sum of log(speedup), count
  std::map<std::string, std::map<int64_t, std::pair<double, int>>> speedups;
  std::vector<std::string> m1_bandwidth;
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const size_t n_shapes = quick ? 2 : std::size(kShapes);
  for (size_t si = 0; si < n_shapes; ++si) {
    const Shape shape = kShapes[si];
    if (!shape_filter.empty() && shape_filter.find(std::string(",") + shape.label + ",") == std::string::npos) continue;
    const W4A16Weights w = W4A16Weights::random(shape.K, shape.N, 128, DType::f16, 1000 + si);
    Buffer wf16(static_cast<size_t>(shape.K * shape.N) * 2, Device::cuda);
    cuda::fill_random_f16(wf16.data(), static_cast<size_t>(shape.K * shape.N), 2000 + si, 0.02f);
    Buffer x(static_cast<size_t>(max_m * shape.K) * 2, Device::cuda), y(static_cast<size_t>(max_m * shape.N) * 2,
                                                                        Device::cuda);
    cuda::fill_random_f16(x.data(), static_cast<size_t>(max_m * shape.K), 3000 + si, 1.0f);
    for (int64_t M : ms) {
      const uint64_t io_bytes = static_cast<uint64_t>(M * shape.K + M * shape.N) * 2;
      bench::BenchRow base;
      base.suite = "gemm_w4a16";
      base.impl = "cublas_fp16";
      base.shape = {{"layer", shape.label}, {"M", M}, {"K", shape.K}, {"N", shape.N}};
      base.bytes = static_cast<uint64_t>(shape.K * shape.N) * 2 + io_bytes;
      base.flops = 2.0 * static_cast<double>(M * shape.K * shape.N);
      base.stats = cuda::time_cuda(
          [&](cudaStream_t s) {
            cuda::gemm_f16_cublas(cublas.get(), x.data(), wf16.data(), y.data(), M, shape.N, shape.K, s,
                                  cuda::WeightLayout::kn);
          },
          timer);
      const double cublas_us = base.stats.median_us;
      if (json) json->write(base);
      std::printf("%-15s M=%-5lld cublas_fp16 %9.1f us\n", shape.label, static_cast<long long>(M), cublas_us);
      const TensorView xv = TensorView::contiguous(x.data(), DType::f16, {M, shape.K}, Device::cuda);
      const TensorView yv = TensorView::contiguous(y.data(), DType::f16, {M, shape.N}, Device::cuda);
      for (W4A16Strategy strategy : strategies) {
        const W4A16Options options{strategy, 0};
        const W4A16Plan plan = w4a16_plan(M, w, options);
        bench::BenchRow row = base;
        row.impl = std::string("lowbit_") + w4a16_strategy_name(strategy);
        row.bytes = w.weight_bytes() + io_bytes;
        row.stats = cuda::time_cuda([&](cudaStream_t s) { w4a16_gemm(xv, w, yv, workspace, options, s); }, timer);
        const double speedup = cublas_us / row.stats.median_us;
        row.extra = {{"plan", w4a16_strategy_name(plan.strategy)}, {"split_k", plan.split_k},
                     {"cublas_us", cublas_us}, {"speedup_vs_cublas", speedup}};
        if (json) json->write(row);
        auto& acc = speedups[row.impl][M];
        acc.first += std::log(speedup);
        acc.second += 1;
        std::printf("%-15s M=%-5lld %-30s %9.1f us  %6.0f GB/s  %5.2fx cuBLAS  (%s, split %d)\n", shape.label,
                    static_cast<long long>(M), row.impl.c_str(), row.stats.median_us, row.GBps(), speedup,
                    w4a16_strategy_name(plan.strategy), plan.split_k);
        if (M == 1 && strategy == W4A16Strategy::automatic) {
          char line[200];
          std::snprintf(line, sizeof line, "  %-15s %8.1f us  %6.0f GB/s = %4.1f%% of copy", shape.label,
                        row.stats.median_us, row.GBps(), 100.0 * row.GBps() / copy_GBps);
          m1_bandwidth.push_back(line);
        }
      }
    }
  }

  std::printf("\n==== W4A16 GEMM: geometric mean speedup over cuBLAS FP16 (same run), %zu shapes, group 128 ====\n",
              n_shapes);
  std::printf("%-36s", "impl \\ M");
  for (int64_t M : ms) std::printf("%8lld", static_cast<long long>(M));
  std::printf("\n");
  for (const auto& [impl, by_m] : speedups) {
    std::printf("%-36s", impl.c_str());
    for (int64_t M : ms) {
      const auto it = by_m.find(M);
      std::printf("%8.2f", it == by_m.end() ? 0.0 : std::exp(it->second.first / it->second.second));
    }
    std::printf("\n");
  }
  std::printf("%-36s", "marlin (anchors, same H100)");
  for (int64_t M : ms) {
    const auto it = kMarlinGeomean.find(M);
    if (it == kMarlinGeomean.end()) std::printf("%8s", "-");
    else std::printf("%8.2f", it->second);
  }
  std::printf("\nM = 1 bandwidth of auto on weights + scales + x + y (copy ceiling %.0f GB/s):\n", copy_GBps);
  for (const auto& line : m1_bandwidth) std::printf("%s\n", line.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_w4a16_gemm: %s\n", e.what());
  return 1;
}
