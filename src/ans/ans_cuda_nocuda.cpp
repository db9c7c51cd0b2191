// Builds without CUDA: the GPU chain and `lowbit bench ans` exist in name only
// and say so (the real ones are in ans_cuda.cu and ans_bench.cu).
#ifndef LOWBIT_WITH_CUDA

#include "lowbit/ans/ans_cuda.h"
#include "lowbit/core/error.h"

namespace lowbit::ans {

ChainRun run_chain_cuda(const AnsFile&, std::string_view where, const CudaRunOptions&) {
  fail(ErrorKind::unsupported, where,
       ": --device cuda: this lowbit was built without CUDA (LOWBIT_CUDA=OFF or no nvcc); use --device cpu");
}

void run_ans_benchmark(const AnsBenchOptions&) {
  fail(ErrorKind::unsupported,
       "lowbit bench ans needs the CUDA part: this lowbit was built without CUDA (LOWBIT_CUDA=OFF or no nvcc)");
}

}  // namespace lowbit::ans

#endif  // LOWBIT_WITH_CUDA
