// AWQ checkpoint tensors (AutoAWQ "GEMM" version, 4-bit), to and from QuantizedLinear.
//
// Layout facts this header relies on (AutoAWQ WQLinear_GEMM.from_linear):
//  - qweight : int32 [K, N/8]. Packed along N: nibble slot j (bits 4j..4j+3)
//              of word (k, i) holds column n = 8*i + kAwqPackOrder[j] of row k.
//              Codes 0..7 across N in one row give 0x75316420.
//  - qzeros  : int32 [G, N/8], the zero points z packed the same way. AWQ
//              stores z itself (no "minus one" as GPTQ v1).
//  - scales  : f16 [G, N].
//  - No g_idx: rows are in group order (row k is in group k / group_size).
//  - Dequantization: w[k, n] = scales[g, n] * (q[k, n] - z[g, n]), g = k / group_size.
//  - N must be a multiple of 8, K of 8 and of group_size.
//
// Why the interleave [0, 2, 4, 6, 1, 3, 5, 7]: AWQ's GEMM kernel dequantizes a
// word with the fp16 "magic number" trick: it masks the word with 0x000f000f
// and 0x00f000f0, and the word shifted right by 8 with the same two masks,
// which yields the nibble slots as pairs (0, 4), (1, 5), (2, 6), (3, 7), each
// pair landing in the two halves of one half2 register. Storing columns
// 0, 2, 4, 6 in slots 0..3 and 1, 3, 5, 7 in slots 4..7 makes those pairs the
// neighbouring columns (0, 1), (2, 3), (4, 5), (6, 7), in order.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "lowbit/core/tensor.h"
#include "lowbit/formats/host_tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats {

// Nibble slot j of a word holds column 8*i + kAwqPackOrder[j].
inline constexpr std::array<int, 8> kAwqPackOrder = {0, 2, 4, 6, 1, 3, 5, 7};

// codes [K, N] row-major (0..15) -> int32 [K, N/8].
HostTensor pack_awq_qweight(std::span<const uint8_t> codes, int64_t K, int64_t N);
// int32 (or u32) [K, N/8] -> codes [K, N] row-major.
std::vector<uint8_t> unpack_awq_qweight(const TensorView& qweight);
// z [G, N] row-major (0..15) -> int32 [G, N/8], same order as qweight.
HostTensor pack_awq_qzeros(std::span<const uint8_t> zeros, int64_t G, int64_t N);
// int32 (or u32) [G, N/8] -> z [G, N].
std::vector<uint8_t> unpack_awq_qzeros(const TensorView& qzeros);

struct AwqTensors {
  HostTensor qweight;  // int32 [K, N/8]
  HostTensor qzeros;   // int32 [G, N/8]
  HostTensor scales;   // f16 [G, N]
};

// Packs a symmetric (written as z = 8) or integer layer. Throws
// Error(invalid_argument) for float_min (convert first) and for a layer with a
// non-trivial g_idx (act-order): AWQ has no g_idx; reorder the rows with
// sort_rows_by_group (lowbit/formats/convert.h) and permute x accordingly.
AwqTensors pack_awq(const QuantizedLinear& layer);
// Reads AWQ tensors into a ZeroPoint::integer layer (to_zero_point converts to
// symmetric when every z is 8). Error(format) on inconsistent shapes/dtypes.
QuantizedLinear unpack_awq(const AwqTensors& tensors, int group_size);

}  // namespace lowbit::formats
