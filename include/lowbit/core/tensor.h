// A non-owning view of a tensor (pointer, shape, strides in elements, dtype,
// device) and an owning byte buffer on the host or on a CUDA device.
// Kernels take views; only the edges of the program (file readers, the
// engine, tests) own memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "lowbit/core/dtype.h"

namespace lowbit {

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);

inline constexpr int kMaxRank = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};  // in elements (u4x2: in 4-bit elements)

  // A contiguous row-major view. Throws Error(invalid_argument) on negative
  // extents or rank > kMaxRank.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu);

  int64_t numel() const;
  size_t nbytes() const { return dtype_bytes(dtype, static_cast<size_t>(numel())); }
  bool is_contiguous() const;
  int64_t dim(int i) const;  // negative i counts from the end; checked
  std::string shape_string() const;  // "[4096, 512]"

  template <typename T> T* as() const { return static_cast<T*>(data); }
};

// Owning, 64-byte aligned memory. Device memory needs a build with CUDA;
// otherwise allocating it throws Error(unsupported). Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Device device = Device::cpu, int device_index = 0);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  Device device() const { return device_; }
  int device_index() const { return device_index_; }
  template <typename T> T* as() const { return static_cast<T*>(data_); }

  // Copies `bytes` between any two places (host/host, host/device, device/device).
  static void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
  int device_index_ = 0;
};

}  // namespace lowbit
