// Device-scope counters and flags between the CTAs of one grid: the
// split-K semaphores of the W4A16 kernels and the decode attention's merge
// by the last CTA of a row. Device code; include from .cu files.
#pragma once

namespace lowbit::cuda {

// The split-K count. Thread 0's add is a release (after the barrier that
// follows every thread's partial stores, it publishes them device-wide) and
// an acquire (with the barrier after it, the last CTA's loads of the other
// partials come after every CTA's stores), as CUTLASS's split-K semaphore
// does. It replaces a __threadfence by every thread before the count and
// another after it in the last CTA: fences on the critical path of every
// K-split call (the count and the last CTA's sum took ~2.5-3.5 us of a
// decode step's GEMM, measured with per-CTA timer stamps). Used by the gemv
// kernel's split-K paths, the wgmma kernel's tail tiles and the decode
// attention's merge in the last CTA.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// The wgmma kernel's stream-K flags: a CTA that stored the partial of a
// piece of a tile publishes it with a release add (thread 0, after the
// barrier that follows every thread's stores); the CTA that sums the tile
// polls with acquire loads (thread 0, then a barrier before every thread
// reads the partials).
__device__ __forceinline__ void red_add_release_gpu(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

}  // namespace lowbit::cuda
