// `lowbit bench model` in a build without CUDA: a clear error.
#ifndef LOWBIT_WITH_CUDA
#include "lowbit/core/error.h"
#include "lowbit/engine/model_bench.h"

namespace lowbit::engine {

void run_model_benchmark(const ModelBenchOptions&) {
  fail(ErrorKind::unsupported, "lowbit was built without CUDA: `lowbit bench model` needs an NVIDIA GPU");
}

}  // namespace lowbit::engine
#endif
