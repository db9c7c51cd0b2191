// bench_cuda_baselines [--json FILE] [--quick]
//
// The reference points every lowbit kernel is judged against, measured with
// lowbit's own timer (lowbit/cuda/timer.h): device-to-device copy bandwidth
// (the ceiling of any memory-bound kernel) and cuBLAS FP16 GEMM on the
// decode shapes. The cuBLAS times are printed beside the numbers a peer
// harness (triton.testing.do_bench) measured on the same H100, so a
// systematic error in our timer shows up as a ratio far from 1.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/bench/anchors.h"
#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/cublas_gemm.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/random.h"
#include "lowbit/cuda/timer.h"

namespace {

using lowbit::Buffer;
using lowbit::Device;
using lowbit::bench::BenchRow;
using lowbit::cuda::WeightLayout;

struct Shape {
  int64_t K, N;
  const char* label;
};

// The nine weight shapes (K x N) of the project's GEMM comparisons.
const Shape kShapes[] = {
    {4096, 4096, "4096x4096"},   {8192, 8192, "8192x8192"},
    {16384, 16384, "16384x16384"}, {5120, 7168, "qwen3-14b qkv"},
    {5120, 5120, "qwen3-14b o_proj"}, {5120, 34816, "qwen3-14b gate+up"},
    {17408, 5120, "qwen3-14b down"}, {8192, 57344, "llama-70b gate+up"},
    {28672, 8192, "llama-70b down"}};
const int64_t kBatch[] = {1, 16, 64};

// cuBLAS FP16 (torch.matmul, dense fp16 weights) in microseconds, measured by
// the peer harness on the lent H100 (NVIDIA H100 80GB HBM3, driver
// 580.159.04, torch 2.11 cu130, triton.testing.do_bench: CUDA events, L2
// flushed, median of ~100 reps), 2026-11-22. Source:
// /work/shared/anchors/README.md ("cuBLAS fp16" column), raw rows in
// h100-peers-2026-11-22.jsonl beside it. Order: kShapes x kBatch.
// The peer's weight layout is not recorded. On the same H100 (2026-11-22) our
// [K, N] rows ("cublas_kn", torch.matmul(x, W) on a [K, N] tensor) matched
// these within 1% (geometric mean of ours/peer 0.99-1.00 for each M), while
// the nn.Linear layout [N, K] ("cublas", cuBLAS "TN") ran 3-5% slower: read
// the "cublas_kn" ratios as the check of our timer.
const double kPeerCublasUs[9][3] = {
    {21.5, 23.0, 21.3},    {58.2, 58.0, 58.4},    {187.0, 185.6, 186.9},
    {38.7, 38.2, 37.8},    {29.6, 28.8, 29.1},    {128.9, 134.8, 137.9},
    {75.3, 75.7, 78.2},    {328.6, 333.2, 331.3}, {167.8, 167.6, 171.7}};
// Device-to-device copy on the same H100, bytes read + written (same source).
constexpr double kPeerCopyGBps = 3000.0;

void usage(const char* argv0) {
  std::printf("usage: %s [--json FILE] [--quick]\n"
              "  --json FILE  also write one JSON object per result to FILE (jsonl)\n"
              "  --quick      only the first two shapes\n",
              argv0);
}

// Checks sampled outputs of y = x . W (W stored as `layout` says) against an
// fp64 product on the CPU. Returns the relative error over the samples.
double verify_samples(const Buffer& x, const Buffer& w, const Buffer& y, int64_t M, int64_t N,
                      int64_t K, WeightLayout layout) {
  std::vector<lowbit::f16> xrow(static_cast<size_t>(K)), wrow(static_cast<size_t>(K));
  const int64_t ms[] = {0, M / 2, M - 1};
  const int64_t ns[] = {0, 1, N / 3, N / 2 + 7, N - 2, N - 1};
  double err2 = 0, ref2 = 0;
  for (int64_t m : ms) {
    Buffer::copy(xrow.data(), Device::cpu, x.as<lowbit::f16>() + m * K, Device::cuda,
                 static_cast<size_t>(K) * 2);
    for (int64_t n : ns) {
      if (layout == WeightLayout::nk) {  // column n of W is row n of the [N, K] matrix
        Buffer::copy(wrow.data(), Device::cpu, w.as<lowbit::f16>() + n * K, Device::cuda,
                     static_cast<size_t>(K) * 2);
      } else {  // column n of the [K, N] matrix: K elements N apart
        LOWBIT_CUDA_CHECK(cudaMemcpy2D(wrow.data(), 2, w.as<lowbit::f16>() + n, static_cast<size_t>(N) * 2,
                                       2, static_cast<size_t>(K), cudaMemcpyDeviceToHost));
      }
      lowbit::f16 got_h;
      Buffer::copy(&got_h, Device::cpu, y.as<lowbit::f16>() + m * N + n, Device::cuda, 2);
      double ref = 0;
      for (int64_t k = 0; k < K; ++k)
        ref += static_cast<double>(lowbit::f16_to_float(xrow[static_cast<size_t>(k)])) *
               lowbit::f16_to_float(wrow[static_cast<size_t>(k)]);
      const double got = lowbit::f16_to_float(got_h);
      if (!std::isfinite(got))
        lowbit::fail(lowbit::ErrorKind::internal, "cuBLAS output y[", m, ", ", n, "] of M=", M,
                     " K=", K, " N=", N, " is not finite (not written?)");
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  }
  return std::sqrt(err2 / ref2);
}

int run(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      usage(argv[0]);
      return 2;
    }
  }
  if (lowbit::cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_cuda_baselines: no CUDA device\n");
    return 2;
  }

  const lowbit::CudaDeviceInfo info = lowbit::cuda_device_info(0);
  std::printf("device 0: %s (cc %d.%d), %d SMs, SM clock %d MHz, memory %d MHz x %d bits "
              "= %.0f GB/s theoretical, %.1f GiB (%.1f free), L2 %.0f MiB, driver %s, runtime %s\n",
              info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count, info.clock_khz / 1000,
              info.memory_clock_khz / 1000, info.memory_bus_width_bits, info.peak_bandwidth_GBps,
              static_cast<double>(info.total_memory) / (1 << 30),
              static_cast<double>(info.free_memory) / (1 << 30),
              static_cast<double>(info.l2_bytes) / (1 << 20), info.driver_version.c_str(),
              info.runtime_version.c_str());
  // The peer numbers were taken on an H100: on another GPU ours/peer
  // measures the two GPUs, not whether this harness times cuBLAS as the
  // peers' did. Said once here, and in every row (peer_gpu).
  const bool peer_gpu = lowbit::bench::is_anchors_gpu(info.name);
  if (!peer_gpu)
    std::printf("note: the peer columns were measured on an H100 and this device is %s, so ours/peer below "
                "compares two GPUs (scripts/bench_torch_peers.py times the same peers here)\n",
                info.name.c_str());
  std::fflush(stdout);

  std::vector<BenchRow> rows;
  std::unique_ptr<lowbit::bench::JsonRowsWriter> writer;
  if (!json_path.empty()) writer = std::make_unique<lowbit::bench::JsonRowsWriter>(json_path);
  auto emit = [&](BenchRow row) {
    if (writer) writer->write(row);
    rows.push_back(std::move(row));
  };

  // ---- copy bandwidth ----
  {
    const size_t bytes = size_t{1} << 30;
    BenchRow row;
    row.suite = "copy_d2d";
    row.impl = "cudaMemcpyAsync";
    row.shape = {{"MiB", static_cast<int64_t>(bytes >> 20)}};
    const double gbps = lowbit::measure_copy_bandwidth_GBps(0, bytes, &row.stats);
    row.bytes = 2 * bytes;
    row.extra = {{"peer_GBps", kPeerCopyGBps}, {"ours/peer", gbps / kPeerCopyGBps}, {"peer_gpu", peer_gpu}};
    std::printf("device-to-device copy: %.0f GB/s (read + write; peer %.0f GB/s)\n", gbps,
                kPeerCopyGBps);
    std::fflush(stdout);
    emit(std::move(row));
  }

  // ---- cuBLAS FP16 GEMM ----
  cudaStream_t stream = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  lowbit::cuda::CublasHandle handle;
  // impl -> M -> (sum of log(ours/peer), count)
  std::map<std::string, std::map<int64_t, std::pair<double, int>>> log_ratio;
  const int shape_count = quick ? 2 : 9;
  const int64_t max_m = kBatch[2];
  for (int s = 0; s < shape_count; ++s) {
    const Shape& shape = kShapes[s];
    const int64_t K = shape.K, N = shape.N;
    Buffer w(static_cast<size_t>(N * K) * 2, Device::cuda, 0);  // [N, K] like nn.Linear.weight
    Buffer x(static_cast<size_t>(max_m * K) * 2, Device::cuda, 0);
    Buffer y(static_cast<size_t>(max_m * N) * 2, Device::cuda, 0);
    // Weights scaled by 1/sqrt(K) keep the outputs near 1, far from fp16 overflow.
    lowbit::cuda::fill_random_f16(w.data(), static_cast<size_t>(N * K), 1000 + static_cast<uint64_t>(s),
                                  static_cast<float>(1.0 / std::sqrt(static_cast<double>(K))), stream);
    lowbit::cuda::fill_random_f16(x.data(), static_cast<size_t>(max_m * K), 2000 + static_cast<uint64_t>(s),
                                  1.0f, stream);
    // The same random weights serve as an [N, K] matrix (nn.Linear's weight,
    // the layout lowbit compares against) and as a [K, N] one (torch.matmul
    // on a [K, N] tensor): the peer's layout is not recorded, so both are timed.
    for (const WeightLayout layout : {WeightLayout::nk, WeightLayout::kn}) {
      const bool primary = layout == WeightLayout::nk;
      for (int b = 0; b < 3; ++b) {
        const int64_t M = kBatch[b];
        // Verify first: poison y (0xFFFF is a binary16 NaN), run once, compare samples.
        LOWBIT_CUDA_CHECK(cudaMemsetAsync(y.data(), 0xFF, y.size(), stream));
        lowbit::cuda::gemm_f16_cublas(handle.get(), x.data(), w.data(), y.data(), M, N, K, stream,
                                      layout);
        LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
        const double rel = verify_samples(x, w, y, M, N, K, layout);
        if (!(rel < 2e-3))
          lowbit::fail(lowbit::ErrorKind::internal, "cuBLAS result for M=", M, " K=", K, " N=", N,
                       " differs from the fp64 reference: relative error ", rel);

        lowbit::cuda::CudaTimerOptions options;
        options.stream = stream;
        BenchRow row;
        row.suite = "gemm_f16";
        row.impl = primary ? "cublas" : "cublas_kn";
        row.shape = {{"M", M}, {"K", K}, {"N", N}};
        row.stats = lowbit::cuda::time_cuda(
            [&](cudaStream_t st) {
              lowbit::cuda::gemm_f16_cublas(handle.get(), x.data(), w.data(), y.data(), M, N, K, st,
                                            layout);
            },
            options);
        row.bytes = static_cast<uint64_t>(2 * (M * K + K * N + M * N));
        row.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
        const double peer = kPeerCublasUs[s][b];
        const double ratio = row.stats.median_us / peer;
        row.extra = {{"weight", primary ? "[N,K]" : "[K,N]"}, {"peer_us", peer}, {"peer_gpu", peer_gpu},
                     {"ours/peer", ratio}, {"rel_err", rel}, {"layer", shape.label}};
        auto& acc = log_ratio[row.impl][M];
        acc.first += std::log(ratio);
        acc.second += 1;
        std::printf("  %-9s M=%-3lld K=%-6lld N=%-6lld %9.2f us (p10 %.2f, p90 %.2f)  peer %7.1f us  "
                    "ours/peer %.3f  rel err %.1e\n",
                    row.impl.c_str(), static_cast<long long>(M), static_cast<long long>(K),
                    static_cast<long long>(N), row.stats.median_us, row.stats.p10_us,
                    row.stats.p90_us, peer, ratio, rel);
        std::fflush(stdout);
        emit(std::move(row));
      }
    }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(stream));

  // One table per suite: their shape fields differ.
  std::vector<BenchRow> copy_rows, gemm_rows;
  for (const auto& row : rows) (row.suite == "copy_d2d" ? copy_rows : gemm_rows).push_back(row);
  std::printf("\n%s\n%s\n", lowbit::bench::format_table(copy_rows).c_str(),
              lowbit::bench::format_table(gemm_rows).c_str());
  for (const auto& [impl, by_m] : log_ratio)
    for (const auto& [M, acc] : by_m)
      std::printf("%s fp16, M=%lld: geometric mean of ours/peer over %d shapes = %.3f\n",
                  impl.c_str(), static_cast<long long>(M), acc.second,
                  std::exp(acc.first / acc.second));
  if (writer) std::printf("rows written to %s\n", writer->path().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_baselines: %s\n", e.what());
    return 1;
  }
}
