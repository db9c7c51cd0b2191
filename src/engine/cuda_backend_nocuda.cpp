// make_cuda_backend in a build without CUDA: a clear error.
#ifndef LOWBIT_WITH_CUDA
#include "lowbit/core/error.h"
#include "lowbit/engine/backend.h"

namespace lowbit::engine {

std::unique_ptr<Backend> make_cuda_backend(const Model&, const KvOptions&, bool, bool) {
  fail(ErrorKind::unsupported, "--device cuda: this lowbit was built without CUDA");
}

}  // namespace lowbit::engine
#endif
