#include "lowbit/cuda/random.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

// splitmix64's finaliser on (seed, index): independent-looking 64-bit values.
__host__ __device__ inline uint64_t mix(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr int kThreads = 256;

unsigned grid_for(size_t items) {
  return static_cast<unsigned>(std::clamp<size_t>((items + kThreads - 1) / kThreads, 1, 8192));
}

__global__ void fill_words_kernel(uint32_t* dst, size_t words, uint64_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += stride)
    dst[i] = static_cast<uint32_t>(mix(seed, i));
}

__global__ void fill_bytes_kernel(uint8_t* dst, size_t bytes, uint64_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += stride)
    dst[i] = static_cast<uint8_t>(mix(seed, i));
}

__global__ void fill_f16_kernel(__half* dst, size_t count, uint64_t seed, float scale) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const uint64_t h = mix(seed, i);
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float magnitude = scale * (0.0625f + 0.9375f * u);
    dst[i] = __float2half_rn((h & 1) ? -magnitude : magnitude);
  }
}

}  // namespace

void fill_random_bytes(void* dst, size_t bytes, uint64_t seed, cudaStream_t stream) {
  if (bytes == 0) return;
  LOWBIT_CHECK_ARG(dst != nullptr, "dst", "nullptr", "a device address");
  if (reinterpret_cast<uintptr_t>(dst) % 4 == 0) {
    const size_t words = bytes / 4;
    if (words > 0) {
      fill_words_kernel<<<grid_for(words), kThreads, 0, stream>>>(static_cast<uint32_t*>(dst), words, seed);
      LOWBIT_CUDA_CHECK_LAUNCH();
    }
    const size_t tail = bytes % 4;
    if (tail > 0) {
      fill_bytes_kernel<<<1, kThreads, 0, stream>>>(static_cast<uint8_t*>(dst) + words * 4, tail,
                                                  mix(seed, words));
      LOWBIT_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  fill_bytes_kernel<<<grid_for(bytes), kThreads, 0, stream>>>(static_cast<uint8_t*>(dst), bytes, seed);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void fill_random_f16(void* dst, size_t count, uint64_t seed, float scale, cudaStream_t stream) {
  if (count == 0) return;
  LOWBIT_CHECK_ARG(dst != nullptr && reinterpret_cast<uintptr_t>(dst) % 2 == 0, "dst", dst,
                   "a 2-byte aligned device address");
  LOWBIT_CHECK_ARG(scale > 0.0f && scale <= 65504.0f, "scale", scale, "a value in (0, 65504]");
  fill_f16_kernel<<<grid_for(count), kThreads, 0, stream>>>(static_cast<__half*>(dst), count, seed, scale);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::cuda
