// lowbit/cuda/device.h from CPU code: the queries never throw where they
// promise not to, and fail with Error(unsupported) without CUDA or a device.
#include <gtest/gtest.h>

#include <string>

#include "lowbit/core/error.h"
#include "lowbit/cuda/device.h"

namespace lowbit {
namespace {

TEST(DeviceQuery, CountNeverThrowsAndIsZeroWithoutCuda) {
  int count = -1;
  EXPECT_NO_THROW(count = cuda_device_count());
  EXPECT_GE(count, 0);
  if (!cuda_built()) {
    EXPECT_EQ(count, 0);
  }
}

TEST(DeviceQuery, WithoutCudaOrDeviceQueriesAreUnsupported) {
  if (cuda_device_count() > 0) {
    // With a device (tested in depth in test_cuda), an index past the last is a caller's error.
    try {
      cuda_device_info(cuda_device_count());
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
    }
    return;
  }
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0)
        cuda_device_info(0);
      else
        measure_copy_bandwidth_GBps(0, size_t{1} << 20);
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
      if (!cuda_built()) {
        EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace lowbit
