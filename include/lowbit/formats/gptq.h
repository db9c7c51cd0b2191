// GPTQ checkpoint tensors (AutoGPTQ / GPTQModel, 4-bit), to and from QuantizedLinear.
//
// Layout facts this header relies on (AutoGPTQ qlinear `pack`, 4 bits):
//  - qweight : int32 [K/8, N]. Word (i, n) holds rows k = 8*i + j, j = 0..7,
//              code of row 8*i + j in bits 4j..4j+3 (low nibble first, no
//              interleave). Codes 0..7 down K in one column give 0x76543210.
//  - qzeros  : int32 [G, N/8]. Word (g, i) holds columns n = 8*i + j in bits
//              4j..4j+3, same order. What is stored depends on the convention:
//                GptqZeros::v1 (checkpoint_format "gptq", AutoGPTQ):   stored = z - 1
//                GptqZeros::v2 (checkpoint_format "gptq_v2", GPTQModel): stored = z
//              Symmetric layers have z = 8 everywhere: v1 words are 0x77777777,
//              v2 words 0x88888888.
//  - scales  : f16 [G, N].
//  - g_idx   : int32 [K], the group of each row (act-order); AutoGPTQ writes
//              k / group_size when act-order is off.
//  - Dequantization: w[k, n] = scales[g, n] * (q[k, n] - z[g, n]), g = g_idx[k].
//  - Words are little-endian 32-bit integers; values with the top bit set
//    (e.g. 0x88888888) are negative as int32 — only the bits matter.
//  - N must be a multiple of 8 (qzeros packs along N) and K a multiple of 8.
//
// v1 cannot store z = 0: z - 1 wraps to 0xF, which every v1 reader turns into
// z = 16. Packing such a layer as v1 throws (use v2, or quantize with
// RtnOptions::min_zero = 1), and reading a v1 nibble 0xF throws too, since
// z = 16 is outside the canonical 0..15.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "lowbit/core/tensor.h"
#include "lowbit/formats/host_tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats {

enum class GptqZeros : uint8_t {
  v1,  // stored = z - 1, as AutoGPTQ writes (checkpoint_format "gptq")
  v2,  // stored = z ("gptq_v2")
};

const char* gptq_zeros_name(GptqZeros zeros);  // "v1", "v2"

// codes [K, N] row-major (0..15) -> int32 [K/8, N].
HostTensor pack_gptq_qweight(std::span<const uint8_t> codes, int64_t K, int64_t N);
// int32 (or u32) [K/8, N] -> codes [K, N] row-major. K = 8 * rows.
std::vector<uint8_t> unpack_gptq_qweight(const TensorView& qweight);

// zero points z [G, N] row-major (0..15) -> int32 [G, N/8], applying the
// convention's offset. v1 with some z = 0 throws Error(invalid_argument)
// naming the group and column.
HostTensor pack_gptq_qzeros(std::span<const uint8_t> zeros, int64_t G, int64_t N,
                            GptqZeros convention);
// int32 (or u32) [G, N/8] -> z [G, N] row-major (0..15). A v1 nibble 0xF
// (z = 16) throws Error(format) naming the group and column.
std::vector<uint8_t> unpack_gptq_qzeros(const TensorView& qzeros, GptqZeros convention);

struct GptqTensors {
  HostTensor qweight;               // int32 [K/8, N]
  HostTensor qzeros;                // int32 [G, N/8]
  HostTensor scales;                // f16 [G, N]
  std::optional<HostTensor> g_idx;  // int32 [K]
};

// Packs a symmetric or integer layer (float_min: convert first with
// to_zero_point in lowbit/formats/convert.h). Always writes g_idx (the
// trivial k / group_size one when the layer has none), as AutoGPTQ does.
GptqTensors pack_gptq(const QuantizedLinear& layer, GptqZeros convention);

// Reads GPTQ tensors. `symmetric` comes from the checkpoint's config
// (quantize_config "sym"): then every zero must be 8 (else Error(format)) and
// the result is ZeroPoint::symmetric; otherwise ZeroPoint::integer. A g_idx
// equal to the trivial k / group_size is dropped (canonical form: empty).
// Shapes and dtypes are checked against each other (Error(format) naming the tensor).
QuantizedLinear unpack_gptq(const GptqTensors& tensors, GptqZeros convention, bool symmetric,
                            int group_size);

}  // namespace lowbit::formats
