// Bounds-checked little-endian reading and appending for the ans file formats
// (internal to src/ans). Every read names the field it reads, so a truncated or
// corrupt file yields "FILE: truncated at byte 1234 reading 'matrix 2: cursors'
// (needs 2048 bytes, 100 remain)" instead of an out-of-bounds read, and sizes
// taken from the file are checked against the bytes that remain BEFORE
// anything is allocated for them.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit::ans::detail {

static_assert(std::endian::native == std::endian::little,
              "the ans formats are little-endian and are read with memcpy");

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string_view where) : bytes_(bytes), where_(where) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  uint64_t size() const { return bytes_.size(); }
  const std::string& where() const { return where_; }

  // Throws unless `n` more bytes exist; `field` names what they are for.
  void need(uint64_t n, std::string_view field) const {
    if (n > remaining())
      fail(ErrorKind::format, where_, ": truncated at byte ", pos_, " reading ", field, " (needs ", n,
           " bytes, ", remaining(), " remain)");
  }

  template <typename T>
  T scalar(std::string_view field) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t u32(std::string_view field) { return scalar<uint32_t>(field); }

  // `count` elements of T into `out`; the size is checked against the file first.
  template <typename T>
  void array(std::vector<T>& out, uint64_t count, std::string_view field) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (count > remaining() / sizeof(T))
      fail(ErrorKind::format, where_, ": ", field, " has ", count, " entries of ", sizeof(T), " bytes (",
           count * sizeof(T), " bytes) but only ", remaining(), " bytes remain at byte ", pos_,
           ": the file is truncated or the count is corrupt");
    out.resize(static_cast<size_t>(count));
    if (count != 0) std::memcpy(out.data(), bytes_.data() + pos_, static_cast<size_t>(count) * sizeof(T));
    pos_ += count * sizeof(T);
  }

  std::span<const uint8_t> bytes(uint64_t n, std::string_view field) {
    need(n, field);
    const auto s = bytes_.subspan(static_cast<size_t>(pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

  // Padding: `n` bytes that must all be zero (writers write zeros, so a
  // non-zero pad means a corrupt or misaligned file).
  void zeros(uint64_t n, std::string_view field) {
    const uint64_t at = pos_;
    const auto s = bytes(n, field);
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] != 0)
        fail(ErrorKind::format, where_, ": ", field, " byte ", at + i, " = 0x", hex2(s[i]),
             ": expected 0 (padding); the file is corrupt or misaligned");
  }

  void seek(uint64_t offset) {
    if (offset > bytes_.size()) fail(ErrorKind::internal, where_, ": seek to ", offset, " past the end");
    pos_ = offset;
  }

  static std::string hex2(uint8_t b) {
    const char* d = "0123456789abcdef";
    return {d[b >> 4], d[b & 15]};
  }

 private:
  std::span<const uint8_t> bytes_;
  std::string where_;
  uint64_t pos_ = 0;
};

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  template <typename T>
  void scalar(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  template <typename T>
  void array(std::span<const T> values) {
    const size_t at = out_.size();
    out_.resize(at + values.size_bytes());
    if (!values.empty()) std::memcpy(out_.data() + at, values.data(), values.size_bytes());
  }
  void zeros(size_t n) { out_.resize(out_.size() + n, 0); }
  void pad_to(size_t alignment) { zeros((alignment - out_.size() % alignment) % alignment); }
  size_t size() const { return out_.size(); }

 private:
  std::vector<uint8_t>& out_;
};

}  // namespace lowbit::ans::detail
