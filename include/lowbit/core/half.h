// IEEE binary16 and bfloat16 storage types with exact conversions on the CPU.
// They are plain 16-bit containers (no arithmetic): CPU references convert to
// float, compute in float/double, and round back once, which is what a GPU
// kernel that accumulates in fp32 does too.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace lowbit {

struct f16 {
  uint16_t bits = 0;
  static constexpr f16 from_bits(uint16_t b) { f16 h; h.bits = b; return h; }
};
struct bf16 {
  uint16_t bits = 0;
  static constexpr bf16 from_bits(uint16_t b) { bf16 h; h.bits = b; return h; }
};

constexpr bool operator==(f16 a, f16 b) { return a.bits == b.bits; }
constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }

// binary16 -> binary32, exact for every input (subnormals, inf, NaN payload kept).
inline float f16_to_float(f16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1Fu;
  uint32_t mant = h.bits & 0x3FFu;
  uint32_t out;
  if (exp == 0x1F) {
    out = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    out = sign;
  } else {  // subnormal: normalise the mantissa
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
    out = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(out);
}

// binary32 -> binary16, round to nearest even, overflow to inf, NaN stays NaN.
inline f16 float_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx >= 0x7F800000u) {  // inf or NaN
    const uint16_t nan_bit = absx > 0x7F800000u ? 0x200u : 0u;
    return f16::from_bits(sign | 0x7C00u | nan_bit | static_cast<uint16_t>((absx >> 13) & 0x3FFu));
  }
  if (absx >= 0x477FF000u) return f16::from_bits(sign | 0x7C00u);  // rounds to >= 65520
  if (absx < 0x38800000u) {  // result is subnormal or zero: align to 2^-24 units
    if (absx < 0x33000000u) return f16::from_bits(sign);  // < 2^-25 rounds to 0
    const uint32_t exp = absx >> 23;
    const uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24 (value = mant * 2^(exp-150))
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return f16::from_bits(sign | static_cast<uint16_t>(q));
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xFFFu + ((r >> 13) & 1u);     // round to nearest even on the 13 dropped bits
  return f16::from_bits(sign | static_cast<uint16_t>(r >> 13));
}

inline float bf16_to_float(bf16 h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16);
}

// binary32 -> bfloat16, round to nearest even, NaN stays (quiet) NaN.
inline bf16 float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return bf16::from_bits(static_cast<uint16_t>((x >> 16) | 0x40u));
  const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return bf16::from_bits(static_cast<uint16_t>(rounded >> 16));
}

inline float to_float(float v) { return v; }
inline float to_float(f16 v) { return f16_to_float(v); }
inline float to_float(bf16 v) { return bf16_to_float(v); }

}  // namespace lowbit
