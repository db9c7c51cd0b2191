// Reading and writing .safetensors files (the Hugging Face tensor container).
//
// Format facts this code relies on:
//   * bytes [0, 8): N, the header length, an unsigned 64-bit little-endian integer;
//   * bytes [8, 8 + N): the header, UTF-8 JSON text starting with '{': one object
//     whose keys are tensor names, each mapped to
//       {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//     plus an optional "__metadata__" entry, a string -> string map;
//     writers pad the header with spaces (0x20) so that 8 + N is a multiple of 8;
//   * bytes [8 + N, file end): the data section. A tensor's bytes are
//     [data_begin, data_end) relative to the start of the data section, row-major,
//     little-endian, with end - begin = numel * element size (a 0-d tensor, shape
//     [], holds one element; a shape with a zero extent holds none);
//   * dtype names: F32 F16 BF16 I8 U8 I32 U32 F64 I16 U16 I64 U64 BOOL F8_E4M3
//     F8_E5M2 are read (see lowbit/core/dtype.h; the last eight only to be
//     listed and copied); F8_E8M0, the FNUZ variants, F6_*, F4 and C64/C128 exist
//     in the format but are rejected with ErrorKind::unsupported;
//   * the Python package (safetensors >= 0.4) writes tensors sorted by its dtype
//     enum, descending (U64 I64 F64 F32 U32 I32 BF16 F16 U16 I16 F8_E4M3 F8_E5M2
//     I8 U8 BOOL), then
//     by name (byte-wise), packed with no gaps; the header is compact JSON with
//     "__metadata__" first and the keys of each entry in the order dtype, shape,
//     data_offsets. SafetensorsWriter does the same, so for the same tensors and
//     at most one metadata key its output is byte-identical (Python writes
//     metadata keys in an unspecified hash order; we write them sorted).
//
// All errors are lowbit::Error: ErrorKind::format for a malformed file (the message
// names the file, the tensor, the bad value and what was expected),
// ErrorKind::unsupported for a valid dtype that lowbit has no DType for,
// ErrorKind::io when the operating system refuses, ErrorKind::invalid_argument
// for bad arguments to the writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/dtype.h"
#include "lowbit/io/mapped_file.h"
#include "lowbit/core/tensor.h"

namespace lowbit::io {

// Headers longer than this are rejected as absurd (the Python package's limit too).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // may be empty (a 0-d scalar) and may contain zeros
  uint64_t data_begin = 0;     // byte offsets relative to the start of the data section
  uint64_t data_end = 0;

  int64_t numel() const;  // product of shape (1 for a 0-d tensor); checked at open
  uint64_t nbytes() const { return data_end - data_begin; }
};

// A read-only, memory-mapped .safetensors file. open() reads and validates the
// header only; tensor bytes are paged in by the operating system when first
// touched through view() or bytes(), which never copy. Views and spans stay
// valid while this object (or the object it was moved into) lives. The mapping
// is read-only: writing through a view's data pointer crashes. If another
// process truncates the file while it is mapped, touching the lost pages raises
// SIGBUS; that cannot be checked for.
class SafetensorsFile {
 public:
  // Opens and validates `path` (see the checks in safetensors.cpp). Throws
  // Error(io) if the file cannot be opened or mapped, Error(format) if it is
  // not a valid safetensors file, Error(unsupported) for dtypes lowbit lacks.
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // All tensors, sorted by data_begin (then data_end, then name).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when there is no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }

  // A contiguous CPU view into the mapping. Throws Error(format) naming the
  // tensor and the file (and a few names that do exist) when it is missing, and
  // Error(unsupported) when its rank exceeds kMaxRank.
  TensorView view(std::string_view name) const;
  TensorView view(const SafetensorsTensor& tensor) const;
  // The tensor's raw little-endian bytes inside the mapping; same errors as view().
  std::span<const std::byte> bytes(std::string_view name) const;
  std::span<const std::byte> bytes(const SafetensorsTensor& tensor) const;

  // "__metadata__" (empty when absent). has_metadata() tells an absent entry
  // from an empty map (the Python package writes "__metadata__":{} for metadata={}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has_metadata() const { return has_metadata_; }

  const std::filesystem::path& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t header_size() const { return header_size_; }  // N, padding included
  uint64_t data_offset() const { return 8 + header_size_; }  // start of the data section

 private:
  SafetensorsFile() = default;
  const SafetensorsTensor& get(std::string_view name) const;

  std::filesystem::path path_;
  uint64_t file_size_ = 0;
  uint64_t header_size_ = 0;
  MappedFile map_;  // the whole file
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  bool has_metadata_ = false;
};

// Builds a .safetensors file. add() REFERENCES the caller's bytes (no copy):
// they must stay valid and unchanged until write() returns. add_copy() copies
// them instead. Layout, chosen for byte compatibility with the Python package:
// tensors sorted as the Python package sorts dtypes (U64 I64 F64 F32 U32 I32 BF16
// F16 U16 I16 F8_E4M3 F8_E5M2 I8 U8 BOOL: larger elements first),
// ties by name (byte-wise), packed back to back from the data section start,
// which is 8-byte aligned; so every tensor is aligned to its element size.
// Insertion order does not matter.
class SafetensorsWriter {
 public:
  SafetensorsWriter() = default;
  SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept = default;
  SafetensorsWriter(const SafetensorsWriter&) = delete;  // add_copy() spans point into *this
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Throws Error(invalid_argument) for: a duplicate name, the name "__metadata__",
  // a name that is not valid UTF-8, DType::u4x2 (safetensors has no name for it;
  // store packed data as U8 or I32 instead), a negative extent, a shape whose
  // element count overflows, or data.size() != numel * element size.
  void add(std::string name, DType dtype, std::vector<int64_t> shape,
           std::span<const std::byte> data);
  // Same, for a contiguous host view (the view's memory is referenced, not copied).
  void add(std::string name, const TensorView& view);
  // Same as add() but keeps a private copy of the bytes.
  void add_copy(std::string name, DType dtype, std::vector<int64_t> shape,
                std::span<const std::byte> data);

  // Sets "__metadata__" (written even when empty, as Python does for metadata={}).
  // Keys and values must be valid UTF-8 (else Error(invalid_argument)).
  void set_metadata(std::map<std::string, std::string> metadata);

  size_t size() const { return entries_.size(); }

  // The file's bytes before the data: length prefix and padded header.
  std::string header_bytes() const;

  // Writes the file: to a temporary file in the same folder, flushed to disk,
  // then renamed over `path`. On failure the temporary file is removed and any
  // existing file at `path` is untouched. Throws Error(io). The writer can be
  // written again (e.g. to another path).
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::span<const std::byte> data;
    std::vector<std::byte> owned;  // add_copy(): the bytes `data` points into
  };
  Entry& add_entry(std::string name, DType dtype, std::vector<int64_t> shape,
                   std::span<const std::byte> data);
  std::vector<const Entry*> layout() const;  // entries in file order

  std::vector<Entry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
  bool has_metadata_ = false;
};

}  // namespace lowbit::io
