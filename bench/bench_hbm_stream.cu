// bench_hbm_stream [--json FILE]
//
// How fast a grid can pull one read-only stream from HBM (the weight stream of
// a decode GEMM) through each load path the W4A16 kernels use, with the
// consumers doing no arithmetic: the ceiling those kernels are measured
// against, independent of their dequantization. Rows:
//   - bulk: a producer lane per CTA fills a ring of shared-memory stages with
//     1-D bulk copies (cp.async.bulk, the wgmma kernel's path, and the v6
//     gemv kernel's, since replaced: docs/w4a16-gemm.md); eight consumer
//     warps wait for each stage and release it. Chunks read in order
//     ("contiguous") or in that gemv kernel's order over the tiled layout
//     ("tiled": a CTA walks k-iterations of one 512-column tile, 2 KB blocks
//     of a k-iteration being contiguous), optionally with its two small
//     copies per stage (scales and x).
//   - ldg: plain 16-byte loads, several in flight per thread.
// 134 MB (the 16384 x 16384 layer at 4 bits), L2 evicted between calls by
// reading a buffer (lowbit/cuda/timer.h), median of 30.
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/async_copy.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/timer.h"

namespace {

using lowbit::Buffer;
using lowbit::Device;

constexpr size_t kStreamBytes = size_t{134} << 20;
constexpr int kTiles = 32;  // 512-column tiles of a 16384-column layer (a kernel argument)


constexpr int kSideBytes = 3072;  // the gemv kernel's per-stage extras: 2 KB of scales + 1 KB of x
constexpr size_t kSideSpan = size_t{32} << 20;  // the extras' source buffer

// Chunks [c * chunks / grid, (c + 1) * chunks / grid) per CTA; `tiled` maps
// chunk u to the tiled layout's address of (tile u / iters, k-iteration u % iters).
template <int kStages, int kChunk>
__global__ void __launch_bounds__(288) bulk_stream_kernel(const char* src, size_t chunks, int tiles, bool tiled,
                                                          bool side, const char* side_src, unsigned* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char ring[];
  __shared__ uint64_t full[kStages], empty[kStages];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const size_t begin = blockIdx.x * chunks / gridDim.x, end = (blockIdx.x + 1) * chunks / gridDim.x;
  const int n = static_cast<int>(end - begin);
  const size_t iters = chunks / tiles;
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) lowbit::cuda::mbar_init(&full[s], 1), lowbit::cuda::mbar_init(&empty[s], 8);
  __syncthreads();
  if (warp == 8) {  // producer
    if (lane != 0) return;
    for (int i = 0; i < n; ++i) {
      const int s = i % kStages;
      const size_t u = begin + i, chunk = tiled ? (u % iters) * tiles + u / iters : u;
      if (i >= kStages) lowbit::cuda::mbar_wait(&empty[s], ((i / kStages) + 1) & 1);
      lowbit::cuda::mbar_arrive_expect_tx(&full[s], kChunk + (side ? kSideBytes : 0));
      lowbit::cuda::bulk_load(ring + s * kChunk, src + chunk * kChunk, kChunk, &full[s]);
      if (side) {
        char* extra = ring + kStages * kChunk + s * kSideBytes;
        // Scales: a 2 KB row per (group of 2 k-iterations, tile); x: 1 KB per k-iteration (mostly L2 hits).
        lowbit::cuda::bulk_load(extra, side_src + ((u % iters) / 2 * tiles + u / iters) * 2048 % kSideSpan, 2048, &full[s]);
        lowbit::cuda::bulk_load(extra + 2048, side_src + (u % iters) * 1024 % (size_t{1} << 20), 1024, &full[s]);
      }
    }
    return;
  }
  uint32_t acc = 0;
  for (int i = 0; i < n; ++i) {
    const int s = i % kStages;
    lowbit::cuda::mbar_wait(&full[s], (i / kStages) & 1);
    acc ^= reinterpret_cast<const uint32_t*>(ring + s * kChunk)[tid];
    __syncwarp();
    if (lane == 0) lowbit::cuda::mbar_arrive(&empty[s]);
  }
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);  // keeps the reads
#else
  (void)src, (void)chunks, (void)tiles, (void)tiled, (void)side, (void)side_src, (void)sink;
#endif
}

template <int kInFlight>
__global__ void ldg_stream_kernel(const uint4* src, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i + (kInFlight - 1) * stride < n;
       i += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                   : "l"(src + i + u * stride));
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= v[u].x ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);
}

int run(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::printf("usage: %s [--json FILE]\n  --json FILE  also write one JSON object per result to FILE (jsonl)\n",
                  argv[0]);
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  const lowbit::CudaDeviceInfo dev = lowbit::cuda_device_info(0);
  if (dev.cc_major < 9) {
    std::printf("bulk copies need compute capability 9.0; this device is %d.%d: nothing to measure\n", dev.cc_major,
                dev.cc_minor);
    return 0;
  }
  const double copy_GBps = lowbit::measure_copy_bandwidth_GBps(0);
  std::printf("device: %s, %d SMs; copy bandwidth %.0f GB/s; stream of %zu MB\n", dev.name.c_str(), dev.sm_count,
              copy_GBps, kStreamBytes >> 20);
  Buffer src(kStreamBytes, Device::cuda), side(kSideSpan, Device::cuda), sink(4, Device::cuda);
  LOWBIT_CUDA_CHECK(cudaMemset(src.data(), 3, src.size()));
  LOWBIT_CUDA_CHECK(cudaMemset(side.data(), 1, side.size()));
  std::unique_ptr<lowbit::bench::JsonRowsWriter> json;
  if (!json_path.empty()) json = std::make_unique<lowbit::bench::JsonRowsWriter>(json_path);
  lowbit::cuda::CudaTimerOptions timer;
  timer.reps = 30;
  timer.flush_by_reading = true;
  auto report = [&](const std::string& impl, const std::function<void(cudaStream_t)>& launch) {
    lowbit::bench::BenchRow row;
    row.suite = "hbm_stream";
    row.impl = impl;
    row.shape = {{"stream_bytes", static_cast<int64_t>(kStreamBytes)}};
    row.bytes = kStreamBytes;
    row.stats = lowbit::cuda::time_cuda(launch, timer);
    row.extra = {{"copy_GBps", copy_GBps}};
    if (json) json->write(row);
    std::printf("%-52s %8.1f us  %6.0f GB/s = %5.1f%% of copy\n", impl.c_str(), row.stats.median_us, row.GBps(),
                100.0 * row.GBps() / copy_GBps);
  };
  auto bulk = [&](auto kernel, int stages, int chunk, int ctas_per_sm, bool tiled, bool with_side) {
    const int smem = stages * (chunk + kSideBytes);
    LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    char name[96];
    std::snprintf(name, sizeof name, "bulk %2d x %2d KB, %d CTA/SM, %s%s", stages, chunk / 1024, ctas_per_sm,
                  tiled ? "tiled" : "contiguous", with_side ? " + scales + x" : "");
    report(name, [&](cudaStream_t s) {
      kernel<<<dev.sm_count * ctas_per_sm, 288, smem, s>>>(static_cast<const char*>(src.data()),
                                                           kStreamBytes / chunk, kTiles, tiled, with_side,
                                                           static_cast<const char*>(side.data()),
                                                           static_cast<unsigned*>(sink.data()));
    });
  };
  bulk(bulk_stream_kernel<10, 16384>, 10, 16384, 1, false, false);
  bulk(bulk_stream_kernel<10, 16384>, 10, 16384, 1, true, false);
  bulk(bulk_stream_kernel<10, 16384>, 10, 16384, 1, true, true);
  bulk(bulk_stream_kernel<12, 4096>, 12, 4096, 3, false, false);
  bulk(bulk_stream_kernel<12, 4096>, 12, 4096, 3, true, false);
  bulk(bulk_stream_kernel<12, 4096>, 12, 4096, 3, true, true);
  auto ldg = [&](auto kernel, int in_flight, int threads, int ctas_per_sm) {
    char name[96];
    std::snprintf(name, sizeof name, "ldg %2d x 16 B in flight per thread, %d x %d threads/SM", in_flight,
                  ctas_per_sm, threads);
    report(name, [&](cudaStream_t s) {
      kernel<<<dev.sm_count * ctas_per_sm, threads, 0, s>>>(static_cast<const uint4*>(src.data()), kStreamBytes / 16,
                                                            static_cast<unsigned*>(sink.data()));
    });
  };
  ldg(ldg_stream_kernel<4>, 4, 256, 4);
  ldg(ldg_stream_kernel<8>, 8, 256, 4);
  ldg(ldg_stream_kernel<4>, 4, 1024, 2);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_hbm_stream: %s\n", e.what());
    return 1;
  }
}
