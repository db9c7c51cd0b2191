// An owning, contiguous, row-major tensor in host memory: what the format
// packers in lowbit/formats return and what checkpoint tensors are copied into.
//
// Layout facts this header relies on:
//  - `bytes` holds numel() elements back to back in row-major (C) order, the
//    last dimension fastest, with no padding; its size is exactly
//    dtype_bytes(dtype, numel()).
//  - u4x2 tensors count 4-bit elements in `shape` (two per byte, lower index in
//    the low nibble, see lowbit/core/dtype.h); span<T>() is not available for
//    them (use `bytes`).
//  - A rank-0 tensor (empty `shape`) holds one element.
// For non-owning access use view(); kernels take TensorView, not HostTensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/tensor.h"

namespace lowbit {

// The DType of a C++ element type, including f16 and bf16 (which dtype_of
// in lowbit/core/dtype.h leaves out because dtype.h does not see half.h).
template <typename T>
constexpr DType element_dtype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, f16>) {
    return DType::f16;
  } else if constexpr (std::is_same_v<U, bf16>) {
    return DType::bf16;
  } else {
    return dtype_of<U>::value;
  }
}

namespace formats {

struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;

  // Product of the extents (1 for rank 0).
  int64_t numel() const;
  int rank() const { return static_cast<int>(shape.size()); }
  // "[512, 4096] i32".
  std::string describe() const;

  // The elements as T; throws Error(invalid_argument) when T is not the
  // element type of `dtype` (e.g. span<float>() of an i32 tensor).
  template <typename T>
  std::span<T> span() {
    check_element(element_dtype<T>());
    return {reinterpret_cast<T*>(bytes.data()), static_cast<size_t>(numel())};
  }
  template <typename T>
  std::span<const T> span() const {
    check_element(element_dtype<T>());
    return {reinterpret_cast<const T*>(bytes.data()), static_cast<size_t>(numel())};
  }

  // A contiguous CPU view of the data. The view is writable even when taken
  // from a const HostTensor (TensorView has no const flavour): do not write
  // through a view of a tensor you hold as const.
  TensorView view() const;

  // A zero-filled tensor. Throws Error(invalid_argument) on negative extents
  // or more than kMaxRank dimensions.
  static HostTensor make(DType dtype, std::vector<int64_t> shape);
  // A contiguous copy of any CPU view (any strides, except u4x2 which must be
  // contiguous) or of a contiguous device view (needs a CUDA build).
  static HostTensor copy_of(const TensorView& view);

  bool operator==(const HostTensor&) const = default;

 private:
  void check_element(DType requested) const;
};

}  // namespace formats
}  // namespace lowbit
