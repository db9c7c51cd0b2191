// Checked cuBLAS calls, like LOWBIT_CUDA_CHECK for the runtime: a failing
// status throws Error(cuda) naming the call, the status, file and line.
#pragma once

#include <cublas_v2.h>

#include "lowbit/core/error.h"

namespace lowbit::cuda {

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* what, const char* file,
                                     int line);

}  // namespace lowbit::cuda

#define LOWBIT_CUBLAS_CHECK(call)                                                    \
  do {                                                                               \
    const cublasStatus_t lowbit_cublas_status_ = (call);                             \
    if (lowbit_cublas_status_ != CUBLAS_STATUS_SUCCESS)                              \
      ::lowbit::cuda::throw_cublas_error(lowbit_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
