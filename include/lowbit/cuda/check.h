// Checked CUDA calls. Every runtime call in lowbit goes through
// LOWBIT_CUDA_CHECK and every kernel launch is followed by
// LOWBIT_CUDA_CHECK_LAUNCH, so a failure names the call, file and line instead
// of surfacing later as a wrong answer.
#pragma once

#include <cuda_runtime.h>

#include "lowbit/core/error.h"

namespace lowbit::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line);

// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace lowbit::cuda

#define LOWBIT_CUDA_CHECK(call)                                                  \
  do {                                                                           \
    const cudaError_t lowbit_status_ = (call);                                   \
    if (lowbit_status_ != cudaSuccess)                                           \
      ::lowbit::cuda::throw_cuda_error(lowbit_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: reports configuration errors (bad grid, too much
// shared memory) at the launch site rather than at the next synchronisation.
#define LOWBIT_CUDA_CHECK_LAUNCH() LOWBIT_CUDA_CHECK(cudaGetLastError())
