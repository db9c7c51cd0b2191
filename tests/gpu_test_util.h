// Shared by every GPU test: a test that needs a device starts with
// LOWBIT_REQUIRE_GPU(). Off-GPU (CI, developers' machines) it skips; on the
// GPU machine scripts/gpu-check sets LOWBIT_REQUIRE_GPU=1 so that a missing
// or invisible device fails loudly instead of skipping every GPU test.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "lowbit/cuda/device.h"

namespace lowbit::test_util {

inline bool gpu_required_by_environment() {
  const char* v = std::getenv("LOWBIT_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace lowbit::test_util

// Usable only directly in a TEST body (it returns from it).
#define LOWBIT_REQUIRE_GPU()                                              \
  do {                                                                    \
    if (::lowbit::cuda_device_count() == 0) {                             \
      if (::lowbit::test_util::gpu_required_by_environment()) {             \
        FAIL() << "no GPU but LOWBIT_REQUIRE_GPU=1";                      \
      } else {                                                            \
        GTEST_SKIP() << "no CUDA device";                                 \
      }                                                                   \
    }                                                                     \
  } while (0)
