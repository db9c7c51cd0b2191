// Opting a kernel in to more than 48 KB of dynamic shared memory.
//
// cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, ...)
// acts on the kernel as loaded on the *current device*: a process that
// configures a kernel once and then launches it on a second GPU gets a
// launch failure there. A `static bool configured` per kernel (what this
// project did first) has exactly that bug, and races between host threads.
// This cache is keyed by (device, kernel) and guarded by a mutex.
#pragma once

#include <cuda_runtime.h>

namespace lowbit::cuda {

// Makes sure `kernel` may be launched on the current device with `bytes` of
// dynamic shared memory: raises its limit there when it was lower (never
// lowers it, so callers with different sizes for one kernel do not undo each
// other). Throws Error(cuda) when the runtime refuses, e.g. for more than the
// device's opt-in maximum.
void ensure_dynamic_smem(const void* kernel, int bytes);

template <typename Kernel>
void ensure_dynamic_smem(Kernel* kernel, int bytes) {
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace lowbit::cuda
