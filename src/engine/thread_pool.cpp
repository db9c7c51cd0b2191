#include "lowbit/engine/thread_pool.h"

#include <algorithm>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"

namespace lowbit::engine {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Spins briefly, then yields the core on every further iteration: on a
// machine shared with other work, a thread we wait for may be descheduled,
// and spinning on would only keep it off the core.
class Backoff {
 public:
  void pause() {
    if (++spins_ < 2000) cpu_relax();
    else std::this_thread::yield();
  }

 private:
  int spins_ = 0;
};
}  // namespace

// One run() call. It lives on the caller's stack; run() returns only after it
// is unpublished and no worker can still touch it (see run()).
struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* body = nullptr;
  int64_t begin = 0, end = 0, chunk = 1, chunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  void work() {
    for (;;) {
      const int64_t c = next.fetch_add(1);
      if (c >= chunks) return;
      const int64_t lo = begin + c * chunk;
      const int64_t hi = std::min(end, lo + chunk);
      try {
        (*body)(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      done.fetch_add(1);
    }
  }
};

ThreadPool::ThreadPool(int threads) {
  LOWBIT_CHECK_ARG(threads <= kMaxThreads, "threads", threads,
                   "at most " + std::to_string(kMaxThreads) + " (lowbit::kMaxThreads), or 0 for lowbit::num_threads()");
  const int n = threads > 0 ? threads : num_threads();
  for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little for the next job (decode issues them back to back), yield a while, then sleep.
    uint64_t gen = generation_.load();
    for (int spin = 0; gen == seen && spin < 4000; ++spin) {
      if (spin < 2000) cpu_relax();
      else std::this_thread::yield();
      gen = generation_.load();
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      gen = generation_.load();
    }
    seen = gen;
    if (stop_.load()) return;
    // Announce first, then look: run() unpublishes the job before waiting for
    // active_workers_ to drop to 0 (both sequentially consistent), so a worker
    // that announces itself after that wait sees nullptr.
    active_workers_.fetch_add(1);
    if (Job* job = job_.load()) job->work();
    active_workers_.fetch_sub(1);
  }
}

void ThreadPool::run(int64_t begin, int64_t end, int64_t grain,
                     const std::function<void(int64_t, int64_t)>& body) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t n = end - begin;
  const int64_t max_chunks = (n + grain - 1) / grain;
  if (workers_.empty() || max_chunks <= 1) {
    body(begin, end);
    return;
  }
  Job job;
  // A few chunks per thread balance uneven work without much claiming traffic.
  const int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
  job.body = &body;
  job.begin = begin;
  job.end = end;
  job.chunk = (n + chunks - 1) / chunks;
  job.chunks = (n + job.chunk - 1) / job.chunk;
  job_.store(&job);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  job.work();
  Backoff backoff;
  while (job.done.load() < job.chunks) backoff.pause();
  job_.store(nullptr);
  while (active_workers_.load() != 0) backoff.pause();
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace lowbit::engine
