// Random test and benchmark data generated on the device (a counter-based
// hash, so the same seed gives the same data on any GPU and launch shape).
// Benchmarks never run on zeros: they hide unwritten outputs and can make
// kernels look faster than on real data.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace lowbit::cuda {

// Fills `bytes` bytes at device address `dst` (any alignment) with random bits.
void fill_random_bytes(void* dst, size_t bytes, uint64_t seed, cudaStream_t stream = nullptr);

// Fills `count` binary16 values at device address `dst` (2-byte aligned) with
// random signs and magnitudes uniform in [scale/16, scale]: never zero.
void fill_random_f16(void* dst, size_t count, uint64_t seed, float scale = 1.0f,
                     cudaStream_t stream = nullptr);

}  // namespace lowbit::cuda
