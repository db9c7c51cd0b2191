// What CUDA device this process runs on, and how fast its memory really is.
// A plain C++ header (no CUDA includes): CPU-only code may call these. In a
// build without CUDA, cuda_built() is false, cuda_device_count() is 0 and the
// other functions throw Error(unsupported).
#pragma once

#include <cstddef>
#include <string>

#include "lowbit/bench/stats.h"

namespace lowbit {

// True when this lowbit was compiled with its CUDA part (LOWBIT_WITH_CUDA).
bool cuda_built();

// Number of usable CUDA devices; 0 when built without CUDA, when there is no
// driver or no device. Never throws.
int cuda_device_count() noexcept;

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability, e.g. 9.0 for H100
  int sm_count = 0;
  size_t total_memory = 0;          // bytes of device memory
  size_t free_memory = 0;           // bytes free when queried
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // shared memory one block may opt in to
  int clock_khz = 0;                // peak SM clock (what clock64() counts), 0 if not reported
  int memory_clock_khz = 0;         // peak memory clock, 0 if not reported
  int memory_bus_width_bits = 0;    // 0 if not reported
  // Theoretical DRAM bandwidth: 2 transfers per memory clock (DDR) times the
  // bus width. 0 when the runtime reports no memory clock or bus width.
  double peak_bandwidth_GBps = 0;
  std::string driver_version;   // CUDA version the driver supports, e.g. "13.0"
  std::string runtime_version;  // CUDA runtime lowbit was linked with, e.g. "13.0"
};

// Throws Error(invalid_argument) for an index outside [0, cuda_device_count()),
// Error(cuda) when the runtime fails.
CudaDeviceInfo cuda_device_info(int index);

// Device-to-device copy bandwidth of device `index` in GB/s (1e9 bytes/s),
// counting bytes read plus bytes written (2 * bytes per copy), the convention
// of the peer measurements (3.00 TB/s on an H100 SXM). Copies `bytes` of
// random data with cudaMemcpyAsync through the shared CUDA timer (warm-up,
// events, median). If `stats` is given it receives the timings of one copy.
// Needs 2 * bytes of free device memory.
double measure_copy_bandwidth_GBps(int index, size_t bytes = 1ull << 30,
                                   bench::TimingStats* stats = nullptr);

}  // namespace lowbit
