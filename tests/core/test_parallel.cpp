// lowbit::num_threads() and parallel_for: the thread count a user sets through
// LOWBIT_NUM_THREADS is taken exactly or refused with a message that names
// the variable, never read loosely ("8x" as 8) or ignored ("0" as unset).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "error_matchers.h"
#include "lowbit/core/parallel.h"

namespace lowbit::test {
namespace {

// Sets LOWBIT_NUM_THREADS for one scope and puts back what was there.
class ScopedThreadsVariable {
 public:
  explicit ScopedThreadsVariable(const char* value) {
    if (const char* old = std::getenv(kName)) saved_ = old;
    if (value != nullptr) ::setenv(kName, value, 1);
    else ::unsetenv(kName);
  }
  ~ScopedThreadsVariable() {
    if (saved_) ::setenv(kName, saved_->c_str(), 1);
    else ::unsetenv(kName);
  }

 private:
  static constexpr const char* kName = "LOWBIT_NUM_THREADS";
  std::optional<std::string> saved_;
};

TEST(NumThreads, TakesTheVariableExactly) {
  for (const int n : {1, 3, 64, kMaxThreads}) {
    const std::string text = std::to_string(n);
    ScopedThreadsVariable set(text.c_str());
    EXPECT_EQ(num_threads(), n);
  }
}

TEST(NumThreads, UnsetOrEmptyIsEveryCoreUpToTheBound) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    ScopedThreadsVariable set(value);
    const int n = num_threads();
    EXPECT_GE(n, 1);
    EXPECT_LE(n, kMaxThreads);
  }
}

TEST(NumThreads, RefusesWhatIsNotACountInRange) {
  for (const char* value : {"0", "-2", "8x", "abc", " 4", "1025", "99999999999"}) {
    ScopedThreadsVariable set(value);
    EXPECT_TRUE(throws_error([] { (void)num_threads(); }, ErrorKind::invalid_argument,
                             {"LOWBIT_NUM_THREADS", value, "1 to 1024"}))
        << "'" << value << "'";
  }
}

TEST(ParallelFor, CoversTheRangeOnceWithTheThreadsAsked) {
  ScopedThreadsVariable set("3");
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(0, 1000, 7, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace lowbit::test
