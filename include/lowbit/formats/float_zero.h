// Float zero-point layouts ("scale and min": w = s*q + m), to and from QuantizedLinear.
//
// 1. lowbit's float zero-point layout ("float_zero"):
//  - qweight : int32 [K/8, N], packed exactly as GPTQ (row 8*i + j of column n
//              in bits 4j..4j+3 of word (i, n), low nibble first).
//  - scales  : f16 [G, N].
//  - mins    : f16 or f32 [G, N] (the caller chooses), m in w = s*q + m.
//  - g_idx   : int32 [K], optional (act-order), as GPTQ.
//  - Dequantization: w[k, n] = scales[g, n]*q[k, n] + mins[g, n] in fp32 (s*q is
//    exact, so this is a single rounding, equal to fmaf).
//  - An integer-zero layer converts with m = -(s*z), exact in f32 (s is f16,
//    z <= 15). f16 mins are exact only when s*z fits 11 significant bits; when
//    rounding to f16 would change a min, packing throws unless allow_rounding.
//
// 2. GGUF / ggml Q4_1 blocks (group size 32 only, no act-order):
//  - struct BlockQ4_1 { f16 d; f16 m; uint8_t qs[16]; }, 20 bytes, packed
//    back to back with no padding, little-endian fields.
//  - Element j of a block (j = 0..31): low nibble of qs[j] for j < 16, high
//    nibble of qs[j - 16] for j >= 16. w = d*q + m.
//  - ggml stores the weight as N rows of K (ne0 = K, ne1 = N): blocks run along
//    K within output row n, so block b of row n covers rows k = 32*b .. 32*b+31
//    of our [K, N] matrix, column n. Blocks are ordered [N][K/32].
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "lowbit/core/dtype.h"
#include "lowbit/core/half.h"
#include "lowbit/formats/host_tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats {

struct FloatZeroTensors {
  HostTensor qweight;               // int32 [K/8, N]
  HostTensor scales;                // f16 [G, N]
  HostTensor mins;                  // f16 or f32 [G, N]
  std::optional<HostTensor> g_idx;  // int32 [K], present when the layer has act-order
};

struct FloatZeroOptions {
  DType mins_dtype = DType::f32;  // f32 or f16
  bool allow_rounding = false;    // f16 mins: round (changing the weights) instead of throwing
};

// Packs any layer; symmetric and integer layers get m = -(s*z). Throws
// Error(invalid_argument) when f16 mins would round and !allow_rounding
// (naming the group and column), or for a mins_dtype other than f16/f32.
FloatZeroTensors pack_float_zero(const QuantizedLinear& layer, const FloatZeroOptions& options = {});
// Reads the tensors into a ZeroPoint::float_min layer (mins widened to f32).
// A trivial g_idx is dropped. Error(format) on inconsistent shapes/dtypes.
QuantizedLinear unpack_float_zero(const FloatZeroTensors& tensors, int group_size);

struct BlockQ4_1 {
  f16 d;           // scale
  f16 m;           // min
  uint8_t qs[16];  // 32 codes, see the top of this file
};
static_assert(sizeof(BlockQ4_1) == 20, "GGUF Q4_1 blocks are 20 bytes");
static_assert(std::is_trivially_copyable_v<BlockQ4_1> && std::is_standard_layout_v<BlockQ4_1>);

inline constexpr int kQ4_1BlockSize = 32;

// Packs a group-size-32 layer without act-order into blocks [N][K/32].
// Integer/symmetric layers get m = -(s*z); mins (given or converted) must be
// exact in f16 unless allow_rounding. Error(invalid_argument) otherwise.
std::vector<BlockQ4_1> pack_q4_1(const QuantizedLinear& layer, bool allow_rounding = false);
// blocks [N][K/32] -> a float_min layer with group_size 32.
QuantizedLinear unpack_q4_1(std::span<const BlockQ4_1> blocks, int64_t K, int64_t N);

}  // namespace lowbit::formats
