// A minimal parallel loop for CPU reference code. The references are the
// oracle for every GPU test, so they must be fast enough to check large
// shapes; threads are started per call (cheap next to the work they do).
#pragma once

#include <cstdint>
#include <functional>

namespace lowbit {

// Number of worker threads: LOWBIT_NUM_THREADS if set (>= 1), else the hardware count.
int num_threads();

// Calls body(begin_i, end_i) on disjoint chunks covering [begin, end), each of
// at least `grain` iterations (except the last), from up to num_threads()
// threads. The first exception thrown by a chunk is rethrown here.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& body);

}  // namespace lowbit
