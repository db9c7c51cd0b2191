// The GPU plumbing every kernel and benchmark builds on: device queries,
// device buffers, checked calls, the timer, random data and the cuBLAS
// baseline. Each test skips without a GPU (fails with LOWBIT_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/cublas_check.h"
#include "lowbit/cuda/cublas_gemm.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/device_attribute.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/launch_switches.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/cuda/random.h"
#include "lowbit/cuda/timer.h"

namespace lowbit {
namespace {

__global__ void noop_kernel(int* out) {
  if (out != nullptr && threadIdx.x == 0) *out = 1;
}

// Spins one thread for `cycles` SM clock cycles.
__global__ void spin_kernel(long long cycles, long long* elapsed) {
  const long long start = clock64();
  long long now = start;
  while (now - start < cycles) now = clock64();
  if (threadIdx.x == 0 && blockIdx.x == 0) *elapsed = now - start;
}

// Captures the ErrorKind and message of what `body` throws.
template <typename Body>
Error expect_lowbit_error(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-lowbit exception: " << e.what();
    return Error(ErrorKind::internal, "wrong exception");
  }
  ADD_FAILURE() << "did not throw";
  return Error(ErrorKind::internal, "no exception");
}

// A block of more than 1024 threads is refused at the launch. CUDA 13 on an
// H100 reports cudaErrorInvalidValue; older runtimes said
// cudaErrorInvalidConfiguration. Either way the check names cudaGetLastError.
bool is_launch_configuration_error(const std::string& what) {
  return what.find("cudaGetLastError") != std::string::npos &&
         (what.find("cudaErrorInvalidConfiguration") != std::string::npos ||
          what.find("cudaErrorInvalidValue") != std::string::npos);
}

TEST(CudaDevice, InfoIsSane) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(cuda_built());
  ASSERT_GT(cuda_device_count(), 0);
  const CudaDeviceInfo info = cuda_device_info(0);
  EXPECT_EQ(info.index, 0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.total_memory, 0u);
  EXPECT_GT(info.free_memory, 0u);
  EXPECT_LE(info.free_memory, info.total_memory);
  EXPECT_GE(info.cc_major, 7);
  EXPECT_GT(info.l2_bytes, 0u);
  EXPECT_GT(info.smem_per_block_optin, 0u);
  EXPECT_GT(info.clock_khz, 0);
  EXPECT_GE(info.peak_bandwidth_GBps, 0.0);
  EXPECT_FALSE(info.driver_version.empty());
  EXPECT_FALSE(info.runtime_version.empty());
  std::printf("device 0: %s, cc %d.%d, %d SMs, %.1f GiB, L2 %.1f MiB, SM clock %d MHz, "
              "memory %d MHz x %d bits = %.0f GB/s peak, driver %s, runtime %s\n",
              info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count,
              static_cast<double>(info.total_memory) / (1 << 30),
              static_cast<double>(info.l2_bytes) / (1 << 20), info.clock_khz / 1000,
              info.memory_clock_khz / 1000, info.memory_bus_width_bits, info.peak_bandwidth_GBps,
              info.driver_version.c_str(), info.runtime_version.c_str());
}

TEST(CudaDevice, BadIndexIsInvalidArgument) {
  LOWBIT_REQUIRE_GPU();
  const Error e = expect_lowbit_error([] { cuda_device_info(cuda_device_count()); });
  EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
}

TEST(CudaBuffer, HostDeviceHostRoundTrip) {
  LOWBIT_REQUIRE_GPU();
  const size_t bytes = (size_t{1} << 20) + 13;  // not a multiple of anything convenient
  std::mt19937_64 rng(42);
  Buffer src(bytes), back(bytes);
  for (size_t i = 0; i < bytes; ++i) src.as<uint8_t>()[i] = static_cast<uint8_t>(rng());
  std::memset(back.data(), 0xCD, bytes);  // poison the destination

  Buffer dev(bytes, Device::cuda, 0);
  EXPECT_EQ(dev.device(), Device::cuda);
  EXPECT_EQ(dev.size(), bytes);
  LOWBIT_CUDA_CHECK(cudaMemset(dev.data(), 0xEE, bytes));
  Buffer::copy(dev.data(), Device::cuda, src.data(), Device::cpu, bytes);
  Buffer dev2(bytes, Device::cuda, 0);
  Buffer::copy(dev2.data(), Device::cuda, dev.data(), Device::cuda, bytes);
  Buffer::copy(back.data(), Device::cpu, dev2.data(), Device::cuda, bytes);
  EXPECT_EQ(std::memcmp(src.data(), back.data(), bytes), 0);

  Buffer moved = std::move(dev);
  EXPECT_EQ(dev.data(), nullptr);
  EXPECT_EQ(moved.size(), bytes);
}

TEST(CudaCheck, FailingCallThrowsCudaError) {
  LOWBIT_REQUIRE_GPU();
  void* p = nullptr;
  const Error e = expect_lowbit_error([&] { LOWBIT_CUDA_CHECK(cudaMalloc(&p, size_t{1} << 50)); });
  EXPECT_EQ(e.kind(), ErrorKind::cuda);
  EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("cudaErrorMemoryAllocation"), std::string::npos) << e.what();
  EXPECT_EQ(p, nullptr);
  cudaGetLastError();  // allocation failures are not sticky; clear the record
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());  // the context is still usable
}

TEST(CudaCheck, BadLaunchIsCaughtAtTheLaunch) {
  LOWBIT_REQUIRE_GPU();
  const Error e = expect_lowbit_error([] {
    noop_kernel<<<1, 1025>>>(nullptr);  // more threads per block than any GPU allows
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
  EXPECT_EQ(e.kind(), ErrorKind::cuda);
  EXPECT_TRUE(is_launch_configuration_error(e.what())) << e.what();
  EXPECT_NE(std::string(e.what()).find("test_cuda_plumbing.cu"), std::string::npos) << e.what();
  // A good launch afterwards works: configuration errors are not sticky.
  noop_kernel<<<1, 32>>>(nullptr);
  LOWBIT_CUDA_CHECK_LAUNCH();
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
}

// Only the test below launches this kernel, so its shared memory limit on
// each device is what the test set there.
__global__ void dynamic_smem_kernel(int bytes, int* out) {
  extern __shared__ unsigned char dynamic_smem[];
  if (threadIdx.x == 0) {
    dynamic_smem[bytes - 1] = 7;
    *out = dynamic_smem[bytes - 1];
  }
}

int max_dynamic_smem_now(const void* kernel) {
  cudaFuncAttributes attributes{};
  LOWBIT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return attributes.maxDynamicSharedSizeBytes;
}

// The opt-in is per (device, kernel): a launch on a second GPU of a kernel
// configured only on the first fails, which is what a per-kernel `static bool
// configured` did. On a one-GPU machine the per-device half has nothing to
// switch to and says so.
TEST(CudaKernelSmem, OptInIsPerDeviceAndNeverLowered) {
  LOWBIT_REQUIRE_GPU();
  const auto kernel = reinterpret_cast<const void*>(dynamic_smem_kernel);
  constexpr int kBig = 100 * 1024, kSmaller = 64 * 1024;
  static bool first_run = true;  // --gtest_repeat finds the limits of the first run
  for (int device = 0; device < cuda_device_count(); ++device) {
    SCOPED_TRACE("device " + std::to_string(device));
    cuda::DeviceGuard guard(device);
    if (first_run) EXPECT_LT(max_dynamic_smem_now(kernel), kBig) << "nothing configured on this device yet";
    cuda::ensure_dynamic_smem(dynamic_smem_kernel, kBig);
    EXPECT_EQ(max_dynamic_smem_now(kernel), kBig);
    cuda::ensure_dynamic_smem(dynamic_smem_kernel, kSmaller);  // a smaller request leaves it
    EXPECT_EQ(max_dynamic_smem_now(kernel), kBig);
    Buffer out(sizeof(int), Device::cuda, device);
    LOWBIT_CUDA_CHECK(cudaMemset(out.data(), 0, sizeof(int)));
    dynamic_smem_kernel<<<1, 32, kBig>>>(kBig, out.as<int>());
    LOWBIT_CUDA_CHECK_LAUNCH();
    int got = 0;
    LOWBIT_CUDA_CHECK(cudaMemcpy(&got, out.data(), sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, 7);
    const CudaDeviceInfo info = cuda_device_info(device);
    const Error e = expect_lowbit_error(
        [&] { cuda::ensure_dynamic_smem(dynamic_smem_kernel, static_cast<int>(info.smem_per_block_optin) + 1024); });
    EXPECT_EQ(e.kind(), ErrorKind::cuda);
    EXPECT_EQ(max_dynamic_smem_now(kernel), kBig);
    cudaGetLastError();
  }
  if (cuda_device_count() < 2)
    std::printf("[ note     ] one CUDA device: the per-device opt-in was checked on device 0 only\n");
  first_run = false;
}

// The planners' cached attributes: the runtime's values for every device,
// from host threads asking for devices and attributes in different orders
// (two statics holding "the last device and its value" gave one device's
// value for another here), and Error(cuda) for a device that does not exist.
TEST(CudaDeviceAttribute, CachedValuesAreTheRuntimesFromManyThreads) {
  LOWBIT_REQUIRE_GPU();
  const cudaDeviceAttr attrs[] = {cudaDevAttrMultiProcessorCount, cudaDevAttrL2CacheSize,
                                  cudaDevAttrComputeCapabilityMajor, cudaDevAttrClusterLaunch};
  const int devices = cuda_device_count();
  std::vector<int> want;
  for (int d = 0; d < devices; ++d)
    for (const cudaDeviceAttr attr : attrs) {
      int v = 0;
      LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, d));
      want.push_back(v);
    }
  constexpr int kThreads = 8, kRounds = 200;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const int k = (i * 7 + t * 3) % static_cast<int>(want.size());  // a different order per thread
        const int d = k / 4;
        if (cuda::device_attribute(attrs[k % 4], d) != want[static_cast<size_t>(k)]) ++wrong[static_cast<size_t>(t)];
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[static_cast<size_t>(t)], 0) << "thread " << t;
  EXPECT_GT(cuda::device_attribute(cudaDevAttrMultiProcessorCount, 0), 0);
  const Error e = expect_lowbit_error([&] { cuda::device_attribute(cudaDevAttrMultiProcessorCount, devices + 5); });
  EXPECT_EQ(e.kind(), ErrorKind::cuda);
  cudaGetLastError();
  if (devices < 2)
    std::printf("[ note     ] one CUDA device: the attributes of device 0 only, from %d threads\n", kThreads);
}

// cuda::l2_streaming_window: streaming hits and misses over the span, clipped
// to the device's largest window, none for an empty span; and a launch with
// such a window (through launch_with_pdl_in_clusters, as the W4A16 and
// attention kernels take it, and read_device_buffer's) runs; launch_switches
// reports the windows as on unless LOWBIT_L2_STREAMING=0.
TEST(CudaL2Streaming, WindowIsClippedToTheDeviceLimitAndALaunchTakesIt) {
  LOWBIT_REQUIRE_GPU();
  const char* env = std::getenv("LOWBIT_L2_STREAMING");
  const bool disabled = env != nullptr && std::string(env) == "0";
  const size_t largest =
      static_cast<size_t>(cuda::device_attribute(cudaDevAttrMaxAccessPolicyWindowSize, 0));
  ASSERT_GT(largest, 0u) << "devices of compute capability 8.0 and later have access-policy windows";
  Buffer buf(1 << 20, Device::cuda);
  LOWBIT_CUDA_CHECK(cudaMemset(buf.data(), 0, buf.size()));
  const cudaAccessPolicyWindow w = cuda::l2_streaming_window({buf.data(), buf.size()});
  if (disabled) {
    EXPECT_EQ(w.num_bytes, 0u) << "LOWBIT_L2_STREAMING=0 turns the windows off";
  } else {
    EXPECT_EQ(w.base_ptr, buf.data());
    EXPECT_EQ(w.num_bytes, buf.size());
    EXPECT_EQ(w.hitRatio, 1.0f);
    EXPECT_EQ(w.hitProp, cudaAccessPropertyStreaming);
    EXPECT_EQ(w.missProp, cudaAccessPropertyStreaming);
    // Only the window's extent is clipped; nothing is read through it here.
    EXPECT_EQ(cuda::l2_streaming_window({buf.data(), largest + 4096}).num_bytes, largest);
  }
  EXPECT_EQ(cuda::launch_switches().l2_streaming, !disabled);
  EXPECT_EQ(cuda::launch_switches().pdl, cuda::pdl_enabled());
  EXPECT_EQ(cuda::l2_streaming_window({buf.data(), 0}).num_bytes, 0u);
  EXPECT_EQ(cuda::l2_streaming_window({nullptr, buf.size()}).num_bytes, 0u);
  int* flag = buf.as<int>();
  cuda::launch_with_pdl_in_clusters(noop_kernel, 0, cuda::L2StreamSpan{buf.data(), buf.size()}, dim3(1), dim3(32), 0,
                                    nullptr, flag);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  int got = 0;
  Buffer::copy(&got, Device::cpu, flag, Device::cuda, sizeof(int));
  EXPECT_EQ(got, 1);
  // The benchmarks' read floors read through the same window.
  LOWBIT_CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
  cuda::read_device_buffer(buf.data(), buf.size(), reinterpret_cast<unsigned*>(flag), nullptr, /*l2_streaming=*/true);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaCheck, FailingCublasCallThrowsCudaError) {
  LOWBIT_REQUIRE_GPU();
  cuda::CublasHandle handle;
  const float one = 1.0f;
  const Error e = expect_lowbit_error([&] {
    LOWBIT_CUBLAS_CHECK(cublasSgemm(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, -1, 1, 1, &one,
                                    nullptr, 1, nullptr, 1, &one, nullptr, 1));
  });
  EXPECT_EQ(e.kind(), ErrorKind::cuda);
  EXPECT_NE(std::string(e.what()).find("cublasSgemm"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos)
      << e.what();
}

TEST(CudaTimer, SpinKernelTimedWithinTolerance) {
  LOWBIT_REQUIRE_GPU();
  const CudaDeviceInfo info = cuda_device_info(0);
  ASSERT_GT(info.clock_khz, 0);
  // 1 ms of SM cycles at the device's peak clock (kHz x 1 ms = cycles).
  const long long cycles = info.clock_khz;
  const double expected_us = 1000.0;
  Buffer elapsed(sizeof(long long), Device::cuda, 0);
  cudaStream_t stream = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::CudaTimerOptions options;
  options.warmup = 20;  // lets the clocks ramp up from idle
  options.reps = 50;
  options.stream = stream;
  const bench::TimingStats t = cuda::time_cuda(
      [&](cudaStream_t s) { spin_kernel<<<1, 32, 0, s>>>(cycles, elapsed.as<long long>()); },
      options);
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(stream));
  long long spun = 0;
  Buffer::copy(&spun, Device::cpu, elapsed.data(), Device::cuda, sizeof spun);
  std::printf("spin of %lld cycles: median %.1f us (p10 %.1f, p90 %.1f, min %.1f, max %.1f); "
              "expected %.1f us at %d MHz\n",
              cycles, t.median_us, t.p10_us, t.p90_us, t.min_us, t.max_us, expected_us,
              info.clock_khz / 1000);
  EXPECT_GE(spun, cycles);
  EXPECT_EQ(t.reps, 50);
  EXPECT_NEAR(t.median_us, expected_us, 0.25 * expected_us);
  EXPECT_LE(t.min_us, t.median_us);
  EXPECT_LE(t.median_us, t.max_us);
  EXPECT_LE(t.p10_us, t.median_us);
  EXPECT_LE(t.median_us, t.p90_us);
}

// A buffer the 16-byte read kernel cannot cover exactly is refused before
// anything is launched (no GPU needed for that).
TEST(CudaTimer, ReadDeviceBufferRefusesSizesAndAddressesOffTheVectorGrid) {
  alignas(16) static unsigned char host[64];
  EXPECT_THROW(cuda::read_device_buffer(host, 17, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::read_device_buffer(host + 4, 32, nullptr, nullptr), Error);
}

// The read floor reads every vector: in a zero buffer one vector holds the
// kernel's marker, so exactly the thread that loads it ends on the marker
// and counts once. Positions in the unrolled trips and in the remainder
// loop, for a size off the kernel's stride (1024 CTAs x 256 threads x 4
// loads) and for one far below a single trip.
TEST(CudaTimer, ReadDeviceBufferReadsEveryVector) {
  LOWBIT_REQUIRE_GPU();
  constexpr uint32_t kMarker = 0x9E3779B9u;
  for (const size_t vectors : {size_t{5}, size_t{1024} * 256 * 4 * 2 + 1024 * 256 + 37}) {
    Buffer data(vectors * 16, Device::cuda), sink(sizeof(unsigned), Device::cuda);
    LOWBIT_CUDA_CHECK(cudaMemset(data.data(), 0, data.size()));
    for (const size_t at : {size_t{0}, vectors / 2, vectors - 1, vectors - 40}) {
      if (at >= vectors) continue;
      LOWBIT_CUDA_CHECK(cudaMemset(sink.data(), 0, sizeof(unsigned)));
      Buffer::copy(data.as<uint8_t>() + at * 16, Device::cuda, &kMarker, Device::cpu, sizeof(kMarker));
      cuda::read_device_buffer(data.data(), data.size(), static_cast<unsigned*>(sink.data()), nullptr);
      LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
      unsigned count = 0;
      Buffer::copy(&count, Device::cpu, sink.data(), Device::cuda, sizeof(count));
      EXPECT_EQ(count, 1u) << "vector " << at << " of " << vectors;
      LOWBIT_CUDA_CHECK(cudaMemset(data.as<uint8_t>() + at * 16, 0, 16));
    }
  }
}

// Both ways of evicting L2 evict it: a 20 MB read (it fits in the H100's
// L2) is slower after either flush than when it stays cached. Each mode's
// time is the least of three medians, the modes interleaved and the cached
// one last in each round: on one H100 the cached medians of a read this
// short came out 2-4x too slow in some runs (the clocks of an idle GPU; the
// flushes keep it busy), and the 24 MB read this test had at first stayed
// uncached there (cached 15.9 us, flushed 16.2 and 12.7). The read flush
// evicts less there: 20 MB at 11.2 us after it, 14.4 after a write flush,
// 9.5 cached (docs/results/h100-gpu-check-summary.txt).
TEST(CudaTimer, BothFlushModesEvictL2) {
  LOWBIT_REQUIRE_GPU();
  const size_t bytes = size_t{20} << 20;
  Buffer data(bytes, Device::cuda, 0), sink(sizeof(unsigned), Device::cuda, 0);
  LOWBIT_CUDA_CHECK(cudaMemset(data.data(), 1, bytes));
  auto read = [&](cudaStream_t s) {
    cuda::read_device_buffer(data.data(), bytes, static_cast<unsigned*>(sink.data()), s);
  };
  auto median = [&](bool flush, bool by_reading) {
    cuda::CudaTimerOptions o;
    o.reps = 30;
    o.flush_l2 = flush;
    o.flush_by_reading = by_reading;
    return cuda::time_cuda(read, o).median_us;
  };
  double cached = 1e30, written = 1e30, read_back = 1e30;
  for (int round = 0; round < 3; ++round) {
    written = std::min(written, median(true, false));
    read_back = std::min(read_back, median(true, true));
    cached = std::min(cached, median(false, false));
  }
  std::printf("20 MB read: cached %.1f us, after a write flush %.1f us (%.2fx), after a read flush %.1f us (%.2fx)\n",
              cached, written, written / cached, read_back, read_back / cached);
  EXPECT_GT(written, 1.2 * cached);
  EXPECT_GT(read_back, 1.05 * cached);
}

TEST(CudaTimer, RejectsBadOptionsAndPropagatesLaunchErrors) {
  LOWBIT_REQUIRE_GPU();
  cuda::CudaTimerOptions bad;
  bad.reps = 0;
  EXPECT_EQ(expect_lowbit_error([&] { cuda::time_cuda([](cudaStream_t) {}, bad); }).kind(),
            ErrorKind::invalid_argument);
  // A launch error inside the timed function surfaces from the timer.
  cuda::CudaTimerOptions options;
  options.warmup = 1;
  options.reps = 2;
  options.flush_l2 = false;
  const Error e = expect_lowbit_error([&] {
    cuda::time_cuda([](cudaStream_t s) { noop_kernel<<<1, 2048, 0, s>>>(nullptr); }, options);
  });
  EXPECT_EQ(e.kind(), ErrorKind::cuda);
  EXPECT_TRUE(is_launch_configuration_error(e.what())) << e.what();
}

// CudaTimerOptions::settle_ms: a negative idle is refused before any CUDA
// call (no GPU needed), and a positive one idles the device that long before
// the warm-up (host wall time of a whole call with nothing else to wait for).
TEST(CudaTimer, SettleIsCheckedAndIdlesBeforeTheWarmUp) {
  cuda::CudaTimerOptions bad;
  bad.settle_ms = -1;
  EXPECT_EQ(expect_lowbit_error([&] { cuda::time_cuda([](cudaStream_t) {}, bad); }).kind(),
            ErrorKind::invalid_argument);
  LOWBIT_REQUIRE_GPU();
  cuda::CudaTimerOptions options;
  options.warmup = 0;
  options.reps = 1;
  options.flush_l2 = false;
  options.settle_ms = 40;
  const auto t0 = std::chrono::steady_clock::now();
  cuda::time_cuda([](cudaStream_t s) { noop_kernel<<<1, 32, 0, s>>>(nullptr); }, options);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 40.0);
}

TEST(CudaBandwidth, CopyIsFasterThan100GBps) {
  LOWBIT_REQUIRE_GPU();
  bench::TimingStats t;
  const double gbps = measure_copy_bandwidth_GBps(0, size_t{256} << 20, &t);
  std::printf("device-to-device copy of 256 MiB: %.0f GB/s (read + write), median %.1f us\n", gbps,
              t.median_us);
  EXPECT_GT(gbps, 100.0);
  EXPECT_EQ(t.reps, 20);
}

TEST(CudaRandom, FillsAreDeterministicAndF16IsNonZero) {
  LOWBIT_REQUIRE_GPU();
  const size_t bytes = 4099;
  Buffer dev(bytes + 1, Device::cuda, 0);
  std::vector<uint8_t> a(bytes), b(bytes);
  // Unaligned destination, odd size.
  cuda::fill_random_bytes(dev.as<uint8_t>() + 1, bytes, 7);
  Buffer::copy(a.data(), Device::cpu, dev.as<uint8_t>() + 1, Device::cuda, bytes);
  LOWBIT_CUDA_CHECK(cudaMemset(dev.data(), 0, bytes + 1));
  cuda::fill_random_bytes(dev.as<uint8_t>() + 1, bytes, 7);
  Buffer::copy(b.data(), Device::cpu, dev.as<uint8_t>() + 1, Device::cuda, bytes);
  EXPECT_EQ(a, b);
  size_t zeros = 0;
  for (uint8_t v : a) zeros += v == 0;
  EXPECT_LT(zeros, bytes / 64);  // ~1/256 expected

  const size_t count = 100003;
  Buffer h(count * 2, Device::cuda, 0);
  cuda::fill_random_f16(h.data(), count, 11, 0.5f);
  std::vector<f16> v(count);
  Buffer::copy(v.data(), Device::cpu, h.data(), Device::cuda, count * 2);
  size_t negative = 0;
  for (size_t i = 0; i < count; ++i) {
    const float f = f16_to_float(v[i]);
    ASSERT_TRUE(std::fabs(f) >= 0.5f / 16 * 0.999f && std::fabs(f) <= 0.5f) << i << ": " << f;
    negative += f < 0;
  }
  EXPECT_NEAR(static_cast<double>(negative) / count, 0.5, 0.02);
}

// y = x . W for both weight layouts; W[k, n] is stored at w[n * K + k] (nk)
// or w[k * N + n] (kn).
void check_gemm_f16(cuda::WeightLayout layout) {
  const int64_t M = 3, K = 256, N = 136;
  std::mt19937 rng(layout == cuda::WeightLayout::nk ? 1234 : 4321);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<f16> x(M * K), w(N * K), y(M * N);
  for (auto& v : x) v = float_to_f16(dist(rng));
  for (auto& v : w) v = float_to_f16(dist(rng));
  auto weight = [&](int64_t k, int64_t n) {
    return f16_to_float(layout == cuda::WeightLayout::nk ? w[n * K + k] : w[k * N + n]);
  };

  Buffer dx(x.size() * 2, Device::cuda, 0), dw(w.size() * 2, Device::cuda, 0),
      dy(y.size() * 2, Device::cuda, 0);
  Buffer::copy(dx.data(), Device::cuda, x.data(), Device::cpu, dx.size());
  Buffer::copy(dw.data(), Device::cuda, w.data(), Device::cpu, dw.size());
  LOWBIT_CUDA_CHECK(cudaMemset(dy.data(), 0xFF, dy.size()));  // 0xFFFF is a binary16 NaN
  cuda::CublasHandle handle;
  cuda::gemm_f16_cublas(handle.get(), dx.data(), dw.data(), dy.data(), M, N, K, nullptr, layout);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  Buffer::copy(y.data(), Device::cpu, dy.data(), Device::cuda, dy.size());

  double err2 = 0, ref2 = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k)
        ref += static_cast<double>(f16_to_float(x[m * K + k])) * weight(k, n);
      const double got = f16_to_float(y[m * N + n]);
      ASSERT_TRUE(std::isfinite(got)) << "y[" << m << ", " << n << "] not written";
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  EXPECT_LT(rel, 2e-3) << "relative error " << rel;
}

TEST(CudaCublas, GemmF16MatchesFp64Reference) {
  LOWBIT_REQUIRE_GPU();
  check_gemm_f16(cuda::WeightLayout::nk);  // nn.Linear's weight [N, K]
}

TEST(CudaCublas, GemmF16KnLayoutMatchesFp64Reference) {
  LOWBIT_REQUIRE_GPU();
  check_gemm_f16(cuda::WeightLayout::kn);
}

TEST(CudaCublas, GemmRejectsBadExtents) {
  LOWBIT_REQUIRE_GPU();
  cuda::CublasHandle handle;
  const Error e = expect_lowbit_error([&] {
    cuda::gemm_f16_cublas(handle.get(), nullptr, nullptr, nullptr, 0, 8, 8, nullptr);
  });
  EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
}

}  // namespace
}  // namespace lowbit
