// Builds without CUDA: the W4A16 benchmark exists in name only and says so.
#ifndef LOWBIT_WITH_CUDA

#include "lowbit/core/error.h"
#include "lowbit/w4a16/w4a16_bench.h"

namespace lowbit {

void run_w4a16_gemm_benchmark(const W4A16BenchOptions&) {
  fail(ErrorKind::unsupported,
       "lowbit bench gemm needs the CUDA part: this lowbit was built without CUDA (LOWBIT_CUDA=OFF or no nvcc)");
}

}  // namespace lowbit

#endif  // LOWBIT_WITH_CUDA
