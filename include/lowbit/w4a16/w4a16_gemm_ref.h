// CPU reference W4A16 GEMM: y[M, N] = x[M, K] * dequant(W)[K, N].
//
// THE ORACLE for every GPU W4A16 test: a GPU kernel is correct when it matches
// this function within the tolerances in tests/tolerances.h. Keep it simple
// and exact in its definition rather than clever.
//
// Layout facts this function relies on:
//  - x is a 2-D CPU view [M, K] of f16, bf16 or f32 with any strides (a row
//    stride larger than K is fine), y a 2-D CPU view [M, N] of f32, f16 or
//    bf16 with any strides; x and y must not overlap.
//  - W is the canonical QuantizedLinear (lowbit/formats/quantized_linear.h):
//    codes [K, N], scales/zeros/mins [G, N], optional act-order g_idx [K].
//
// Arithmetic (what "matching" means):
//  - every weight is dequantized to fp32 exactly as QuantizedLinear::dequant()
//    gives it (s*q + m, exact for integer/symmetric zero points);
//  - every activation is widened to fp32 exactly;
//  - y[m, n] = sum over k = 0..K-1 in increasing order of x[m, k]*w[k, n],
//    accumulated in one fp32 accumulator starting at 0 (each step a product
//    rounded to fp32 then an fp32 add, or a fused multiply-add when the
//    compiler contracts them: both are within the tolerances);
//  - the fp32 sum is rounded once to y's dtype (nearest even).
// The result does not depend on the number of threads.
//
// Cost: dequantizes each K x 64 tile of W once and reuses it for all M rows;
// multithreaded over N tiles.
#pragma once

#include "lowbit/core/tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit {

// Throws Error(invalid_argument) naming x, w or y and the shapes on a shape
// mismatch, a wrong rank, dtype or device, and whatever w.validate() throws.
void w4a16_gemm_ref(const TensorView& x, const formats::QuantizedLinear& w, const TensorView& y);

}  // namespace lowbit
