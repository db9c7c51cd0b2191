// Programmatic dependent launch (PDL, sm_90 and later), shared by every
// kernel of a decode step.
//
// Why: a batch-1 decode step of a 40-layer model is ~500 kernel launches, and
// even replayed from a CUDA graph each one leaves a gap of a few microseconds
// between the end of one kernel and the first instructions of the next (grid
// launch, CTA rasterization, the first loads' latency). With PDL the next
// kernel is launched while the previous one drains: its CTAs start, do what
// does not depend on the previous kernel (a GEMV issues its first weight
// loads), and block in pdl_wait() until the previous grid has completed and
// its memory is visible.
//
// Rules for a kernel launched with launch_with_pdl:
//   - every CTA calls pdl_wait() before it reads anything an earlier kernel
//     of the stream wrote, and before it writes anything an earlier kernel
//     may still read (and before any early return: a grid whose CTAs all
//     skipped the wait could complete before its predecessor, breaking the
//     chain for the kernels after it);
//   - pdl_launch_dependents() lets the next kernel start early; without it the
//     next kernel starts when this one exits.
// Kernels launched without the attribute keep plain stream order, so a chain
// may mix both (cuBLAS calls are plain). LOWBIT_PDL=0 in the environment
// launches everything plainly (to measure what PDL gains).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "lowbit/cuda/check.h"

namespace lowbit::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// Whether launches on the current device use PDL: compute capability 9.0 or
// later, and LOWBIT_PDL is not "0". Cached per device.
bool pdl_enabled();

// A span that a kernel reads once and no kernel after it reads soon (a
// decode step's 4-bit weights, a KV cache pool): given to the launch as an L2
// access-policy window whose accesses are "streaming", the lines L2 evicts
// first. Why: a decode step streams far more bytes than L2 holds (a
// Qwen3-14B layer's weights are ~170 MB, L2 50 MB). With normal eviction the
// stream pushes out what the next kernels read again (the activations, the
// split-K partials and counters, the KV pages just appended: our reading of
// the 1.8% a decode step gained, docs/engine.md v24), and a line it brings in
// may first have to write back a dirty one. bytes == 0: no window.
struct L2StreamSpan {
  const void* base = nullptr;
  size_t bytes = 0;
};

// The window for a span: streaming hits and misses, clipped to the device's
// largest window (cudaDevAttrMaxAccessPolicyWindowSize). num_bytes is 0 (no
// window) for an empty span, on a device without windows, or when the
// environment sets LOWBIT_L2_STREAMING=0 (to measure without, as LOWBIT_PDL=0
// does for programmatic dependent launch).
cudaAccessPolicyWindow l2_streaming_window(L2StreamSpan span);

// Fills `attribute` with the span's window and returns true, or returns false
// where there is no window to give (see l2_streaming_window).
inline bool l2_streaming_attribute(L2StreamSpan span, cudaLaunchAttribute& attribute) {
  const cudaAccessPolicyWindow window = l2_streaming_window(span);
  if (window.num_bytes == 0) return false;
  attribute.id = cudaLaunchAttributeAccessPolicyWindow;
  attribute.val.accessPolicyWindow = window;
  return true;
}

// cluster_x > 0: the grid runs in clusters of cluster_x x 1 x 1 CTAs (sm_90;
// grid.x a multiple of cluster_x). stream_span: an L2 streaming window over
// it (l2_streaming_window), or none.
template <typename... Params, typename... Args>
void launch_with_pdl_in_clusters(void (*kernel)(Params...), int cluster_x, L2StreamSpan stream_span,
                                 dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[3]{};
  unsigned n = 0;
  if (l2_streaming_attribute(stream_span, attributes[n])) ++n;
  if (pdl_enabled()) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 0) {
    attributes[n].id = cudaLaunchAttributeClusterDimension;
    attributes[n].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attributes[n].val.clusterDim.y = 1;
    attributes[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = n > 0 ? attributes : nullptr;
  config.numAttrs = n;
  LOWBIT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <typename... Params, typename... Args>
void launch_with_pdl_in_clusters(void (*kernel)(Params...), int cluster_x, dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, Args&&... args) {
  launch_with_pdl_in_clusters(kernel, cluster_x, L2StreamSpan{}, grid, block, smem, stream,
                              std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
void launch_with_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     Args&&... args) {
  launch_with_pdl_in_clusters(kernel, 0, L2StreamSpan{}, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace lowbit::cuda
