#include "lowbit/core/parallel.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit {

int num_threads() {
  if (const char* env = std::getenv("LOWBIT_NUM_THREADS"); env != nullptr && *env != '\0') {
    // Strict: "8x", "0" or "-2" were once read as 8 or as unset, silently.
    const std::string_view text(env);
    int n = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (error != std::errc{} || end != text.data() + text.size() || n < 1 || n > kMaxThreads)
      fail_argument("LOWBIT_NUM_THREADS", std::string("'") + env + "'",
                    "a whole number of threads from 1 to " + std::to_string(kMaxThreads) +
                        " (lowbit::kMaxThreads), or unset for every core");
    return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, kMaxThreads));
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& body) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t n = end - begin;
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t workers = std::min<int64_t>(num_threads(), max_chunks);
  if (workers <= 1) {
    body(begin, end);
    return;
  }
  const int64_t per = (n + workers - 1) / workers;
  std::exception_ptr first_error;
  std::mutex error_mutex;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t lo = begin + w * per;
    const int64_t hi = std::min(end, lo + per);
    if (lo >= hi) break;
    threads.emplace_back([&, lo, hi] {
      try {
        body(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace lowbit
