// The W4A16 GEMM benchmark (see lowbit/w4a16/w4a16_bench.h).
//
// Method: random weights and activations (never zeros), L2 flushed before
// every timed call and the median of the reps (lowbit::cuda::time_cuda),
// cuBLAS FP16 timed in the same run on the same shapes with a dense [K, N]
// fp16 weight. Bytes counted per call (the floor a memory-bound kernel can
// approach): packed weights + scale/zero pairs + x + y for W4A16; W + x + y in
// fp16 for cuBLAS.
#include "lowbit/w4a16/w4a16_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/bench/anchors.h"
#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/cublas_gemm.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/launch_switches.h"
#include "lowbit/cuda/random.h"
#include "lowbit/cuda/timer.h"
#include "lowbit/w4a16/w4a16_gemm.h"
#include "w4a16_wgmma.h"

namespace lowbit {
namespace {

// Marlin's geometric-mean speedup over cuBLAS FP16 on these nine shapes,
// measured by the peer harness on the same H100 (shared anchors README,
// 2026-11-22); only M = 1, 16, 64 were measured.
const std::map<int64_t, double> kMarlinGeomean = {{1, 2.16}, {16, 2.13}, {64, 1.47}};

}  // namespace

void run_w4a16_gemm_benchmark(const W4A16BenchOptions& options) {
  const auto all_shapes = w4a16_bench_shapes();
  std::vector<W4A16BenchShape> shapes;
  for (const W4A16BenchShape& s : all_shapes)
    if (options.shapes.empty() || std::find(options.shapes.begin(), options.shapes.end(), s.label) != options.shapes.end())
      shapes.push_back(s);
  for (const std::string& label : options.shapes)
    if (std::none_of(all_shapes.begin(), all_shapes.end(), [&](const W4A16BenchShape& s) { return label == s.label; }))
      fail_argument("shapes", label, "one of sq4096, sq8192, sq16384, qwen3-qkv, qwen3-o, qwen3-gateup, qwen3-down, "
                                     "llama70-gateup, llama70-down");
  for (int64_t M : options.ms) LOWBIT_CHECK_ARG(M >= 1, "m", M, "M >= 1");
  LOWBIT_CHECK_ARG(options.reps >= 1, "reps", options.reps, "at least 1");
  if (cuda_device_count() == 0) fail(ErrorKind::unsupported, "lowbit bench gemm needs a CUDA device; none is visible");
  const std::vector<int64_t>& ms = options.ms;

  const CudaDeviceInfo dev = cuda_device_info(0);
  const double copy_GBps = measure_copy_bandwidth_GBps(0);
  std::printf("device: %s, %d SMs; measured copy bandwidth %.0f GB/s; L2 evicted between calls by %s; the GPU "
              "idles %d ms before each row\n",
              dev.name.c_str(), dev.sm_count, copy_GBps,
              options.flush_by_reading ? "reading a buffer (clean lines)" : "writing a buffer (dirty lines)",
              options.settle_ms);
  std::unique_ptr<bench::JsonRowsWriter> json;
  if (!options.json_path.empty()) json = std::make_unique<bench::JsonRowsWriter>(options.json_path);
  cuda::announce_launch_switches(json.get());
  std::printf("W4A16 wgmma: the 16-row tile scales after the product %s (LOWBIT_WGMMA_SCALE_AFTER; each JSON "
              "row's wgmma_scale_after says whether its plan ran it)\n",
              w4a16_detail::wgmma_scale_after_applies(16, false, 7) ? "on" : "off");

  cuda::CublasHandle cublas;
  W4A16Workspace workspace;
  cuda::CudaTimerOptions timer;
  timer.reps = options.reps;
  timer.warmup = 5;
  timer.flush_by_reading = options.flush_by_reading;
  timer.settle_ms = options.settle_ms;
  std::vector<W4A16Strategy> strategies = {W4A16Strategy::automatic,     W4A16Strategy::data_parallel,
                                           W4A16Strategy::split_k_atomic, W4A16Strategy::split_k_deterministic,
                                           W4A16Strategy::stream_k,       W4A16Strategy::decoupled,
                                           W4A16Strategy::gemv};
  if (w4a16_wgmma_available(0)) strategies.push_back(W4A16Strategy::wgmma);
  if (!options.strategies.empty()) {
    std::vector<W4A16Strategy> chosen;
    for (const std::string& name : options.strategies) {
      const auto s = parse_w4a16_strategy(name);
      if (!s) fail(ErrorKind::invalid_argument, "bench gemm: unknown strategy '", name, "'");
      if (std::find(strategies.begin(), strategies.end(), *s) == strategies.end())
        fail(ErrorKind::invalid_argument, "bench gemm: strategy '", name, "' does not run on this device");
      if (std::find(chosen.begin(), chosen.end(), *s) == chosen.end()) chosen.push_back(*s);
    }
    strategies = chosen;
  }
  // impl -> M -> sum of log(speedup), count
  std::map<std::string, std::map<int64_t, std::pair<double, int>>> speedups;
  std::vector<std::string> m1_bandwidth;
  // --read-floor: the buffer a plain read kernel streams in place of the
  // weights (their size, random bits), and the counter that keeps its loads.
  constexpr int64_t kReadFloorMaxRows = 64;
  Buffer floor_source(16, Device::cuda), floor_sink(sizeof(unsigned), Device::cuda);
  LOWBIT_CUDA_CHECK(cudaMemset(floor_sink.data(), 0, sizeof(unsigned)));
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  for (size_t si = 0; si < shapes.size(); ++si) {
    const W4A16BenchShape shape = shapes[si];
    const W4A16Weights w = W4A16Weights::random(shape.K, shape.N, options.group_size, options.dtype, 1000 + si);
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
      const TensorView xv = TensorView::contiguous(x.data(), options.dtype, {M, shape.K}, Device::cuda);
      const TensorView yv = TensorView::contiguous(y.data(), options.dtype, {M, shape.N}, Device::cuda);
      // Every strategy under its own name, then the forced wgmma tiles.
      std::vector<std::pair<std::string, W4A16Options>> configs;
      // gemv serves 8 rows per weight read: past M = 16 it only re-reads the
      // weights, and timing it there would take most of the run.
      constexpr int64_t kGemvMaxBenchRows = 16;
      for (W4A16Strategy strategy : strategies)
        if (strategy != W4A16Strategy::gemv || M <= kGemvMaxBenchRows)
          configs.emplace_back(std::string("lowbit_") + w4a16_strategy_name(strategy), W4A16Options{strategy, 0});
      for (int split : options.gemv_splits)
        if (M <= kGemvMaxBenchRows)
          configs.emplace_back("lowbit_gemv_s" + std::to_string(split), W4A16Options{W4A16Strategy::gemv, split});
      const bool wgmma = w4a16_wgmma_available(0);
      for (int rows : options.wgmma_tiles) {
        if (!wgmma || rows > 2 * std::max<int64_t>(M, 8)) continue;
        W4A16Options o{W4A16Strategy::wgmma, 0};
        o.rows_per_tile = rows;
        configs.emplace_back("lowbit_wgmma_r" + std::to_string(rows), o);
      }
      for (int tail : options.wgmma_tail_splits) {
        if (!wgmma) continue;
        W4A16Options o{W4A16Strategy::wgmma, 0};
        o.tail_split = tail;
        W4A16Options probe = o;
        probe.tail_split = 2;  // a forced split has a tail wherever the grid leaves tiles over
        if (w4a16_plan(M, w, probe).tail_tiles == 0) continue;
        configs.emplace_back("lowbit_wgmma_t" + std::to_string(tail), o);
      }
      for (int ctas : options.wgmma_stream_k_ctas) {
        if (!wgmma) continue;
        W4A16Options o{W4A16Strategy::wgmma, 0};
        o.stream_k_ctas = ctas;
        W4A16Options probe = o;
        probe.stream_k_ctas = 2;  // forced stream-K applies wherever the tiles have 64 rows or more
        if (w4a16_plan(M, w, probe).stream_k_ctas == 0) continue;
        configs.emplace_back("lowbit_wgmma_sk" + std::to_string(ctas), o);
      }
      for (int ctas : options.wgmma_ctas_per_sm) {
        if (!wgmma) continue;
        W4A16Options o{W4A16Strategy::wgmma, 0};
        o.wgmma_ctas_per_sm = ctas;
        if (w4a16_plan(M, w, o).rows_per_pass != w4a16_detail::kWgmmaDenseRows) continue;
        configs.emplace_back("lowbit_wgmma_c" + std::to_string(ctas), o);
      }
      for (int group : options.wgmma_group_rows) {
        if (!wgmma) continue;
        W4A16Options o{W4A16Strategy::wgmma, 0};
        o.wgmma_group_rows = group;
        if (w4a16_plan(M, w, o).wgmma_group_rows == 0) continue;
        configs.emplace_back("lowbit_wgmma_g" + std::to_string(group), o);
      }
      for (int v : options.row_remainders) {
        if (M <= 256 || M % 256 == 0) continue;
        W4A16Options o{W4A16Strategy::automatic, 0};
        o.row_remainder = v;
        configs.emplace_back("lowbit_auto_rr" + std::to_string(v), o);
      }
      for (int v : options.shared_fixups) {
        W4A16Options o{W4A16Strategy::automatic, 0};
        o.shared_fixup = v;
        // Only where the option changes auto's plan: the fix-up, or (v = 1 on
        // 64- and 128-row tiles) the short-K stream-K that a split without
        // the shared fix-up keeps.
        const W4A16Plan p = w4a16_plan(M, w, o), chosen = w4a16_plan(M, w);
        if (p.strategy != W4A16Strategy::wgmma ||
            (p.shared_fixup == chosen.shared_fixup && p.stream_k_ctas == chosen.stream_k_ctas))
          continue;
        configs.emplace_back("lowbit_auto_sf" + std::to_string(v), o);
      }
      if (options.read_floor && M <= kReadFloorMaxRows) {
        // What reading the W4 weights and scales alone takes under the same
        // timer and flush: a grid-stride kernel of 16-byte loads, no math,
        // no output. No W4A16 kernel can read its weights faster than a
        // plain read does, so this row's speedup over cuBLAS is (about) the
        // ceiling of any W4A16 kernel at this point.
        const size_t floor_bytes = (w.weight_bytes() + 15) / 16 * 16;
        if (floor_source.size() < floor_bytes) {
          floor_source = Buffer(floor_bytes, Device::cuda);
          cuda::fill_random_bytes(floor_source.data(), floor_bytes, 4000 + si);
        }
        bench::BenchRow row = base;
        row.impl = "read_floor";
        row.bytes = floor_bytes;
        row.stats = cuda::time_cuda(
            [&](cudaStream_t s) {
              cuda::read_device_buffer(floor_source.data(), floor_bytes, static_cast<unsigned*>(floor_sink.data()), s,
                                        /*l2_streaming=*/true);
            },
            timer);
        const double speedup = cublas_us / row.stats.median_us;
        row.extra = {{"cublas_us", cublas_us}, {"speedup_vs_cublas", speedup}};
        if (json) json->write(row);
        auto& acc = speedups[row.impl][M];
        acc.first += std::log(speedup);
        acc.second += 1;
        std::printf("%-15s M=%-5lld %-30s %9.1f us  %6.0f GB/s  %5.2fx cuBLAS  (reads the W4 bytes only)\n",
                    shape.label, static_cast<long long>(M), row.impl.c_str(), row.stats.median_us, row.GBps(), speedup);
      }
      for (const auto& [impl, config] : configs) {
        const W4A16Options options = config;
        const W4A16Plan plan = w4a16_plan(M, w, options);
        bench::BenchRow row = base;
        row.impl = impl;
        row.bytes = w.weight_bytes() + io_bytes;
        row.stats = cuda::time_cuda([&](cudaStream_t s) { w4a16_gemm(xv, w, yv, workspace, options, s); }, timer);
        const double speedup = cublas_us / row.stats.median_us;
        row.extra = {{"plan", w4a16_strategy_name(plan.strategy)}, {"split_k", plan.split_k},
                     {"rows_per_pass", plan.rows_per_pass}, {"tail_tiles", plan.tail_tiles},
                     {"tail_split", plan.tail_split}, {"stream_k_ctas", plan.stream_k_ctas},
                     {"wgmma_dense", plan.wgmma_dense}, {"wgmma_group_rows", plan.wgmma_group_rows},
                     {"remainder_rows", plan.remainder_rows}, {"shared_fixup", plan.shared_fixup},
                     {"wgmma_scale_after",
                      plan.strategy == W4A16Strategy::wgmma &&
                          w4a16_detail::wgmma_scale_after_applies(plan.rows_per_pass, w.float_zero(),
                                                                  w4a16_detail::group_shift_of(w.group_size()))},
                     {"cublas_us", cublas_us},
                     {"speedup_vs_cublas", speedup}};
        if (json) json->write(row);
        auto& acc = speedups[row.impl][M];
        acc.first += std::log(speedup);
        acc.second += 1;
        const std::string group =
            plan.wgmma_group_rows > 0 && plan.wgmma_group_rows < (M + plan.rows_per_pass - 1) / plan.rows_per_pass
                ? ", groups of " + std::to_string(plan.wgmma_group_rows) + " row tiles"
                : "";
        const std::string remainder =
            plan.remainder_rows > 0 ? ", then " + std::to_string(plan.remainder_rows) + " rows apart" : "";
        std::printf("%-15s M=%-5lld %-30s %9.1f us  %6.0f GB/s  %5.2fx cuBLAS  (%s, split %d, rows %d, tail %lld x %d, "
                    "stream-K %lld%s%s%s%s)\n",
                    shape.label, static_cast<long long>(M), row.impl.c_str(), row.stats.median_us, row.GBps(), speedup,
                    w4a16_strategy_name(plan.strategy), plan.split_k, plan.rows_per_pass,
                    static_cast<long long>(plan.tail_tiles), plan.tail_split,
                    static_cast<long long>(plan.stream_k_ctas), plan.wgmma_dense ? ", 3 CTAs/SM" : "", group.c_str(),
                    remainder.c_str(), plan.shared_fixup ? ", shared fix-up" : "");
        if (M == 1 && options.strategy == W4A16Strategy::automatic) {
          char line[200];
          std::snprintf(line, sizeof line, "  %-15s %8.1f us  %6.0f GB/s = %4.1f%% of copy", shape.label,
                        row.stats.median_us, row.GBps(), 100.0 * row.GBps() / copy_GBps);
          m1_bandwidth.push_back(line);
        }
      }
    }
  }

  std::printf("\n==== W4A16 GEMM: geometric mean speedup over cuBLAS FP16 (same run), %zu shapes, group %d, %s ====\n",
              shapes.size(), options.group_size, dtype_name(options.dtype));
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
  // Marlin's ratios were taken on an H100; on another GPU both Marlin and
  // cuBLAS move, so the row is then a reference, not a same-GPU comparison.
  const bool anchors_gpu = bench::is_anchors_gpu(dev.name);
  std::printf("%-36s", anchors_gpu ? "marlin (anchors, same GPU: H100)" : "marlin (anchors, on an H100)");
  for (int64_t M : ms) {
    const auto it = kMarlinGeomean.find(M);
    if (it == kMarlinGeomean.end()) std::printf("%8s", "-");
    else std::printf("%8.2f", it->second);
  }
  std::printf("\nM = 1 bandwidth of auto on weights + scales + x + y (copy ceiling %.0f GB/s):\n", copy_GBps);
  for (const auto& line : m1_bandwidth) std::printf("%s\n", line.c_str());
}

}  // namespace lowbit
