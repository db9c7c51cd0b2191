// Reading GGUF files (the llama.cpp / ggml model container), versions 2 and 3.
//
// Format facts this code relies on (all integers little-endian):
//   * header: magic "GGUF" (bytes 47 47 55 46), uint32 version (2 or 3),
//     uint64 tensor_count, uint64 metadata_kv_count;
//   * metadata_kv_count entries: a string key, a uint32 value type, the value.
//     A string is a uint64 byte length followed by the bytes (UTF-8, no NUL).
//     Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (one
//     byte, 0 or 1), 8 string, 9 array (uint32 element type, uint64 count, the
//     elements; arrays of arrays are allowed by the format, lowbit rejects
//     them), 10 u64, 11 i64, 12 f64;
//   * tensor_count tensor infos: string name, uint32 n_dims (1..4), n_dims
//     uint64 extents ne[0..n_dims) with ne[0] the innermost (contiguous) one,
//     uint32 ggml type, uint64 offset relative to the start of the data section;
//   * the data section starts at the first multiple of `alignment` after the
//     tensor infos; alignment is the metadata key general.alignment (a uint32
//     power of two), 32 when absent. Every tensor offset is a multiple of it.
//   * A tensor of type T with ne[0] = n is stored as rows of n elements, each
//     row being n / block_size(T) blocks of type_size(T) bytes; ne[0] must be a
//     multiple of the block size.
//
// A ggml weight matrix of a linear layer y = x W^T has ne = [in, out]: ne[0]
// (innermost) runs over the input features, ne[1] over the outputs, i.e. it is
// row-major [out][in], the PyTorch nn.Linear layout. See to_quantized_linear()
// for how that maps onto lowbit's [K = in, N = out].
//
// Errors are lowbit::Error: ErrorKind::io when the file cannot be opened or
// mapped, ErrorKind::format for a malformed file (the message names the file,
// the key or tensor and the bad value), ErrorKind::unsupported for a valid file
// using something lowbit cannot read (a type with no dequantizer, GGUF
// version 1, arrays of arrays), ErrorKind::invalid_argument for a metadata getter called
// on a missing key or a value of another type (the message names the key, the
// requested type and the actual type).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/formats/quantized_linear.h"

namespace lowbit::gguf {

// The ggml tensor type ids (ggml.h, enum ggml_type). Ids 4, 5 (removed Q4_2,
// Q4_3) and 31..33, 36..38 (removed Q4_0_4_4 etc.) are not valid types.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

// Facts about one type: elements per block and bytes per block.
struct GgmlTypeTraits {
  const char* name;    // "Q4_1", as ggml spells it
  int64_t block_size;  // elements per block (1 for F32, F16, BF16, I*)
  int64_t type_size;   // bytes per block
};

// nullptr for an id that is not a ggml type.
const GgmlTypeTraits* ggml_type_traits(uint32_t id);
// "Q4_1"; "type#<id>" for an unknown id.
std::string ggml_type_name(GgmlType type);
// True when dequantize_to_f32 handles the type: F32, F16, BF16, F64, I8,
// I16, I32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
bool can_dequantize(GgmlType type);

// The type of a metadata value (GGUF's gguf_type).
enum class ValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
// "u32", "string", "array[string]" (the last with element_type).
std::string value_type_name(ValueType type, std::optional<ValueType> element_type = std::nullopt);

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] = ne[0], the innermost extent; 1..4 dims
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;  // bytes from the start of the data section (a multiple of the alignment)
  uint64_t nbytes = 0;  // numel / block_size * type_size

  int64_t numel() const;  // product of shape
  // Rows of ne[0] elements: numel() / shape[0].
  int64_t num_rows() const;
  // "blk.0.attn_q.weight Q4_1 [576, 576]" (ggml order).
  std::string describe() const;
};

class GgufFile {
 public:
  // Memory-maps `path` and parses and validates the header, metadata and
  // tensor infos (the tensor data is paged in when first touched). Checks:
  // magic, version 2 or 3, counts and string/array lengths that fit in the
  // remaining bytes (so nothing absurd is allocated), value types, unique keys
  // and tensor names, n_dims 1..4, positive extents with no overflow, known
  // tensor types, ne[0] a multiple of the block size, offsets aligned, every
  // tensor inside the file, no two tensors overlapping.
  static GgufFile open(const std::filesystem::path& path);
  // The same checks on a file held in memory (copied into the object); `name`
  // stands for the path in messages. For tests and tools.
  static GgufFile from_bytes(std::span<const std::byte> bytes, std::string name = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  uint64_t file_size() const;

  // ---- metadata --------------------------------------------------------------
  // Keys in file order.
  const std::vector<std::string>& metadata_keys() const { return keys_; }
  bool has(std::string_view key) const;
  // The type of a value (nullopt when the key is absent); for arrays also the
  // element type and count.
  std::optional<ValueType> type_of(std::string_view key) const;
  std::optional<ValueType> array_type_of(std::string_view key) const;
  uint64_t array_size(std::string_view key) const;  // Error when not an array

  // Typed getters. Missing key or other type: Error(invalid_argument), e.g.
  // "GGUF file 'm.gguf': metadata key 'llama.block_count' is a string, expected an integer".
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;   // any integer type (u64 above INT64_MAX fails)
  double get_float(std::string_view key) const;  // f32 or f64
  bool get_bool(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;  // elements of any integer type
  std::vector<float> get_float_array(std::string_view key) const;  // elements f32 (or f64, rounded)
  // Same, but the default when the key is absent (a present key of the wrong type still fails).
  std::string get_string_or(std::string_view key, std::string_view fallback) const;
  int64_t get_int_or(std::string_view key, int64_t fallback) const;
  double get_float_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;

  // general.architecture ("llama" for SmolLM2); Error when absent.
  std::string architecture() const { return get_string("general.architecture"); }
  // A short printable rendering of a value: scalars in full, strings quoted and
  // cut to max_chars, arrays as "array[string] x 49152 [\"<|endoftext|>\", ...]".
  std::string describe_value(std::string_view key, size_t max_chars = 60) const;

  // ---- tensors ---------------------------------------------------------------
  // In file order (the order of the tensor infos).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* find_tensor(std::string_view name) const;
  // Error(format) naming the tensor, the file and a few names that exist.
  const TensorInfo& tensor(std::string_view name) const;
  // The tensor's bytes inside the mapping (valid while this object lives).
  std::span<const std::byte> tensor_bytes(const TensorInfo& info) const;

  struct Value;  // parsed metadata value (defined in the .cpp)

 private:
  GgufFile();
  static GgufFile parse(GgufFile file);
  const Value& get(std::string_view key) const;
  [[noreturn]] void wrong_type(std::string_view key, const Value& v, const char* expected) const;

  std::filesystem::path path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  struct Storage;                     // mmap or owned bytes
  std::unique_ptr<Storage> storage_;
  std::vector<std::string> keys_;
  std::map<std::string, std::unique_ptr<Value>, std::less<>> values_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// ---- conversions -------------------------------------------------------------

// All elements of the tensor as fp32, in ggml order (element i of row r at
// r * shape[0] + i; for a weight [ne0 = in, ne1 = out] that is W[out][in]).
// Types: see can_dequantize(); others give Error(unsupported). Large tensors
// are converted on several threads (lowbit/core/parallel.h).
std::vector<float> dequantize_to_f32(const GgufFile& file, const TensorInfo& info);
// Rows [row_begin, row_end) of ne[0] elements each, into out (size
// (row_end - row_begin) * shape[0]); for an embedding lookup without
// converting the whole table.
void dequantize_rows_to_f32(const GgufFile& file, const TensorInfo& info, int64_t row_begin,
                            int64_t row_end, std::span<float> out);

// True when to_quantized_linear maps the type exactly: Q4_1 and Q4_0.
bool maps_to_quantized_linear(GgmlType type);

// A 2-D Q4_1 or Q4_0 weight as lowbit's QuantizedLinear, exact (every
// dequantized weight equals ggml's; bit for bit for Q4_1, and for Q4_0 up to
// the sign of a zero: ggml's (q - 8)*d is -0 for q = 8, d < 0):
//   * ggml shape [ne0, ne1] = [in, out] (row-major [out][in]) becomes
//     K = ne0 = in_features, N = ne1 = out_features, i.e. lowbit's W[k][n] is
//     ggml's element k of row n (a transpose: lowbit computes y = x W).
//   * group_size 32: ggml block b of row n covers k = 32b .. 32b+31, column n.
//   * Q4_1 (w = d*q + m, d and m f16) -> ZeroPoint::float_min, scales = d,
//     mins = float(m) (exact); lowbit's float zero-point format stores exactly
//     this (see lowbit/formats/float_zero.h, pack_float_zero).
//   * Q4_0 (w = d*(q - 8)) -> ZeroPoint::symmetric, scales = d.
// Error(unsupported) for other types (dequantize_to_f32 and requantize),
// Error(format) for a tensor that is not 2-D or whose ne0 is not a multiple of
// 32 (always true for valid Q4 tensors) or whose ne0 is not a multiple of 8.
formats::QuantizedLinear to_quantized_linear(const GgufFile& file, const TensorInfo& info);

}  // namespace lowbit::gguf
