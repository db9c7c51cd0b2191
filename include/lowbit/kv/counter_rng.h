// Counter-based random numbers for the KV-cache rotations: the same seed gives
// the same numbers on any CPU, on a GPU, in any thread order.
//
// Facts this header relies on (and a device port must keep):
//  - random_u64(seed, n) is the n-th output (n = 0, 1, ...) of a splitmix64
//    generator whose state starts at `seed`: state_n = seed + (n + 1) * gamma
//    (mod 2^64), output = mix(state_n). splitmix64's state advances by a
//    constant, so element n is a pure function of (seed, n): a CUDA thread
//    computes element n without generating 0..n-1, which a stateful generator
//    (mt19937, torch's Philox offsets) does not allow without extra plumbing.
//  - random_u64 and random_sign are integer-only: bit-identical everywhere.
//  - random_normal uses double log, sqrt and cos (Box-Muller). CUDA's double
//    versions are within 2 ulp of the correctly rounded result, as glibc's
//    are, so a device-generated Gaussian can differ from ours in the last bits
//    of a double, far below the fp32 rounding of the matrices built from it.
//    The Haar rotation is built on the host (QR) and uploaded, so devices never
//    need to regenerate it; the Hadamard signs are integer-only.
#pragma once

#include <cstdint>

namespace lowbit::kv {

// 2^64 / golden ratio, splitmix64's state increment.
inline constexpr uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;

// splitmix64's output function (a bijective 64-bit mixer).
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Output n of the splitmix64 stream started at `seed`.
constexpr uint64_t random_u64(uint64_t seed, uint64_t n) {
  return splitmix64_mix(seed + (n + 1) * kSplitmixGamma);
}

// Uniform on (0, 1] with 53 random bits: never 0, so log() below is finite.
inline double random_uniform_open0(uint64_t seed, uint64_t n) {
  return static_cast<double>((random_u64(seed, n) >> 11) + 1) * 0x1p-53;
}

// Standard normal number n of stream `seed`: Box-Muller on the uniforms 2n and
// 2n+1, keeping only the cosine branch so that number n needs no neighbour.
double random_normal(uint64_t seed, uint64_t n);

// +1 or -1 from the top bit of output n (the best-mixed bit of splitmix64).
constexpr float random_sign(uint64_t seed, uint64_t n) {
  return (random_u64(seed, n) >> 63) != 0 ? -1.0f : 1.0f;
}

}  // namespace lowbit::kv
