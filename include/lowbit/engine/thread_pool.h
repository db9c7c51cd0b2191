// A persistent worker pool for the engine's CPU forward pass.
//
// Why not core/parallel.h's parallel_for: it starts threads per call, which is
// right for references that run seconds, but one decode step of a small model
// makes ~250 parallel calls of a few microseconds each (7 matrix products per
// layer, attention, norms); starting threads for each costs more than the
// work. Here the workers stay alive, spin briefly on a generation counter
// after each job (so back-to-back calls wake them in well under a
// microsecond), then sleep on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lowbit::engine {

class ThreadPool {
 public:
  // threads <= 0: lowbit::num_threads() (LOWBIT_NUM_THREADS or the hardware count).
  // Error(invalid_argument) above lowbit::kMaxThreads (core/parallel.h).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }  // the caller works too

  // Calls body(begin_i, end_i) on disjoint chunks covering [begin, end), each
  // at least `grain` long (except the last), on the pool and the calling
  // thread; returns when all are done. The first exception is rethrown.
  // Not reentrant: body must not call run() on the same pool.
  void run(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

 private:
  struct Job;
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<Job*> job_{nullptr};   // the published job, or nullptr between jobs
  std::atomic<int> active_workers_{0};  // workers that may be touching a job
};

}  // namespace lowbit::engine
