#include "lowbit/cuda/device.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "lowbit/core/error.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device_attribute.h"
#include "lowbit/cuda/launch_switches.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/cuda/random.h"
#include "lowbit/cuda/timer.h"

namespace lowbit {
namespace {

// 13000 -> "13.0", 12080 -> "12.8".
std::string cuda_version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// An attribute, or 0 when this runtime or device does not report it.
int attribute_or_zero(cudaDeviceAttr attr, int device) {
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) {
    cudaGetLastError();  // not sticky; keep it out of the next launch check
    return 0;
  }
  return value;
}

void check_index(int index) {
  const int count = cuda_device_count();
  if (count == 0)
    fail(ErrorKind::unsupported, "no CUDA device is visible (no driver, no device, or "
         "CUDA_VISIBLE_DEVICES hides them all); device ", index, " was asked for");
  LOWBIT_CHECK_ARG(index >= 0 && index < count, "device index", index,
                   "an index in [0, " + std::to_string(count) + ")");
}

}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it: "no driver" must not fail a later launch check
    return 0;
  }
  return count;
}

CudaDeviceInfo cuda_device_info(int index) {
  check_index(index);
  cuda::DeviceGuard guard(index);
  cudaDeviceProp prop{};
  LOWBIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));

  CudaDeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  // CUDA 13 removed the clock fields from cudaDeviceProp; the attributes remain.
  info.clock_khz = attribute_or_zero(cudaDevAttrClockRate, index);
  info.memory_clock_khz = attribute_or_zero(cudaDevAttrMemoryClockRate, index);
  info.memory_bus_width_bits = attribute_or_zero(cudaDevAttrGlobalMemoryBusWidth, index);
  // Double data rate: two transfers per clock on each bit of the bus.
  info.peak_bandwidth_GBps = 2.0 * info.memory_clock_khz * 1e3 *
                             (info.memory_bus_width_bits / 8.0) / 1e9;

  size_t free_bytes = 0, total_bytes = 0;
  LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  info.free_memory = free_bytes;

  int driver = 0, runtime = 0;
  LOWBIT_CUDA_CHECK(cudaDriverGetVersion(&driver));
  LOWBIT_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  info.driver_version = cuda_version_string(driver);
  info.runtime_version = cuda_version_string(runtime);
  return info;
}

double measure_copy_bandwidth_GBps(int index, size_t bytes, bench::TimingStats* stats) {
  check_index(index);
  LOWBIT_CHECK_ARG(bytes >= 4096, "bytes", bytes, "at least 4096 bytes to copy");
  cuda::DeviceGuard guard(index);
  size_t free_bytes = 0, total_bytes = 0;
  LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > free_bytes / 2)
    fail_argument("bytes", bytes, "at most half the free device memory (" +
                                      std::to_string(free_bytes) + " bytes free) for source and "
                                      "destination");

  Buffer src(bytes, Device::cuda, index);
  Buffer dst(bytes, Device::cuda, index);
  cudaStream_t stream = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamOwner {
    cudaStream_t s;
    ~StreamOwner() { cudaStreamDestroy(s); }
  } owner{stream};

  cuda::fill_random_bytes(src.data(), bytes, 0x5EED0C0FFEEull, stream);
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(dst.data(), 0xA5, bytes, stream));

  cuda::CudaTimerOptions options;
  options.warmup = 3;
  options.reps = 20;
  options.stream = stream;
  // The copy is far larger than L2 for the default size; the flush keeps
  // smaller copies honest too.
  options.flush_l2 = true;
  const bench::TimingStats t = cuda::time_cuda(
      [&](cudaStream_t s) {
        LOWBIT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));
      },
      options);
  if (stats) *stats = t;
  // Bytes read plus bytes written.
  return 2.0 * static_cast<double>(bytes) / (t.median_us * 1e3);
}

}  // namespace lowbit

namespace lowbit::cuda {

int device_attribute(cudaDeviceAttr attr, int device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> cached;  // (device, attribute) -> value
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, static_cast<int>(attr));
  if (const auto it = cached.find(key); it != cached.end()) return it->second;
  int value = 0;
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  cached.emplace(key, value);
  return value;
}

bool switched_off_by_env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "0";
}

bool pdl_enabled() {
  // Atomic slots: host threads may fill them at once (with the same value).
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 off, 2 on
  static const bool disabled_by_env = switched_off_by_env("LOWBIT_PDL");
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& slot = cached[device & 63];
  if (slot.load(std::memory_order_relaxed) == 0) {
    const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
    slot.store(major >= 9 && !disabled_by_env ? 2 : 1, std::memory_order_relaxed);
  }
  return slot.load(std::memory_order_relaxed) == 2;
}

namespace {

bool l2_streaming_disabled_by_env() {
  static const bool disabled = switched_off_by_env("LOWBIT_L2_STREAMING");
  return disabled;
}

size_t largest_l2_window() {
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  return static_cast<size_t>(device_attribute(cudaDevAttrMaxAccessPolicyWindowSize, device));
}

}  // namespace

cudaAccessPolicyWindow l2_streaming_window(L2StreamSpan span) {
  cudaAccessPolicyWindow w{};
  if (span.base == nullptr || span.bytes == 0 || l2_streaming_disabled_by_env()) return w;
  w.base_ptr = const_cast<void*>(span.base);
  w.num_bytes = std::min(span.bytes, largest_l2_window());
  w.hitRatio = 1.0f;
  w.hitProp = cudaAccessPropertyStreaming;
  w.missProp = cudaAccessPropertyStreaming;
  return w;
}

LaunchSwitches launch_switches() {
  return {!l2_streaming_disabled_by_env() && largest_l2_window() > 0, pdl_enabled()};
}

void announce_launch_switches(bench::JsonRowsWriter* json) {
  const LaunchSwitches s = launch_switches();
  std::printf("launch switches: L2 streaming windows %s (LOWBIT_L2_STREAMING), programmatic dependent launch %s "
              "(LOWBIT_PDL)\n",
              s.l2_streaming ? "on" : "off", s.pdl ? "on" : "off");
  if (json != nullptr) json->set_run_fields({{"l2_streaming", s.l2_streaming}, {"pdl", s.pdl}});
}

}  // namespace lowbit::cuda
