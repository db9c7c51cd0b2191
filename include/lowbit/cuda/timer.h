// The one timing loop of lowbit: every GPU benchmark times its kernels with
// time_cuda, so that all numbers are taken the same way as the peer
// measurements they are compared with (triton.testing.do_bench: CUDA events,
// L2 flushed before every timed call, median of ~100 reps).
#pragma once

#include <functional>

#include <cuda_runtime.h>

#include "lowbit/bench/stats.h"

namespace lowbit::cuda {

struct CudaTimerOptions {
  int warmup = 10;         // untimed calls first: module load, cuBLAS heuristics, clocks ramping up
  int reps = 100;          // timed calls; the median of these is the result
  bool flush_l2 = true;    // evict L2 before each timed call (outside the timed region)
  // How: false writes the flush buffer (cudaMemset, as triton.testing.do_bench
  // and the peer anchors do), which leaves L2 full of dirty lines that the
  // timed call then pays to write back to HBM while it reads; true reads it
  // instead (clean lines, the state a decode step's GEMM finds: the previous
  // layer's weights). The difference is ~50 MB of write-back on an H100,
  // which matters most for the calls that read the fewest bytes.
  bool flush_by_reading = false;
  // Milliseconds the device sits idle (after a synchronization) before the
  // warm-up. Without it a light call timed right after a heavy one ran slow:
  // in `lowbit bench gemm` the same one-row kernel 10-20% slower right after
  // a 1024-row point than ~40 ms later, and equal with 50 ms of idle
  // (docs/w4a16-gemm.md v43). v44's telemetry shows the heavy points at the
  // GPU's power cap with a lower SM clock; that its recovery is the cause is
  // a reading (docs/engine.md v44, where a model step needed ~1 s).
  int settle_ms = 0;
  cudaStream_t stream = nullptr;  // the stream `launch` must enqueue on
};

// Calls launch(stream) `warmup` times, then `reps` times, each timed on the
// device by a pair of CUDA events recorded on the stream around it, and
// returns the summary of the per-call times in microseconds. `launch` must
// enqueue its work on the given stream and not synchronise; the last CUDA
// error is checked after each call. Times the current device.
//
// Throws Error(invalid_argument) for warmup < 0, reps < 1 or settle_ms < 0, Error(cuda) when
// a CUDA call or a launch fails, and whatever `launch` throws.
bench::TimingStats time_cuda(const std::function<void(cudaStream_t)>& launch,
                             const CudaTimerOptions& options = {});

// Enqueues a kernel on `stream` that reads every byte of the device buffer
// [data, data + bytes) once (bytes a multiple of 16, data 16-byte aligned)
// and writes nothing but, on a value it never meets in practice, one counter
// in `sink`: how the timer evicts L2 with clean lines, and a known read load
// for tests. l2_streaming: the read goes through an L2 streaming window
// (l2_streaming_window in lowbit/cuda/pdl.cuh), as the W4A16 and attention
// kernels read their weights and caches: the benchmarks' read floors, which
// must stay a ceiling for those kernels. Never for evicting L2: streaming
// lines are the first L2 evicts, so they would not push the others out.
void read_device_buffer(const void* data, size_t bytes, unsigned* sink, cudaStream_t stream,
                        bool l2_streaming = false);

// Bytes of the buffer written (or read) before each timed call to evict L2 on
// the current device: max(2 x L2 size, 256 MiB).
size_t l2_flush_bytes();

}  // namespace lowbit::cuda
