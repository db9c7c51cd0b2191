// SiLU(gate) * up in fp32, the one expression every kernel that applies it
// uses (ops::silu_mul and the W4A16 decode GEMM reading its input through
// it), so that they agree bit for bit. Device code; include from .cu files.
#pragma once

#include <cuda_runtime.h>

namespace lowbit::ops {

// Full-precision expf and an IEEE division (no fast-math): the same bits in
// every kernel compiled with the project's flags.
__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

}  // namespace lowbit::ops
