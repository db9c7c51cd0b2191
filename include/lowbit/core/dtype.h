// Element types. The first eight are the ones lowbit computes with; the rest
// (f64 .. f8_e5m2) exist so that checkpoints holding them can be read,
// listed and copied unchanged (kernels reject them). `u4x2` is packed 4-bit data: two unsigned nibbles per byte,
// the element with the lower index in the low nibble (the convention of every
// format in lowbit/formats). Its shape counts 4-bit elements, so a [K, N] u4x2
// tensor occupies K*N/2 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lowbit {

enum class DType : uint8_t {
  f32, f16, bf16, i8, u8, i32, u32, u4x2,
  f64, i16, u16, i64, u64, boolean, f8_e4m3, f8_e5m2,  // storage only
};

inline constexpr DType kAllDTypes[] = {
    DType::f32, DType::f16, DType::bf16, DType::i8,  DType::u8,      DType::i32,     DType::u32,     DType::u4x2,
    DType::f64, DType::i16, DType::u16,  DType::i64, DType::u64, DType::boolean, DType::f8_e4m3, DType::f8_e5m2};

// Bits per element.
constexpr int dtype_bits(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: case DType::u64: return 64;
    case DType::f32: case DType::i32: case DType::u32: return 32;
    case DType::f16: case DType::bf16: case DType::i16: case DType::u16: return 16;
    case DType::i8: case DType::u8: case DType::boolean: case DType::f8_e4m3: case DType::f8_e5m2: return 8;
    case DType::u4x2: return 4;
  }
  return 0;
}

// Bytes taken by `count` elements; odd counts of u4x2 round up to a whole byte.
constexpr size_t dtype_bytes(DType t, size_t count) {
  return (count * static_cast<size_t>(dtype_bits(t)) + 7) / 8;
}

// lowbit's names: "f32", "f16", "bf16", "i8", "u8", "i32", "u32", "u4x2", "f64", "i16",
// "u16", "i64", "u64", "bool", "f8_e4m3", "f8_e5m2".
const char* dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);

// safetensors names ("F32", "F16", "BF16", "I8", "U8", "I32", "U32", "F64", "I16", "U16",
// "I64", "U64", "BOOL", "F8_E4M3", "F8_E5M2"); u4x2 has none.
const char* safetensors_dtype_name(DType t);
std::optional<DType> parse_safetensors_dtype(std::string_view name);

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<uint32_t> { static constexpr DType value = DType::u32; };

}  // namespace lowbit
