// prefetch_to_l2 (l2_prefetch.h): one bulk L2 prefetch per 32 KB piece.
#include <algorithm>
#include <cstdint>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/l2_prefetch.h"
#include "lowbit/cuda/pdl.cuh"

namespace lowbit::cuda {

namespace {

// A piece per bulk-prefetch instruction: large enough that a few hundred
// instructions cover a layer's weights, small enough that the pieces spread
// over many SMs' copy engines (one engine alone does not request bytes at the
// bus's rate).
constexpr uint32_t kPieceBytes = 32 * 1024;
constexpr int kPrefetchThreads = 32;
constexpr int kMaxPrefetchCtas = 128;

struct PrefetchRanges {
  const char* ptr[kMaxL2Ranges];
  uint64_t bytes[kMaxL2Ranges];     // multiples of 16
  uint64_t first_piece[kMaxL2Ranges + 1];  // prefix sums of the piece counts
  int count;
};

__global__ void __launch_bounds__(kPrefetchThreads) prefetch_to_l2_kernel(PrefetchRanges r) {
  // The next kernel may launch now. This one still waits for its predecessor
  // before it exits (pdl.cuh: a grid that skipped the wait could complete
  // before the kernel it follows, and the kernels after it would then start
  // too early), and it issues its requests after that wait so that they do
  // not take bandwidth from a GEMM that is still streaming.
  pdl_launch_dependents();
  pdl_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t pieces = r.first_piece[r.count];
  // Consecutive pieces go to consecutive CTAs, so that every CTA (and so
  // every SM's copy engine) gets its share even when there are few pieces.
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  int range = 0;
  for (uint64_t p = static_cast<uint64_t>(threadIdx.x) * gridDim.x + blockIdx.x; p < pieces; p += stride) {
    while (p >= r.first_piece[range + 1]) ++range;
    const uint64_t offset = (p - r.first_piece[range]) * kPieceBytes;
    const uint32_t size = static_cast<uint32_t>(std::min<uint64_t>(kPieceBytes, r.bytes[range] - offset));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(r.ptr[range] + offset), "r"(size)
                 : "memory");
  }
#endif
}

}  // namespace

bool l2_prefetch_supported() {
  int device = 0, major = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

void prefetch_to_l2(std::span<const L2Range> ranges, size_t max_bytes, cudaStream_t stream) {
  LOWBIT_REQUIRE(ranges.size() <= static_cast<size_t>(kMaxL2Ranges), "prefetch_to_l2 takes at most ",
                 kMaxL2Ranges, " ranges, got ", ranges.size());
  PrefetchRanges r{};
  r.count = 0;
  size_t left = max_bytes;
  for (const L2Range& range : ranges) {
    LOWBIT_REQUIRE(reinterpret_cast<uintptr_t>(range.ptr) % 16 == 0,
                   "prefetch_to_l2: range pointers must be 16-byte aligned");
    const size_t bytes = std::min(range.bytes, left) / 16 * 16;
    if (bytes == 0 || range.ptr == nullptr) continue;
    r.ptr[r.count] = static_cast<const char*>(range.ptr);
    r.bytes[r.count] = bytes;
    r.first_piece[r.count + 1] = r.first_piece[r.count] + (bytes + kPieceBytes - 1) / kPieceBytes;
    ++r.count;
    left -= bytes;
  }
  if (r.count == 0 || !l2_prefetch_supported()) return;
  const uint64_t pieces = r.first_piece[r.count];
  const int ctas = static_cast<int>(std::min<uint64_t>(kMaxPrefetchCtas, pieces));
  launch_with_pdl(prefetch_to_l2_kernel, dim3(ctas), dim3(kPrefetchThreads), 0, stream, r);
}

}  // namespace lowbit::cuda
