// A read-only memory map of a whole file: what the file readers (safetensors,
// GGUF) parse in place, so that opening a multi-GB checkpoint reads only the
// pages that are touched. Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace lowbit::io {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path`. `what` names it in errors (e.g. "GGUF file 'model.gguf'").
  // Throws Error(io) when it cannot be opened or mapped or is not a regular
  // file (saying when it is a directory), Error(unsupported) when it is larger
  // than the address space. An empty file maps to an empty span.
  static MappedFile open(const std::filesystem::path& path, const std::string& what);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return static_cast<const std::byte*>(map_); }
  uint64_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data(), static_cast<size_t>(size_)}; }
  bool mapped() const { return map_ != nullptr; }

 private:
  void release() noexcept;
  void* map_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace lowbit::io
