// require_host_memory: a request larger than the machine is an error that says
// what was asked for and what there is, before anything is allocated.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "error_matchers.h"
#include "lowbit/core/host_memory.h"

namespace lowbit::test {
namespace {

TEST(HostMemory, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(format_bytes(int64_t{21} << 40), "21.0 TiB");
}

TEST(HostMemory, RefusesMoreThanTheMachineHasAndNamesTheRequest) {
  const auto available = host_memory_available();
  if (!available) GTEST_SKIP() << "no /proc/meminfo here: the check does nothing (documented)";
  EXPECT_GT(*available, 0);
  EXPECT_NO_THROW(require_host_memory(1 << 20, "a small buffer"));
  EXPECT_TRUE(throws_error([] { require_host_memory(std::numeric_limits<int64_t>::max(), "the test's request"); },
                           ErrorKind::unsupported,
                           {"the test's request needs 8.0 EiB of host memory", "available", "MemAvailable"}));
}

}  // namespace
}  // namespace lowbit::test
