#include "lowbit/cuda/timer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/pdl.cuh"

namespace lowbit::cuda {
namespace {

// Owns the start/stop events of every rep; destroys them on any exit.
class EventPairs {
 public:
  explicit EventPairs(int count) : start_(static_cast<size_t>(count), nullptr), stop_(start_) {
    for (int i = 0; i < count; ++i) {
      LOWBIT_CUDA_CHECK(cudaEventCreate(&start_[static_cast<size_t>(i)]));
      LOWBIT_CUDA_CHECK(cudaEventCreate(&stop_[static_cast<size_t>(i)]));
    }
  }
  ~EventPairs() {
    for (cudaEvent_t e : start_) if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : stop_) if (e) cudaEventDestroy(e);
  }
  EventPairs(const EventPairs&) = delete;
  EventPairs& operator=(const EventPairs&) = delete;
  cudaEvent_t start(int i) const { return start_[static_cast<size_t>(i)]; }
  cudaEvent_t stop(int i) const { return stop_[static_cast<size_t>(i)]; }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

// Reads every 16 bytes of the buffer once; the xor keeps the loads alive.
// Each thread issues kReadsInFlight independent loads before it consumes
// any: with one load per thread and trip (the first version), 1024 x 256
// threads kept ~32 KB per SM in flight, and the `--read-floor` rows it timed
// read a 142 MB matrix at 3.1 TB/s where cuBLAS reads 537 MB at 4.0 TB/s
// (docs/results/h200-check-v43.txt): a floor that slow is no ceiling.
constexpr int kReadsInFlight = 4;
__global__ void read_buffer_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i + (kReadsInFlight - 1) * stride < n; i += kReadsInFlight * stride) {
    uint4 v[kReadsInFlight];
#pragma unroll
    for (int u = 0; u < kReadsInFlight; ++u) v[u] = p[i + u * stride];
#pragma unroll
    for (int u = 0; u < kReadsInFlight; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);
}

}  // namespace

void read_device_buffer(const void* data, size_t bytes, unsigned* sink, cudaStream_t stream, bool l2_streaming) {
  // The kernel reads whole 16-byte vectors: a size or address off that grid
  // would skip the tail or fault, so it is refused before anything launches.
  LOWBIT_CHECK_ARG(bytes % 16 == 0, "bytes", bytes, "a multiple of 16");
  LOWBIT_CHECK_ARG(reinterpret_cast<uintptr_t>(data) % 16 == 0, "data", data, "a 16-byte aligned device pointer");
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1024);
  config.blockDim = dim3(256);
  config.stream = stream;
  cudaLaunchAttribute window{};
  if (l2_streaming_attribute({data, l2_streaming ? bytes : 0}, window)) {
    config.attrs = &window;
    config.numAttrs = 1;
  }
  LOWBIT_CUDA_CHECK(
      cudaLaunchKernelEx(&config, read_buffer_kernel, static_cast<const uint4*>(data), bytes / 16, sink));
  LOWBIT_CUDA_CHECK_LAUNCH();
}

size_t l2_flush_bytes() {
  int device = 0, l2 = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  // Twice L2 so that nothing the timed call could reuse survives (the L2 is
  // not a perfect LRU); at least 256 MB, the size triton.testing.do_bench
  // clears, so that our numbers and the peers' see the same cache state.
  return std::max<size_t>(2 * static_cast<size_t>(l2), size_t{256} << 20);
}

bench::TimingStats time_cuda(const std::function<void(cudaStream_t)>& launch,
                             const CudaTimerOptions& options) {
  LOWBIT_CHECK_ARG(options.warmup >= 0, "warmup", options.warmup, "a count >= 0");
  LOWBIT_CHECK_ARG(options.reps >= 1, "reps", options.reps, "a count >= 1");
  LOWBIT_CHECK_ARG(options.settle_ms >= 0, "settle_ms", options.settle_ms, "milliseconds >= 0");
  LOWBIT_CHECK_ARG(static_cast<bool>(launch), "launch", "an empty function", "a callable");
  const cudaStream_t stream = options.stream;
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));

  // Cold L2 before every timed call: in decoding, each layer's weights are
  // read once per token from HBM, long after the previous read has left the
  // cache. Without the flush, a matrix that fits in L2 (50 MB on H100) would
  // be timed at cache bandwidth and look several times faster than it is.
  Buffer flush;
  Buffer sink;
  if (options.flush_l2) {
    flush = Buffer(l2_flush_bytes(), Device::cuda, device);
    sink = Buffer(sizeof(unsigned), Device::cuda, device);
    if (options.flush_by_reading) LOWBIT_CUDA_CHECK(cudaMemset(flush.data(), 0, flush.size()));
  }

  if (options.settle_ms > 0) {
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    std::this_thread::sleep_for(std::chrono::milliseconds(options.settle_ms));
  }

  // Warm-up: first calls pay for module loading, library handle set-up and
  // heuristics, and the clocks ramping up from idle. Errors surface here.
  for (int i = 0; i < options.warmup; ++i) {
    launch(stream);
    LOWBIT_CUDA_CHECK_LAUNCH();
  }
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));

  // Device events, not host clocks: launches are asynchronous, so a host
  // clock would measure enqueueing (or, with a synchronisation per call, add
  // the launch latency and the host round trip). Events bracket exactly the
  // work on the stream. All reps are enqueued before one synchronisation so
  // the GPU never idles waiting for the host between reps; the flush is
  // enqueued before each start event, outside the timed region.
  EventPairs events(options.reps);
  for (int i = 0; i < options.reps; ++i) {
    if (options.flush_l2 && options.flush_by_reading) {
      read_device_buffer(flush.data(), flush.size(), static_cast<unsigned*>(sink.data()), stream);
    } else if (options.flush_l2) {
      LOWBIT_CUDA_CHECK(cudaMemsetAsync(flush.data(), i & 0xFF, flush.size(), stream));
    }
    LOWBIT_CUDA_CHECK(cudaEventRecord(events.start(i), stream));
    launch(stream);
    LOWBIT_CUDA_CHECK_LAUNCH();
    LOWBIT_CUDA_CHECK(cudaEventRecord(events.stop(i), stream));
  }
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<double> samples_us(static_cast<size_t>(options.reps));
  for (int i = 0; i < options.reps; ++i) {
    float ms = 0;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start(i), events.stop(i)));
    samples_us[static_cast<size_t>(i)] = static_cast<double>(ms) * 1e3;
  }
  // The median, not the mean: one rep delayed by a clock change, another
  // process or the host is an outlier that would drag a mean but not the
  // median; the spread is kept as p10/p90 (and min/max).
  return bench::summarize_us(std::move(samples_us));
}

}  // namespace lowbit::cuda
