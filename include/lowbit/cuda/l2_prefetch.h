// Asking L2 to fetch device memory ahead of the kernel that will read it.
//
// Why: a batch-1 decode step alternates between kernels that stream weights
// at the memory bus's speed (the GEMMs) and chains of small, latency-bound
// kernels (norms, RoPE, the KV append, the attention of a short context)
// during which HBM is nearly idle: on Qwen3-14B ~25 us per layer, time in
// which the bus could move ~75 MB. Prefetching the next GEMM's weights into
// L2 (50 MB on an H100) during such a chain lets that GEMM read them from L2,
// which shortens the step by the time those bytes would have taken from HBM.
// A prefetch changes no value anywhere: only where the bytes come from.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>

namespace lowbit::cuda {

struct L2Range {
  const void* ptr = nullptr;
  size_t bytes = 0;
};

// The most ranges one prefetch_to_l2 call takes.
inline constexpr int kMaxL2Ranges = 4;

// Whether prefetch_to_l2 does anything on the current device: the bulk L2
// prefetch is a Hopper (sm_90) instruction; on older devices the call
// returns without launching.
bool l2_prefetch_supported();

// One small kernel on `stream` that asks L2 to fetch `ranges`, in order, up to
// `max_bytes` in all (a range is cut where the budget ends; each range is
// fetched from its start, rounded down to whole 16-byte pieces). The kernel
// issues the requests and exits; the copies complete in the background, and
// nothing waits for them. Launched with programmatic dependent launch: it
// keeps the stream's order for the kernels after it (see pdl.cuh). Throws
// Error(invalid_argument) for more than kMaxL2Ranges ranges or a pointer not
// 16-byte aligned.
void prefetch_to_l2(std::span<const L2Range> ranges, size_t max_bytes, cudaStream_t stream);

}  // namespace lowbit::cuda
