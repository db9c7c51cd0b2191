// lowbit's tiled W4A16 weight layout: what w4a16_prepare() uploads and the
// CUDA kernels read. Built for one job: a warp's one 16-byte load per lane
// yields, after a few bit operations, the B operands of eight
// mma.m16n8k16 instructions (64 rows of K x 16 columns of N), so weights go
// from HBM to tensor cores without shuffles or per-element conversion.
//
// Layout facts (K_pad = K rounded up to 64, N_pad = N rounded up to 64,
// I = K_pad / 64 k-iterations, G_pad = groups of K_pad):
//  - qweight u32 [I][N_pad/64][4 warps][32 lanes][4 words]: iteration-major,
//    so the CTAs working on different blocks at the same k read neighbouring
//    2 KB tiles rather than streams a fixed stride apart (on the H100 the two
//    orders measured the same; this one cannot camp on memory channels). Block nb covers
//    columns nb*64 .. nb*64+63; warp w of it columns n0 = nb*64 + 16w ..
//    n0+15; iteration i rows k0 = 64i .. 64i+63. Lane l (g = l/4, t = l%4),
//    word j (k-step: rows k0+16j .. k0+16j+15) holds eight codes in nibble
//    slots s = 0..7 (bits 4s..4s+3):
//        slot 0/4: rows k0+16j+2t / +1      column n0+g      (mma B reg 0, n-subtile 0)
//        slot 1/5: rows k0+16j+2t+8 / +9    column n0+g      (B reg 1, n-subtile 0)
//        slot 2/6: rows k0+16j+2t / +1      column n0+8+g    (B reg 0, n-subtile 1)
//        slot 3/7: rows k0+16j+2t+8 / +9    column n0+8+g    (B reg 1, n-subtile 1)
//    so slots (p, p+4) form one register pair: masking a word with
//    0x000F000F (after a shift) puts both codes of a pair into the two halves
//    of a 32-bit register, where an OR with the exponent of 1024 (fp16) or 128
//    (bf16) turns each into an exact float with no conversion instruction.
//  - scale_zero u32 [G_pad][N_pad]: per group and column a pair of 16-bit
//    floats in the activation dtype (fp16 or bf16): low half the scale s, high
//    half z (integer zero points, symmetric stores 8) or m (float_min), so one
//    4-byte load gives a column's whole dequantization: w = (q - z)*s or q*s + m.
//  - perm i32 [K] for act-order layers (rows sorted by group, see
//    formats::sort_rows_by_group); the kernel reads activation column perm[i]
//    for weight row i.
//  - Padding rows/columns hold code 0 with scale 0, so they contribute exact
//    zeros; the kernel also zero-fills activations past K.
// bf16 layouts round scales (and float_min offsets) to bf16; fp16 layouts store
// them exactly (float_min offsets are rounded to fp16 unless allow_rounding is
// false, in which case an offset that is not an fp16 value is an error).
#pragma once

#include <cstdint>

#include "lowbit/core/dtype.h"
#include "lowbit/formats/layout_registry.h"

namespace lowbit {

inline constexpr int64_t kW4A16TileK = 64;   // rows of K per k-iteration
inline constexpr int64_t kW4A16TileN = 64;   // columns per block (4 warps x 16)
inline constexpr int kW4A16WarpsPerBlock = 4;

inline int64_t w4a16_padded_k(int64_t K) { return (K + kW4A16TileK - 1) / kW4A16TileK * kW4A16TileK; }
inline int64_t w4a16_padded_n(int64_t N) { return (N + kW4A16TileN - 1) / kW4A16TileN * kW4A16TileN; }

// Layout names in the formats registry: "w4a16_tiled_f16", "w4a16_tiled_bf16".
const char* w4a16_layout_name(DType act_dtype);

// Registers the two tiled layouts in the formats registry (idempotent; the
// functions below call it).
void register_w4a16_layouts();

// Packs a layer into the tiled layout for activations of `act_dtype` (f16 or
// bf16). Tensors: "qweight", "scale_zero" and, for act-order, "perm".
formats::PackedLinear pack_w4a16_tiled(const formats::QuantizedLinear& layer, DType act_dtype,
                                       bool allow_rounding = true);

// The canonical layer back (padding removed, act-order rows restored). Scales
// and offsets are the stored 16-bit values.
formats::QuantizedLinear unpack_w4a16_tiled(const formats::PackedLinear& packed);

}  // namespace lowbit
