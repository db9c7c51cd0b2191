#include "lowbit/cuda/check.h"

namespace lowbit::cuda {

void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  fail(ErrorKind::cuda, what, " failed: ", cudaGetErrorName(status), " (",
       cudaGetErrorString(status), ") at ", file, ":", line);
}

DeviceGuard::DeviceGuard(int device) {
  LOWBIT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) LOWBIT_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

}  // namespace lowbit::cuda
