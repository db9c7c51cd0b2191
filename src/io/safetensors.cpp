#include "lowbit/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"

namespace lowbit::io {
namespace {

using nlohmann::json;

// Deepest JSON nesting we accept in a header. A valid header needs 3
// ({ tensor: { shape: [ ] } }); the limit bounds the parser's memory on hostile input.
constexpr int kMaxHeaderDepth = 32;

// Names of safetensors dtypes that exist in the format but have no lowbit DType.
constexpr std::string_view kUnsupportedDtypes[] = {
    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4", "C64", "C128"};

std::string supported_dtype_list() {
  std::string out;
  for (DType t : kAllDTypes) {
    const char* n = safetensors_dtype_name(t);
    if (n == nullptr) continue;
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// Appends `s` as a JSON string literal, escaping exactly as serde_json (the
// Python package's serializer) does: '"', '\\', \b \f \n \r \t, other control
// characters as \u00xx (lower-case hex); everything else, DEL and non-ASCII
// UTF-8 included, verbatim.
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += kHex[u >> 4];
          out += kHex[u & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// A name as shown in messages: quoted, escaped, and cut if very long.
std::string show(std::string_view s) {
  constexpr size_t kMax = 200;
  std::string out;
  if (s.size() > kMax) {
    append_json_string(out, s.substr(0, kMax));
    out.insert(out.size() - 1, "...");
  } else {
    append_json_string(out, s);
  }
  out.front() = '\'';
  out.back() = '\'';
  return out;
}

std::string show_path(const std::filesystem::path& p) {
  std::string out(1, '\'');
  out += p.string();
  out += '\'';
  return out;
}

// Byte offset of the first invalid UTF-8 sequence in `s`, or npos. Rejects
// overlong forms, surrogates and code points above U+10FFFF.
size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1Fu; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0Fu; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07u; }
    else return i;
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0u) != 0x80u) return i;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += len;
  }
  return std::string_view::npos;
}

// Checks what the JSON parser does not: a leading '{', valid UTF-8 everywhere
// (also outside strings, for a precise message), and bounded nesting.
void check_header_text(std::string_view text, const std::string& where) {
  if (text.empty() || text.front() != '{') {
    if (text.empty())
      fail(ErrorKind::format, where, ": the header is empty (length 0): expected a JSON object");
    const auto c = static_cast<unsigned char>(text.front());
    fail(ErrorKind::format, where, ": the header starts with byte 0x", "0123456789abcdef"[c >> 4],
         "0123456789abcdef"[c & 0xF],
         ": expected '{' (a JSON object); this is not a safetensors file or it is corrupt");
  }
  if (const size_t bad = find_invalid_utf8(text); bad != std::string_view::npos)
    fail(ErrorKind::format, where, ": the header is not valid UTF-8 (bad byte at header offset ",
         bad, ")");
  // nlohmann's parser stops at a NUL byte as if the input ended there; JSON never
  // contains one (inside strings it must be escaped), so reject it here.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail(ErrorKind::format, where, ": the header contains a NUL byte at header offset ", nul,
         ": not valid JSON (padding must be spaces)");
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxHeaderDepth)
        fail(ErrorKind::format, where, ": the header JSON nests deeper than ", kMaxHeaderDepth,
             " levels (at header offset ", i, "): expected a flat object of tensor entries");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_le64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFFu);
}

size_t element_bytes(DType t) { return static_cast<size_t>(dtype_bits(t) / 8); }

// Product of the extents if it fits in int64 (zero extents included: the
// product of the non-zero extents must fit too, so that code multiplying
// extents in any order cannot overflow); nullopt otherwise.
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  uint64_t nonzero = 1;
  bool has_zero = false;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (int64_t e : shape) {
    if (e < 0) return std::nullopt;
    if (e == 0) { has_zero = true; continue; }
    const auto u = static_cast<uint64_t>(e);
    if (nonzero > kMax / u) return std::nullopt;
    nonzero *= u;
  }
  return has_zero ? 0 : static_cast<int64_t>(nonzero);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// ---- header entry parsing ------------------------------------------------------

DType parse_entry_dtype(const json& entry, const std::string& where) {
  const auto it = entry.find("dtype");
  if (it == entry.end())
    fail(ErrorKind::format, where, ": missing \"dtype\": expected a string such as \"F32\"");
  if (!it->is_string())
    fail(ErrorKind::format, where, ": \"dtype\" is a JSON ", it->type_name(), " (", it->dump(),
         "): expected a string such as \"F32\"");
  const auto& name = it->get_ref<const std::string&>();
  if (const auto t = parse_safetensors_dtype(name)) return *t;
  if (std::find(std::begin(kUnsupportedDtypes), std::end(kUnsupportedDtypes), name) !=
      std::end(kUnsupportedDtypes))
    fail(ErrorKind::unsupported, where, ": unsupported dtype ", name,
         ": lowbit reads only ", supported_dtype_list());
  fail(ErrorKind::format, where, ": unknown dtype ", show(name), ": expected one of ",
       supported_dtype_list(), " (or another safetensors dtype, which lowbit does not support)");
}

std::vector<int64_t> parse_entry_shape(const json& entry, const std::string& where) {
  const auto it = entry.find("shape");
  if (it == entry.end())
    fail(ErrorKind::format, where, ": missing \"shape\": expected an array of extents");
  if (!it->is_array())
    fail(ErrorKind::format, where, ": \"shape\" is a JSON ", it->type_name(),
         ": expected an array of non-negative integers");
  std::vector<int64_t> shape;
  shape.reserve(it->size());
  for (size_t d = 0; d < it->size(); ++d) {
    const json& e = (*it)[d];
    if (e.is_number_unsigned() || (e.is_number_integer() && e.get<int64_t>() >= 0)) {
      const auto v = e.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(ErrorKind::format, where, ": shape[", d, "] = ", v,
             " is too large: expected at most 2^63 - 1");
      shape.push_back(static_cast<int64_t>(v));
    } else if (e.is_number_integer()) {
      fail(ErrorKind::format, where, ": shape[", d, "] = ", e.dump(),
           " is negative: expected a non-negative integer");
    } else {
      fail(ErrorKind::format, where, ": shape[", d, "] = ", e.dump(), " (a JSON ", e.type_name(),
           ") is not an integer: expected a non-negative integer");
    }
  }
  return shape;
}

std::pair<uint64_t, uint64_t> parse_entry_offsets(const json& entry, const std::string& where) {
  const auto it = entry.find("data_offsets");
  if (it == entry.end())
    fail(ErrorKind::format, where, ": missing \"data_offsets\": expected [begin, end]");
  if (!it->is_array() || it->size() != 2)
    fail(ErrorKind::format, where, ": \"data_offsets\" is ", it->dump(),
         ": expected an array of two non-negative integers [begin, end]");
  uint64_t v[2];
  for (size_t k = 0; k < 2; ++k) {
    const json& e = (*it)[k];
    if (e.is_number_unsigned() || (e.is_number_integer() && e.get<int64_t>() >= 0)) {
      v[k] = e.get<uint64_t>();
    } else {
      fail(ErrorKind::format, where, ": data_offsets[", k, "] = ", e.dump(),
           " is not a non-negative integer: expected [begin, end] with 0 <= begin <= end");
    }
  }
  if (v[0] > v[1])
    fail(ErrorKind::format, where, ": data_offsets [", v[0], ", ", v[1],
         "] has begin > end: expected [begin, end] with begin <= end");
  return {v[0], v[1]};
}

}  // namespace

// ---- SafetensorsTensor ---------------------------------------------------------

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;  // checked not to overflow when the file was opened
  return n;
}

// ---- SafetensorsFile -----------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  const std::string where = "safetensors file " + show_path(path);

  f.map_ = MappedFile::open(path, where);
  f.file_size_ = f.map_.size();
  if (f.file_size_ < 8) {
    fail(ErrorKind::format, where, " is ", f.file_size_,
         " bytes long: expected at least 8 (the header length); the file is truncated or empty");
  }
  const auto* base = reinterpret_cast<const unsigned char*>(f.map_.data());

  const uint64_t n = read_le64(base);
  if (n > kSafetensorsMaxHeaderBytes)
    fail(ErrorKind::format, where, ": header length ", n, " is absurd (the limit is ",
         kSafetensorsMaxHeaderBytes,
         " bytes): the first 8 bytes are not a safetensors header length; not a safetensors "
         "file or corrupt");
  if (n > f.file_size_ - 8)
    fail(ErrorKind::format, where, ": header length ", n, " exceeds the ", f.file_size_ - 8,
         " bytes after the 8-byte length prefix: the file is truncated or not a safetensors "
         "file");
  f.header_size_ = n;
  const uint64_t data_size = f.file_size_ - 8 - n;
  const std::string_view text(reinterpret_cast<const char*>(base + 8), static_cast<size_t>(n));
  check_header_text(text, where);

  // Parse, noting tensor names that appear twice (the DOM would keep only one).
  std::string duplicate;
  bool has_duplicate = false;
  std::set<std::string, std::less<>> seen;
  json header;
  try {
    header = json::parse(
        text.begin(), text.end(),
        [&](int depth, json::parse_event_t event, json& parsed) {
          if (event == json::parse_event_t::key && depth == 1 && !has_duplicate) {
            const auto& key = parsed.get_ref<const std::string&>();
            if (!seen.insert(key).second) {
              duplicate = key;
              has_duplicate = true;
            }
          }
          return true;
        });
  } catch (const json::parse_error& e) {
    // nlohmann's what() is "[json.exception.parse_error.101] parse error at line 1,
    // column 20: syntax error ..."; the header is usually one line, so give the offset.
    std::string detail = e.what();
    if (const size_t at = detail.find("parse error"); at != std::string::npos)
      if (const size_t colon = detail.find(": ", at); colon != std::string::npos)
        detail.erase(0, colon + 2);
    fail(ErrorKind::format, where, ": the header (", n, " bytes) is not valid JSON at header offset ",
         e.byte == 0 ? 0 : e.byte - 1, ": ", detail);
  }
  if (has_duplicate)
    fail(ErrorKind::format, where, ": the header names tensor ", show(duplicate),
         " twice: expected unique keys");
  if (!header.is_object())
    fail(ErrorKind::format, where, ": the header is a JSON ", header.type_name(),
         ": expected an object");

  f.tensors_.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object())
        fail(ErrorKind::format, where, ": \"__metadata__\" is a JSON ", value.type_name(),
             ": expected an object mapping strings to strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(ErrorKind::format, where, ": \"__metadata__\" entry ", show(mk), " is a JSON ",
               mv.type_name(), " (", mv.dump(), "): expected a string (metadata maps strings to strings)");
        f.metadata_.emplace(mk, mv.get<std::string>());
      }
      f.has_metadata_ = true;
      continue;
    }
    const std::string what = where + ": tensor " + show(key);
    if (!value.is_object())
      fail(ErrorKind::format, what, ": the entry is a JSON ", value.type_name(),
           ": expected an object with \"dtype\", \"shape\" and \"data_offsets\"");
    SafetensorsTensor t;
    t.name = key;
    t.dtype = parse_entry_dtype(value, what);
    t.shape = parse_entry_shape(value, what);
    const auto [begin, end] = parse_entry_offsets(value, what);
    t.data_begin = begin;
    t.data_end = end;
    const auto numel = checked_numel(t.shape);
    if (!numel)
      fail(ErrorKind::format, what, ": shape ", shape_text(t.shape),
           " has more elements than fit in a signed 64-bit count");
    const auto elems = static_cast<uint64_t>(*numel);
    const uint64_t esize = element_bytes(t.dtype);
    if (elems > std::numeric_limits<uint64_t>::max() / esize)
      fail(ErrorKind::format, what, ": shape ", shape_text(t.shape), " of ",
           safetensors_dtype_name(t.dtype), " takes more bytes than fit in 64 bits");
    const uint64_t expected = elems * esize;
    if (end > data_size)
      fail(ErrorKind::format, what, ": data_offsets [", begin, ", ", end,
           "] end beyond the data section, which has ", data_size,
           " bytes: the file is truncated (or the offsets are wrong)");
    if (end - begin != expected)
      fail(ErrorKind::format, what, ": data_offsets [", begin, ", ", end, "] span ", end - begin,
           " bytes: expected ", expected, " (", elems, " elements of ",
           safetensors_dtype_name(t.dtype), ", shape ", shape_text(t.shape), ")");
    f.tensors_.push_back(std::move(t));
  }

  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const auto& a, const auto& b) {
    if (a.data_begin != b.data_begin) return a.data_begin < b.data_begin;
    if (a.data_end != b.data_end) return a.data_end < b.data_end;
    return a.name < b.name;
  });
  // Overlap: ranges sorted by begin overlap iff one starts before the furthest
  // end seen so far. Empty ranges occupy no bytes and are skipped.
  const SafetensorsTensor* furthest = nullptr;
  for (const auto& t : f.tensors_) {
    if (t.data_begin == t.data_end) continue;
    if (furthest != nullptr && t.data_begin < furthest->data_end)
      fail(ErrorKind::format, where, ": tensors ", show(furthest->name), " (bytes [",
           furthest->data_begin, ", ", furthest->data_end, ")) and ", show(t.name), " (bytes [",
           t.data_begin, ", ", t.data_end,
           ")) overlap: expected disjoint data_offsets ranges");
    if (furthest == nullptr || t.data_end > furthest->data_end) furthest = &t;
  }
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::get(std::string_view name) const {
  if (const auto* t = find(name)) return *t;
  std::string some;
  constexpr size_t kShown = 5;
  for (size_t i = 0; i < tensors_.size() && i < kShown; ++i)
    some += (i ? ", " : "") + show(tensors_[i].name);
  if (tensors_.size() > kShown) some += ", ...";
  if (tensors_.empty())
    fail(ErrorKind::format, "safetensors file ", show_path(path_), " has no tensor ", show(name),
         " (it holds no tensors at all)");
  fail(ErrorKind::format, "safetensors file ", show_path(path_), " has no tensor ", show(name),
       " (it has ", tensors_.size(), " tensors: ", some, ")");
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsTensor& t) const {
  if (!map_.mapped())
    fail(ErrorKind::invalid_argument, "SafetensorsFile::bytes(", show(t.name),
         ") on a moved-from SafetensorsFile");
  const auto* base = map_.data() + data_offset();
  return {base + t.data_begin, static_cast<size_t>(t.data_end - t.data_begin)};
}

std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
  return bytes(get(name));
}

TensorView SafetensorsFile::view(const SafetensorsTensor& t) const {
  if (t.shape.size() > static_cast<size_t>(kMaxRank))
    fail(ErrorKind::unsupported, "safetensors file ", show_path(path_), ": tensor ", show(t.name),
         " has rank ", t.shape.size(), " (shape ", shape_text(t.shape),
         "): TensorView holds at most ", kMaxRank, " dimensions; use bytes() instead");
  const auto data = bytes(t);
  TensorView v;
  v.data = const_cast<std::byte*>(data.data());  // read-only mapping; see the header
  v.dtype = t.dtype;
  v.device = Device::cpu;
  v.rank = static_cast<int>(t.shape.size());
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = t.shape[static_cast<size_t>(d)];
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

TensorView SafetensorsFile::view(std::string_view name) const { return view(get(name)); }

// ---- SafetensorsWriter ---------------------------------------------------------

namespace {

// File order of the Python package: larger elements first, then by name.
// (the Python package sorts by its dtype enum, descending; checked against it
// for every dtype numpy has).
int layout_rank(DType t) {
  switch (t) {
    case DType::u64: return 0;
    case DType::i64: return 1;
    case DType::f64: return 2;
    case DType::f32: return 3;
    case DType::u32: return 4;
    case DType::i32: return 5;
    case DType::bf16: return 6;
    case DType::f16: return 7;
    case DType::u16: return 8;
    case DType::i16: return 9;
    case DType::f8_e4m3: return 10;
    case DType::f8_e5m2: return 11;
    case DType::i8: return 12;
    case DType::u8: return 13;
    case DType::boolean: return 14;
    case DType::u4x2: return 15;
  }
  return 16;
}

void check_utf8_argument(std::string_view what, std::string_view s) {
  if (const size_t bad = find_invalid_utf8(s); bad != std::string_view::npos)
    fail_argument(what, show(s), "valid UTF-8 (bad byte at offset " + std::to_string(bad) + ")");
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void write_all(int fd, const void* data, size_t size, const std::string& where) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      fail(ErrorKind::io, "cannot write ", where, ": ", std::strerror(err));
    }
    p += w;
    size -= static_cast<size_t>(w);
  }
}

}  // namespace

SafetensorsWriter::Entry& SafetensorsWriter::add_entry(std::string name, DType dtype,
                                                       std::vector<int64_t> shape,
                                                       std::span<const std::byte> data) {
  if (name == "__metadata__")
    fail_argument("name", "\"__metadata__\"",
                  "a tensor name other than \"__metadata__\" (reserved for the metadata map)");
  check_utf8_argument("name", name);
  if (index_.count(name) != 0)
    fail_argument("name", show(name), "a name not added before (duplicate tensor name)");
  if (safetensors_dtype_name(dtype) == nullptr)
    fail_argument("dtype", dtype_name(dtype),
                  "a dtype with a safetensors name (F32, F16, BF16, I8, U8, I32, U32); "
                  "store packed u4x2 data as U8 or I32");
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] < 0)
      fail_argument("shape", shape_text(shape), "non-negative extents (tensor " + show(name) + ")");
  const auto numel = checked_numel(shape);
  if (!numel)
    fail_argument("shape", shape_text(shape),
                  "an element count that fits in int64 (tensor " + show(name) + ")");
  const auto elems = static_cast<uint64_t>(*numel);
  const uint64_t esize = element_bytes(dtype);
  if (elems > std::numeric_limits<uint64_t>::max() / esize || elems * esize != data.size())
    fail_argument("data.size()", data.size(),
                  std::to_string(elems) + " elements of " + safetensors_dtype_name(dtype) + " = " +
                      (elems > std::numeric_limits<uint64_t>::max() / esize
                           ? std::string("overflow")
                           : std::to_string(elems * esize)) +
                      " bytes for shape " + shape_text(shape) + " (tensor " + show(name) + ")");
  index_.emplace(name, entries_.size());
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), data, {}});
  return entries_.back();
}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::span<const std::byte> data) {
  add_entry(std::move(name), dtype, std::move(shape), data);
}

void SafetensorsWriter::add_copy(std::string name, DType dtype, std::vector<int64_t> shape,
                                 std::span<const std::byte> data) {
  Entry& e = add_entry(std::move(name), dtype, std::move(shape), data);
  e.owned.assign(data.begin(), data.end());
  e.data = std::span<const std::byte>(e.owned.data(), e.owned.size());
}

void SafetensorsWriter::add(std::string name, const TensorView& view) {
  if (view.device != Device::cpu)
    fail_argument("view.device", device_name(view.device),
                  "a host (cpu) tensor; copy device tensors to the host first (tensor " +
                      show(name) + ")");
  if (view.rank < 0 || view.rank > kMaxRank)
    fail_argument("view.rank", view.rank, "0 to 6");
  if (!view.is_contiguous())
    fail_argument("view", view.shape_string(),
                  "a contiguous row-major view (tensor " + show(name) + ")");
  std::vector<int64_t> shape(view.shape.begin(), view.shape.begin() + view.rank);
  const auto numel = checked_numel(shape);
  if (!numel)
    fail_argument("view.shape", view.shape_string(),
                  "non-negative extents whose product fits in int64 (tensor " + show(name) + ")");
  const size_t nbytes = (safetensors_dtype_name(view.dtype) == nullptr)
                            ? 0  // rejected by add_entry with a dtype message
                            : static_cast<size_t>(*numel) * element_bytes(view.dtype);
  if (nbytes > 0 && view.data == nullptr)
    fail_argument("view.data", "nullptr", "a pointer to the tensor's bytes (tensor " + show(name) + ")");
  add_entry(std::move(name), view.dtype, std::move(shape),
            std::span<const std::byte>(static_cast<const std::byte*>(view.data), nbytes));
}

void SafetensorsWriter::set_metadata(std::map<std::string, std::string> metadata) {
  for (const auto& [k, v] : metadata) {
    check_utf8_argument("metadata key", k);
    check_utf8_argument("metadata value", v);
  }
  metadata_ = std::move(metadata);
  has_metadata_ = true;
}

std::vector<const SafetensorsWriter::Entry*> SafetensorsWriter::layout() const {
  std::vector<const Entry*> order;
  order.reserve(entries_.size());
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const int ra = layout_rank(a->dtype), rb = layout_rank(b->dtype);
    if (ra != rb) return ra < rb;
    return a->name < b->name;  // std::string compares bytes as unsigned char
  });
  return order;
}

std::string SafetensorsWriter::header_bytes() const {
  std::string json_text = "{";
  bool first = true;
  if (has_metadata_) {
    json_text += "\"__metadata__\":{";
    bool first_kv = true;
    for (const auto& [k, v] : metadata_) {
      if (!first_kv) json_text += ',';
      first_kv = false;
      append_json_string(json_text, k);
      json_text += ':';
      append_json_string(json_text, v);
    }
    json_text += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const Entry* e : layout()) {
    if (!first) json_text += ',';
    first = false;
    append_json_string(json_text, e->name);
    json_text += ":{\"dtype\":\"";
    json_text += safetensors_dtype_name(e->dtype);
    json_text += "\",\"shape\":[";
    for (size_t d = 0; d < e->shape.size(); ++d) {
      if (d) json_text += ',';
      json_text += std::to_string(e->shape[d]);
    }
    const uint64_t end = offset + e->data.size();
    if (end < offset) fail(ErrorKind::invalid_argument, "SafetensorsWriter: total size overflows");
    json_text += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) +
                 "]}";
    offset = end;
  }
  json_text += '}';
  json_text.append((8 - json_text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json_text.size());
  write_le64(out, json_text.size());
  out += json_text;
  return out;
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  if (path.filename().empty())
    fail_argument("path", show_path(path), "a file path (it names a folder)");
  const std::string header = header_bytes();
  const std::filesystem::path dir = path.parent_path();

  // A fresh temporary name next to the target (same file system, so rename is atomic).
  static std::atomic<uint64_t> counter{0};
  const auto stamp = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  std::filesystem::path tmp;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 100 && raw_fd < 0; ++attempt) {
    std::string name(1, '.');
    name += path.filename().string();
    name += ".tmp.";
    name += std::to_string(::getpid());
    name += '.';
    name += std::to_string(stamp % 1000000007u);
    name += '.';
    name += std::to_string(counter++);
    tmp = dir / name;
    raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (raw_fd < 0 && errno != EEXIST) {
      const int err = errno;
      fail(ErrorKind::io, "cannot create a temporary file next to ", show_path(path), " (",
           show_path(tmp), "): ", std::strerror(err));
    }
  }
  if (raw_fd < 0)
    fail(ErrorKind::io, "cannot create a temporary file next to ", show_path(path),
         ": every name tried exists");
  Fd fd(raw_fd);
  const std::string where = "temporary file " + show_path(tmp) + " for " + show_path(path);
  try {
    write_all(fd.get(), header.data(), header.size(), where);
    for (const Entry* e : layout()) write_all(fd.get(), e->data.data(), e->data.size(), where);
    if (::fsync(fd.get()) != 0) {
      const int err = errno;
      fail(ErrorKind::io, "cannot flush ", where, " to disk: ", std::strerror(err));
    }
    if (::close(fd.release()) != 0) {
      const int err = errno;
      fail(ErrorKind::io, "cannot close ", where, ": ", std::strerror(err));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      fail(ErrorKind::io, "cannot rename ", show_path(tmp), " to ", show_path(path), ": ",
           std::strerror(err));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable (best effort: some file systems refuse).
  const std::string dir_name = dir.empty() ? std::string(".") : dir.string();
  const int dfd = ::open(dir_name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace lowbit::io
