// Builds GGUF files in memory for tests, byte by byte from the format
// description (not through lowbit's reader), with knobs to corrupt them.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit::gguf::test {

class Bytes {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    data.insert(data.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    for (char c : s) data.push_back(static_cast<std::byte>(c));
  }
  void put_raw(const std::vector<std::byte>& b) { data.insert(data.end(), b.begin(), b.end()); }
  std::vector<std::byte> data;
};

class GgufBuilder {
 public:
  uint32_t version = 3;
  std::string magic = "GGUF";
  uint64_t alignment = 32;            // how the builder lays out data (general.alignment is separate)
  std::optional<uint64_t> tensor_count_override;
  std::optional<uint64_t> kv_count_override;

  // Metadata: each entry is pre-encoded (key, type id, value bytes).
  void kv_u32(std::string_view key, uint32_t v) { add_kv(key, 4, [&](Bytes& b) { b.put(v); }); }
  void kv_i32(std::string_view key, int32_t v) { add_kv(key, 5, [&](Bytes& b) { b.put(v); }); }
  void kv_u64(std::string_view key, uint64_t v) { add_kv(key, 10, [&](Bytes& b) { b.put(v); }); }
  void kv_i8(std::string_view key, int8_t v) { add_kv(key, 1, [&](Bytes& b) { b.put(v); }); }
  void kv_u16(std::string_view key, uint16_t v) { add_kv(key, 2, [&](Bytes& b) { b.put(v); }); }
  void kv_f32(std::string_view key, float v) { add_kv(key, 6, [&](Bytes& b) { b.put(v); }); }
  void kv_f64(std::string_view key, double v) { add_kv(key, 12, [&](Bytes& b) { b.put(v); }); }
  void kv_bool(std::string_view key, bool v) { add_kv(key, 7, [&](Bytes& b) { b.put<uint8_t>(v ? 1 : 0); }); }
  void kv_string(std::string_view key, std::string_view v) {
    add_kv(key, 8, [&](Bytes& b) { b.put_string(v); });
  }
  void kv_strings(std::string_view key, const std::vector<std::string>& v) {
    add_kv(key, 9, [&](Bytes& b) {
      b.put<uint32_t>(8);
      b.put<uint64_t>(v.size());
      for (const auto& s : v) b.put_string(s);
    });
  }
  void kv_i32s(std::string_view key, const std::vector<int32_t>& v) {
    add_kv(key, 9, [&](Bytes& b) {
      b.put<uint32_t>(5);
      b.put<uint64_t>(v.size());
      for (int32_t x : v) b.put(x);
    });
  }
  void kv_f32s(std::string_view key, const std::vector<float>& v) {
    add_kv(key, 9, [&](Bytes& b) {
      b.put<uint32_t>(6);
      b.put<uint64_t>(v.size());
      for (float x : v) b.put(x);
    });
  }
  // Anything: the type id and the value bytes as given.
  template <typename F>
  void add_kv(std::string_view key, uint32_t type, F&& write_value) {
    Bytes b;
    b.put_string(key);
    b.put<uint32_t>(type);
    write_value(b);
    kvs.push_back(std::move(b.data));
  }

  struct Tensor {
    std::string name;
    std::vector<uint64_t> shape;
    uint32_t type;
    std::vector<std::byte> data;
    std::optional<uint64_t> offset;  // default: packed after the previous one, aligned
    bool place = true;               // false: only the info is written, no data
  };
  void tensor(std::string name, std::vector<uint64_t> shape, uint32_t type, std::vector<std::byte> data,
              std::optional<uint64_t> offset = std::nullopt) {
    tensors.push_back({std::move(name), std::move(shape), type, std::move(data), offset});
  }

  std::vector<std::byte> build() const {
    Bytes b;
    for (char c : magic) b.data.push_back(static_cast<std::byte>(c));
    b.put<uint32_t>(version);
    b.put<uint64_t>(tensor_count_override.value_or(tensors.size()));
    b.put<uint64_t>(kv_count_override.value_or(kvs.size()));
    for (const auto& kv : kvs) b.put_raw(kv);
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors) {
      const uint64_t off = t.offset.value_or((next + alignment - 1) / alignment * alignment);
      offsets.push_back(off);
      if (t.place) next = std::max(next, off + t.data.size());
      b.put_string(t.name);
      b.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
      for (uint64_t d : t.shape) b.put<uint64_t>(d);
      b.put<uint32_t>(t.type);
      b.put<uint64_t>(off);
    }
    while (b.data.size() % alignment != 0) b.data.push_back(std::byte{0});
    const size_t data_start = b.data.size();
    b.data.resize(data_start + next, std::byte{0});
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].place && !tensors[i].data.empty())
        std::memcpy(b.data.data() + data_start + offsets[i], tensors[i].data.data(), tensors[i].data.size());
    return b.data;
  }

  std::vector<std::vector<std::byte>> kvs;
  std::vector<Tensor> tensors;
};

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// The default model in the model cache (the rule of scripts/fetch-default-model),
// or nullopt.
inline std::optional<std::filesystem::path> default_model_path() {
  std::filesystem::path cache;
  if (const char* c = std::getenv("LOWBIT_CACHE_DIR"); c && *c) cache = c;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) cache = std::filesystem::path(x) / "lowbit";
  else if (const char* h = std::getenv("HOME"); h && *h) cache = std::filesystem::path(h) / ".cache" / "lowbit";
  else return std::nullopt;
  const auto p = cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  return p;
}

#define LOWBIT_DEFAULT_MODEL_OR_SKIP(var)                                                  \
  const auto var##_opt = ::lowbit::gguf::test::default_model_path();                       \
  if (!var##_opt)                                                                          \
    GTEST_SKIP() << "the default model SmolLM2-135M-Instruct.Q4_1.gguf is not in the model " \
                    "cache: run scripts/fetch-default-model";                              \
  const std::filesystem::path var = *var##_opt

}  // namespace lowbit::gguf::test
