// Builds without CUDA: the KV attention benchmark exists in name only and says so.
#ifndef LOWBIT_WITH_CUDA

#include "lowbit/core/error.h"
#include "lowbit/kv/attention_bench.h"

namespace lowbit {

void run_kv_attention_benchmark(const KvAttentionBenchOptions&) {
  fail(ErrorKind::unsupported,
       "lowbit bench attention needs the CUDA part: this lowbit was built without CUDA (LOWBIT_CUDA=OFF or no nvcc)");
}

}  // namespace lowbit

#endif  // LOWBIT_WITH_CUDA
