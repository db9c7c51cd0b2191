// CPU matrix products over the engine's weight formats (weights.h), the
// hot loop of CPU decode: y[M][N] = x[M][K] W^T for W [N][K].
//
// Decode is memory bound (every weight byte is read once per token), so the
// kernels stream each row of W once per tile of up to 4 rows of x and keep
// the unpacking in registers:
//  - w4: 16 code bytes -> 32 floats (low nibbles are columns 0..15, high
//    nibbles 16..31), multiplied into a per-group accumulator; the group's
//    min is applied once per group through the precomputed sum of x over the
//    group: sum_k (s q_k + m) x_k = s (sum_k q_k x_k) + m (sum_k x_k).
//  - q8: 32 int8 codes -> floats, one scale per block.
//  - f16: F16C conversion; f32: plain FMA.
// An AVX2+FMA+F16C version is chosen at run time (__builtin_cpu_supports, the
// functions carry __attribute__((target)), so the build needs no -march);
// a portable scalar version runs elsewhere. Both accumulate in fp32 in the
// same grouping, so they agree to fp32 rounding (not bit for bit: FMA).
#pragma once

#include <cstdint>

#include "lowbit/engine/thread_pool.h"
#include "lowbit/engine/weights.h"

namespace lowbit::engine::cpu {

enum class Isa : uint8_t { portable, avx2 };
const char* isa_name(Isa isa);  // "portable", "avx2"
// What this machine supports (avx2 needs AVX2, FMA and F16C).
Isa best_isa();
// The kernels in use: best_isa() unless LOWBIT_ENGINE_ISA=portable or set_isa().
Isa active_isa();
// For tests and benchmarks; asking for avx2 where it is unsupported throws
// Error(unsupported).
void set_isa(Isa isa);

// y[m][n] = sum_k x[m][k] W[n][k], m < M, n < w.rows, k < w.cols; x rows are
// w.cols floats apart, y rows w.rows floats apart. pool may be null (serial).
void matmul(const WeightMatrix& w, const float* x, int64_t M, float* y, ThreadPool* pool);

// The reference: each row dequantized exactly (dequant_row), sums in double.
void matmul_ref(const WeightMatrix& w, const float* x, int64_t M, float* y);

}  // namespace lowbit::engine::cpu
