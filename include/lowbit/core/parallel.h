// A minimal parallel loop for CPU reference code. The references are the
// oracle for every GPU test, so they must be fast enough to check large
// shapes; threads are started per call (cheap next to the work they do).
#pragma once

#include <cstdint>
#include <functional>

namespace lowbit {

// The most CPU threads lowbit starts for one loop or pool. Why a bound: a
// pool of 100000 threads (a typo in --threads or LOWBIT_NUM_THREADS) takes
// minutes to start and then spins on two cores; no machine we run on has a
// thousand cores, and past the core count more threads only compete.
inline constexpr int kMaxThreads = 1024;

// Number of worker threads: LOWBIT_NUM_THREADS if set (a whole number from 1
// to kMaxThreads; anything else throws Error(invalid_argument) naming it),
// else the hardware count, at most kMaxThreads. An empty variable counts as unset.
int num_threads();

// Calls body(begin_i, end_i) on disjoint chunks covering [begin, end), each of
// at least `grain` iterations (except the last), from up to num_threads()
// threads. The first exception thrown by a chunk is rethrown here.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& body);

}  // namespace lowbit
