// The device queries of lowbit/cuda/device.h for a build without CUDA; the
// real ones are in src/cuda/device.cu.
#ifndef LOWBIT_WITH_CUDA

#include "lowbit/core/error.h"
#include "lowbit/cuda/device.h"

namespace lowbit {

bool cuda_built() { return false; }

int cuda_device_count() noexcept { return 0; }

CudaDeviceInfo cuda_device_info(int index) {
  fail(ErrorKind::unsupported, "cuda_device_info(", index,
       "): lowbit was built without CUDA (LOWBIT_CUDA=OFF or no nvcc)");
}

double measure_copy_bandwidth_GBps(int index, size_t bytes, bench::TimingStats*) {
  fail(ErrorKind::unsupported, "measure_copy_bandwidth_GBps(", index, ", ", bytes,
       "): lowbit was built without CUDA (LOWBIT_CUDA=OFF or no nvcc)");
}

}  // namespace lowbit

#endif  // LOWBIT_WITH_CUDA
