// CPU reference dequantization of a QuantizedLinear into a dense [K, N] matrix.
//
// Layout facts this header relies on:
//  - the output is W[K, N]: element (k, n) is QuantizedLinear::dequant(k, n),
//    i.e. s*q + m in fp32 with s = scales[g, n], g = group_of(k) (g_idx honoured),
//    bit for bit (see quantized_linear.h);
//  - f16/bf16 outputs are that fp32 value rounded once (to nearest even).
#pragma once

#include <cstdint>

#include "lowbit/core/tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats {

// out_kn: K*N floats, row-major [K, N]. Validates the layer; multithreaded.
void dequantize_ref(const QuantizedLinear& layer, float* out_kn);
// out: a 2-D CPU view [K, N] of f32, f16 or bf16, any strides. Multithreaded.
// Error(invalid_argument) naming 'out' for a wrong shape, dtype or device.
void dequantize_ref(const QuantizedLinear& layer, const TensorView& out);

// Dequantizes the tile rows [k0, k1) x columns [n0, n1) into
// out[(k - k0)*ld + (n - n0)], single-threaded, no validation (the building
// block of the functions above and of w4a16_gemm_ref).
void dequantize_tile_ref(const QuantizedLinear& layer, int64_t k0, int64_t k1, int64_t n0,
                         int64_t n1, float* out, int64_t ld);

}  // namespace lowbit::formats
