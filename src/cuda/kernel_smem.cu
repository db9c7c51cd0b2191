#include "lowbit/cuda/kernel_smem.h"

#include <map>
#include <mutex>
#include <utility>

#include "lowbit/cuda/check.h"

namespace lowbit::cuda {

void ensure_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> configured;  // the limit set so far, per device and kernel
  std::lock_guard<std::mutex> lock(mutex);
  int& limit = configured[{device, kernel}];
  if (bytes <= limit) return;
  LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  limit = bytes;
}

}  // namespace lowbit::cuda
