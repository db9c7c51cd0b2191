#include "lowbit/core/dtype.h"

namespace lowbit {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::u32: return "u32";
    case DType::u4x2: return "u4x2";
    case DType::f64: return "f64";
    case DType::i16: return "i16";
    case DType::u16: return "u16";
    case DType::i64: return "i64";
    case DType::u64: return "u64";
    case DType::boolean: return "bool";
    case DType::f8_e4m3: return "f8_e4m3";
    case DType::f8_e5m2: return "f8_e5m2";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
    case DType::i32: return "I32";
    case DType::u32: return "U32";
    case DType::u4x2: return nullptr;
    case DType::f64: return "F64";
    case DType::i16: return "I16";
    case DType::u16: return "U16";
    case DType::i64: return "I64";
    case DType::u64: return "U64";
    case DType::boolean: return "BOOL";
    case DType::f8_e4m3: return "F8_E4M3";
    case DType::f8_e5m2: return "F8_E5M2";
  }
  return nullptr;
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (DType t : kAllDTypes) {
    const char* n = safetensors_dtype_name(t);
    if (n != nullptr && name == n) return t;
  }
  return std::nullopt;
}

}  // namespace lowbit
