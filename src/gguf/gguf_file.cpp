#include "lowbit/gguf/gguf_file.h"


#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "lowbit/core/error.h"
#include "lowbit/io/mapped_file.h"

namespace lowbit::gguf {

// ---- types -------------------------------------------------------------------

namespace {

struct TypeEntry {
  uint32_t id;
  GgmlTypeTraits traits;
};

// Block sizes and bytes per block from ggml's block structs (ggml-common.h).
// Types that lowbit cannot dequantize are listed too, so that files holding
// them open and can be inspected.
constexpr TypeEntry kTypes[] = {
    {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},      {6, {"Q5_0", 32, 22}},     {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 36}},     {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}},   {12, {"Q4_K", 256, 144}},  {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},  {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}},  {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},
    {20, {"IQ4_NL", 32, 18}},   {21, {"IQ3_S", 256, 110}}, {22, {"IQ2_S", 256, 82}},
    {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},        {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},
    {29, {"IQ1_M", 256, 56}},   {30, {"BF16", 1, 2}},      {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},   {39, {"MXFP4", 32, 17}},
};

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t id) {
  for (const auto& e : kTypes)
    if (e.id == id) return &e.traits;
  return nullptr;
}

std::string ggml_type_name(GgmlType type) {
  const auto* t = ggml_type_traits(static_cast<uint32_t>(type));
  if (t != nullptr) return t->name;
  return "type#" + std::to_string(static_cast<uint32_t>(type));
}

std::string value_type_name(ValueType type, std::optional<ValueType> element_type) {
  static const char* const kNames[] = {"u8",  "i8",  "u16",   "i16",   "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto id = static_cast<uint32_t>(type);
  std::string name = id < 13 ? kNames[id] : "value_type#" + std::to_string(id);
  if (type == ValueType::array && element_type) name += "[" + value_type_name(*element_type) + "]";
  return name;
}

// ---- TensorInfo ----------------------------------------------------------------

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked against overflow when the file was opened
  return n;
}

int64_t TensorInfo::num_rows() const {
  if (shape.empty() || shape[0] == 0) return 0;
  return numel() / shape[0];
}

std::string TensorInfo::describe() const {
  std::ostringstream out;
  out << name << ' ' << ggml_type_name(type) << " [";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

// ---- storage and values -----------------------------------------------------------

struct GgufFile::Storage {
  const std::byte* data = nullptr;
  uint64_t size = 0;
  io::MappedFile mapped;        // open()
  std::vector<std::byte> owned;  // from_bytes()
};

struct GgufFile::Value {
  ValueType type = ValueType::u8;
  ValueType element = ValueType::u8;  // arrays only
  uint64_t count = 0;                 // arrays only
  // Integers (and bools, as 0/1) are kept as int64; a u64 above INT64_MAX
  // sets `int_overflow` (get_int then fails rather than wrapping).
  int64_t int_value = 0;
  bool int_overflow = false;
  double float_value = 0;
  std::string string_value;
  std::vector<int64_t> ints;  // integer and bool arrays
  std::vector<double> floats;
  std::vector<std::string> strings;
};

namespace {

bool is_integer_type(ValueType t) {
  switch (t) {
    case ValueType::u8: case ValueType::i8: case ValueType::u16: case ValueType::i16:
    case ValueType::u32: case ValueType::i32: case ValueType::u64: case ValueType::i64:
      return true;
    default:
      return false;
  }
}

// Smallest encoded size of one value of a type (for bounding counts by the
// bytes that remain, before anything is allocated).
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::u8: case ValueType::i8: case ValueType::boolean: return 1;
    case ValueType::u16: case ValueType::i16: return 2;
    case ValueType::u32: case ValueType::i32: case ValueType::f32: return 4;
    case ValueType::u64: case ValueType::i64: case ValueType::f64: return 8;
    case ValueType::string: return 8;
    case ValueType::array: return 12;
  }
  return 1;
}

// Built by appending: g++ 12 gives a false -Wrestrict on "'" + std::string.
std::string show_path(const std::filesystem::path& p) {
  std::string out(1, '\'');
  out += p.string();
  out += '\'';
  return out;
}

// Bounds-checked little-endian reader over the file bytes.
class Reader {
 public:
  Reader(const std::byte* data, uint64_t size, std::string where)
      : data_(data), size_(size), where_(std::move(where)) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const std::string& where() const { return where_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      fail(ErrorKind::format, where_, ": truncated: ", what, " at byte ", pos_, " needs ", n,
           " bytes, only ", remaining(), " remain (file size ", size_, ")");
  }
  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // x86/ARM little-endian hosts only, as GGUF
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(std::string_view what) {
    const auto n = read<uint64_t>(what);
    if (n > remaining())
      fail(ErrorKind::format, where_, ": ", what, " at byte ", pos_ - 8, " has length ", n,
           " but only ", remaining(), " bytes remain: truncated or corrupt");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const std::byte* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string where_;
};

int64_t read_int_scalar(Reader& r, ValueType t, bool& overflow, std::string_view what) {
  overflow = false;
  switch (t) {
    case ValueType::u8: return r.read<uint8_t>(what);
    case ValueType::i8: return r.read<int8_t>(what);
    case ValueType::u16: return r.read<uint16_t>(what);
    case ValueType::i16: return r.read<int16_t>(what);
    case ValueType::u32: return r.read<uint32_t>(what);
    case ValueType::i32: return r.read<int32_t>(what);
    case ValueType::i64: return r.read<int64_t>(what);
    case ValueType::u64: {
      const auto v = r.read<uint64_t>(what);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        overflow = true;
        return std::numeric_limits<int64_t>::max();
      }
      return static_cast<int64_t>(v);
    }
    default:
      fail(ErrorKind::internal, "read_int_scalar on a non-integer type");
  }
}

bool read_bool(Reader& r, std::string_view what) {
  const auto pos = r.pos();
  const auto b = r.read<uint8_t>(what);
  if (b > 1)
    fail(ErrorKind::format, r.where(), ": ", what, " at byte ", pos, " is a bool with value ",
         int(b), ": expected 0 or 1");
  return b == 1;
}

void check_value_type(const Reader& r, uint32_t id, std::string_view what, uint64_t at) {
  if (id > 12)
    fail(ErrorKind::format, r.where(), ": ", what, " at byte ", at, " has value type ", id,
         ": expected 0..12 (u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64)");
}

}  // namespace

// ---- GgufFile ------------------------------------------------------------------------

GgufFile::GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

uint64_t GgufFile::file_size() const { return storage_ ? storage_->size : 0; }

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile f;
  f.path_ = path;
  f.storage_ = std::make_unique<Storage>();
  const std::string where = "GGUF file " + show_path(path);
  f.storage_->mapped = io::MappedFile::open(path, where);
  const uint64_t size = f.storage_->mapped.size();
  if (size < 24) {
    fail(ErrorKind::format, where, " is ", size,
         " bytes long: a GGUF header (magic, version, two counts) takes 24; truncated or not "
         "a GGUF file");
  }
  f.storage_->data = f.storage_->mapped.data();
  f.storage_->size = size;
  return parse(std::move(f));
}

GgufFile GgufFile::from_bytes(std::span<const std::byte> bytes, std::string name) {
  GgufFile f;
  f.path_ = name;
  f.storage_ = std::make_unique<Storage>();
  f.storage_->owned.assign(bytes.begin(), bytes.end());
  f.storage_->data = f.storage_->owned.data();
  f.storage_->size = f.storage_->owned.size();
  return parse(std::move(f));
}

GgufFile GgufFile::parse(GgufFile f) {
  const std::string where = "GGUF file " + show_path(f.path_);
  Reader r(f.storage_->data, f.storage_->size, where);

  // -- header
  r.need(4, "the magic");
  if (std::memcmp(f.storage_->data, "GGUF", 4) != 0) {
    char shown[5] = {};
    for (int i = 0; i < 4; ++i) {
      const auto c = static_cast<unsigned char>(f.storage_->data[i]);
      shown[i] = (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
    }
    fail(ErrorKind::format, where, ": bad magic '", shown,
         "': expected 'GGUF' (is this a GGUF model file?)");
  }
  (void)r.read<uint32_t>("the magic");
  f.version_ = r.read<uint32_t>("the version");
  if (f.version_ == 1)
    fail(ErrorKind::unsupported, where, ": GGUF version 1 is not supported (32-bit counts); "
         "expected version 2 or 3 (convert the file with a current llama.cpp)");
  if (f.version_ != 2 && f.version_ != 3)
    fail(ErrorKind::format, where, ": GGUF version ", f.version_, ": expected 2 or 3");
  const auto tensor_count = r.read<uint64_t>("the tensor count");
  const auto kv_count = r.read<uint64_t>("the metadata count");
  // Each metadata entry takes at least 13 bytes (key length, type, one byte),
  // each tensor info at least 32: counts beyond that are corrupt, and are
  // rejected before anything is allocated for them.
  if (kv_count > r.remaining() / 13)
    fail(ErrorKind::format, where, ": metadata count ", kv_count, " is absurd: at most ",
         r.remaining() / 13, " entries fit in the ", r.remaining(),
         " bytes after the header (the file is truncated or corrupt)");
  if (tensor_count > r.remaining() / 32)
    fail(ErrorKind::format, where, ": tensor count ", tensor_count, " is absurd: at most ",
         r.remaining() / 32, " tensor infos fit in the ", r.remaining(),
         " bytes after the header (the file is truncated or corrupt)");

  // -- metadata
  f.keys_.reserve(static_cast<size_t>(kv_count));
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string entry = "metadata entry " + std::to_string(i);
    std::string key = r.read_string(entry + " (its key)");
    const std::string what = "metadata key '" + key + "'";
    if (f.values_.count(key) != 0)
      fail(ErrorKind::format, where, ": ", what, " appears twice");
    auto v = std::make_unique<Value>();
    const uint64_t type_at = r.pos();
    const auto type_id = r.read<uint32_t>(what + " (its type)");
    check_value_type(r, type_id, what, type_at);
    v->type = static_cast<ValueType>(type_id);
    if (v->type == ValueType::array) {
      const uint64_t elem_at = r.pos();
      const auto elem_id = r.read<uint32_t>(what + " (its element type)");
      check_value_type(r, elem_id, what + " (array element type)", elem_at);
      v->element = static_cast<ValueType>(elem_id);
      if (v->element == ValueType::array)
        fail(ErrorKind::unsupported, where, ": ", what,
             " is an array of arrays, which lowbit does not read");
      v->count = r.read<uint64_t>(what + " (its element count)");
      if (v->count > r.remaining() / min_encoded_size(v->element))
        fail(ErrorKind::format, where, ": ", what, " claims ", v->count, " elements of type ",
             value_type_name(v->element), " but only ", r.remaining(),
             " bytes remain: truncated or corrupt");
      const auto n = static_cast<size_t>(v->count);
      const std::string elem_what = what + " (an array element)";
      if (v->element == ValueType::string) {
        v->strings.reserve(n);
        for (size_t j = 0; j < n; ++j) v->strings.push_back(r.read_string(elem_what));
      } else if (v->element == ValueType::f32 || v->element == ValueType::f64) {
        v->floats.resize(n);
        for (size_t j = 0; j < n; ++j)
          v->floats[j] = v->element == ValueType::f32 ? double(r.read<float>(elem_what))
                                                      : r.read<double>(elem_what);
      } else if (v->element == ValueType::boolean) {
        v->ints.resize(n);
        for (size_t j = 0; j < n; ++j) v->ints[j] = read_bool(r, elem_what) ? 1 : 0;
      } else {
        v->ints.resize(n);
        for (size_t j = 0; j < n; ++j) {
          bool overflow = false;
          v->ints[j] = read_int_scalar(r, v->element, overflow, elem_what);
          v->int_overflow = v->int_overflow || overflow;
        }
      }
    } else if (v->type == ValueType::string) {
      v->string_value = r.read_string(what);
    } else if (v->type == ValueType::f32) {
      v->float_value = r.read<float>(what);
    } else if (v->type == ValueType::f64) {
      v->float_value = r.read<double>(what);
    } else if (v->type == ValueType::boolean) {
      v->int_value = read_bool(r, what) ? 1 : 0;
    } else {
      v->int_value = read_int_scalar(r, v->type, v->int_overflow, what);
    }
    f.keys_.push_back(key);
    f.values_.emplace(std::move(key), std::move(v));
  }

  // -- alignment
  if (f.has("general.alignment")) {
    const Value& a = f.get("general.alignment");
    if (!is_integer_type(a.type))
      fail(ErrorKind::format, where, ": metadata key 'general.alignment' is a ",
           value_type_name(a.type), ": expected an integer (u32)");
    if (a.int_overflow || a.int_value <= 0 || a.int_value > (int64_t{1} << 30) ||
        !std::has_single_bit(static_cast<uint64_t>(a.int_value)))
      fail(ErrorKind::format, where, ": general.alignment = ", a.int_value,
           ": expected a power of two (at most 2^30)");
    f.alignment_ = static_cast<uint64_t>(a.int_value);
  }

  // -- tensor infos
  f.tensors_.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    t.name = r.read_string("the name of tensor " + std::to_string(i));
    const std::string what = "tensor '" + t.name + "'";
    if (f.tensor_index_.count(t.name) != 0)
      fail(ErrorKind::format, where, ": ", what, " appears twice");
    const auto n_dims = r.read<uint32_t>(what + " (its dimension count)");
    if (n_dims < 1 || n_dims > 4)
      fail(ErrorKind::format, where, ": ", what, " has ", n_dims,
           " dimensions: expected 1 to 4");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = r.read<uint64_t>(what + " (its shape)");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(ErrorKind::format, where, ": ", what, " has extent ne[", d, "] = ", ne,
             ": absurd");
      const auto e = static_cast<int64_t>(ne);
      if (e != 0 && numel > std::numeric_limits<int64_t>::max() / e)
        fail(ErrorKind::format, where, ": ", what,
             " has an absurd shape (the element count overflows 64 bits)");
      numel *= e;
      t.shape.push_back(e);
    }
    const uint64_t type_at = r.pos();
    const auto type_id = r.read<uint32_t>(what + " (its type)");
    const GgmlTypeTraits* traits = ggml_type_traits(type_id);
    if (traits == nullptr)
      fail(ErrorKind::format, where, ": ", what, " at byte ", type_at, " has ggml type id ",
           type_id, ", which is not a ggml type lowbit knows");
    t.type = static_cast<GgmlType>(type_id);
    t.offset = r.read<uint64_t>(what + " (its data offset)");
    if (t.shape[0] % traits->block_size != 0)
      fail(ErrorKind::format, where, ": ", what, " of type ", traits->name, " has ne[0] = ",
           t.shape[0], ": expected a multiple of its block size ", traits->block_size);
    const uint64_t blocks = static_cast<uint64_t>(numel / traits->block_size);
    if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(traits->type_size))
      fail(ErrorKind::format, where, ": ", what, " has an absurd byte size");
    t.nbytes = blocks * static_cast<uint64_t>(traits->type_size);
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  // -- data section and tensor placement
  const uint64_t a = f.alignment_;
  f.data_offset_ = (r.pos() + a - 1) / a * a;
  const uint64_t size = f.storage_->size;
  const uint64_t data_size = f.data_offset_ <= size ? size - f.data_offset_ : 0;
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : f.tensors_) {
    if (t.offset % a != 0)
      fail(ErrorKind::format, where, ": tensor '", t.name, "' has data offset ", t.offset,
           ": expected a multiple of the alignment ", a);
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(ErrorKind::format, where, ": tensor '", t.name, "' (", t.nbytes,
           " bytes at data offset ", t.offset, ") ends beyond the data section (",
           data_size, " bytes from file byte ", f.data_offset_,
           "): the file is truncated or the offset is corrupt");
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* x, const TensorInfo* y) { return x->offset < y->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.offset < prev.offset + prev.nbytes)
      fail(ErrorKind::format, where, ": tensors '", prev.name, "' (bytes ", prev.offset, "..",
           prev.offset + prev.nbytes, ") and '", cur.name, "' (from byte ", cur.offset,
           ") overlap");
  }
  return f;
}

// ---- metadata getters ---------------------------------------------------------

bool GgufFile::has(std::string_view key) const { return values_.find(key) != values_.end(); }

std::optional<ValueType> GgufFile::type_of(std::string_view key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second->type;
}

std::optional<ValueType> GgufFile::array_type_of(std::string_view key) const {
  const auto it = values_.find(key);
  if (it == values_.end() || it->second->type != ValueType::array) return std::nullopt;
  return it->second->element;
}

const GgufFile::Value& GgufFile::get(std::string_view key) const {
  const auto it = values_.find(key);
  if (it == values_.end())
    fail(ErrorKind::invalid_argument, "GGUF file ", show_path(path_), ": no metadata key '",
         key, "'");
  return *it->second;
}

void GgufFile::wrong_type(std::string_view key, const Value& v, const char* expected) const {
  fail(ErrorKind::invalid_argument, "GGUF file ", show_path(path_), ": metadata key '", key,
       "' is a ", value_type_name(v.type, v.element), ", expected ", expected);
}

uint64_t GgufFile::array_size(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::array) wrong_type(key, v, "an array");
  return v.count;
}

std::string GgufFile::get_string(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::string) wrong_type(key, v, "a string");
  return v.string_value;
}

int64_t GgufFile::get_int(std::string_view key) const {
  const Value& v = get(key);
  if (!is_integer_type(v.type)) wrong_type(key, v, "an integer");
  if (v.int_overflow)
    fail(ErrorKind::invalid_argument, "GGUF file ", show_path(path_), ": metadata key '", key,
         "' holds a u64 above 2^63-1, which lowbit does not accept");
  return v.int_value;
}

double GgufFile::get_float(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::f32 && v.type != ValueType::f64) wrong_type(key, v, "a float");
  return v.float_value;
}

bool GgufFile::get_bool(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::boolean) wrong_type(key, v, "a bool");
  return v.int_value != 0;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::array || v.element != ValueType::string)
    wrong_type(key, v, "an array of strings");
  return v.strings;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::array || !is_integer_type(v.element))
    wrong_type(key, v, "an array of integers");
  if (v.int_overflow)
    fail(ErrorKind::invalid_argument, "GGUF file ", show_path(path_), ": metadata key '", key,
         "' holds a u64 above 2^63-1, which lowbit does not accept");
  return v.ints;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::array || (v.element != ValueType::f32 && v.element != ValueType::f64))
    wrong_type(key, v, "an array of floats");
  std::vector<float> out(v.floats.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(v.floats[i]);
  return out;
}

std::string GgufFile::get_string_or(std::string_view key, std::string_view fallback) const {
  return has(key) ? get_string(key) : std::string(fallback);
}
int64_t GgufFile::get_int_or(std::string_view key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GgufFile::get_float_or(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}

namespace {

std::string quote(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ >= max_chars) {
      out += "...";
      break;
    }
    if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else if (static_cast<unsigned char>(c) < 32) out += '?';
    else out += c;
  }
  out += '"';
  return out;
}

std::string show_float(double x) {
  std::ostringstream o;
  o.precision(9);
  o << x;
  return o.str();
}

}  // namespace

std::string GgufFile::describe_value(std::string_view key, size_t max_chars) const {
  const Value& v = get(key);
  std::string out;
  switch (v.type) {
    case ValueType::string: return quote(v.string_value, max_chars);
    case ValueType::boolean: return v.int_value ? "true" : "false";
    case ValueType::f32: case ValueType::f64: return show_float(v.float_value);
    case ValueType::array: {
      out = value_type_name(v.type, v.element) + " x " + std::to_string(v.count) + " [";
      const size_t shown = std::min<size_t>(static_cast<size_t>(v.count), 4);
      for (size_t i = 0; i < shown; ++i) {
        if (i) out += ", ";
        if (v.element == ValueType::string) out += quote(v.strings[i], 20);
        else if (v.element == ValueType::f32 || v.element == ValueType::f64) out += show_float(v.floats[i]);
        else out += std::to_string(v.ints[i]);
      }
      if (v.count > shown) out += ", ...";
      return out + "]";
    }
    default:
      if (v.int_overflow) return "(u64 > 2^63-1)";
      return std::to_string(v.int_value);
  }
}

// ---- tensors --------------------------------------------------------------------

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) {
    std::string some;
    for (size_t i = 0; i < tensors_.size() && i < 4; ++i) some += (i ? ", '" : "'") + tensors_[i].name + "'";
    fail(ErrorKind::format, "GGUF file ", show_path(path_), " has no tensor '", name, "' (",
         tensors_.size(), " tensors", tensors_.empty() ? "" : ", e.g. ", some, ")");
  }
  return *t;
}

std::span<const std::byte> GgufFile::tensor_bytes(const TensorInfo& info) const {
  // The info must be one of ours (its bounds were checked at open).
  const TensorInfo* own = find_tensor(info.name);
  if (own == nullptr || own->offset != info.offset || own->nbytes != info.nbytes)
    fail(ErrorKind::invalid_argument, "tensor '", info.name, "' is not a tensor of GGUF file ",
         show_path(path_));
  return {storage_->data + data_offset_ + own->offset, static_cast<size_t>(own->nbytes)};
}

}  // namespace lowbit::gguf
