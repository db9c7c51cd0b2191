// Helpers shared by the packers in src/formats (private to the module).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/tensor.h"
#include "lowbit/formats/host_tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats::detail {

inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

// Error(format) unless `t` is a contiguous CPU tensor of rank shape.size()
// whose dtype is `dtype` (or `alt`, when given) and whose extents equal `shape`
// (an entry -1 matches anything). `what` explains the expected shape.
inline void check_tensor(const TensorView& t, const char* name, DType dtype,
                         const std::vector<int64_t>& shape, const std::string& what,
                         std::optional<DType> alt = std::nullopt) {
  if (t.device != Device::cpu)
    fail(ErrorKind::unsupported, "tensor '", name, "' is in ", device_name(t.device),
         " memory: expected a CPU tensor");
  const bool dtype_ok = t.dtype == dtype || (alt && t.dtype == *alt);
  bool shape_ok = t.rank == static_cast<int>(shape.size());
  for (int d = 0; shape_ok && d < t.rank; ++d)
    shape_ok = shape[static_cast<size_t>(d)] < 0 || t.shape[d] == shape[static_cast<size_t>(d)];
  if (!dtype_ok || !shape_ok) {
    std::ostringstream expected;
    expected << dtype_name(dtype);
    if (alt) expected << " (or " << dtype_name(*alt) << ")";
    expected << ' ' << shape_string(shape);
    fail(ErrorKind::format, "tensor '", name, "' is ", dtype_name(t.dtype), ' ', t.shape_string(),
         ": expected ", expected.str(), " (", what, ")");
  }
  if (!t.is_contiguous())
    fail(ErrorKind::format, "tensor '", name, "' ", t.shape_string(),
         " is not contiguous: expected a row-major contiguous tensor");
}

// Word i of a contiguous i32/u32 tensor, as raw bits.
inline uint32_t word_at(const TensorView& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, static_cast<const char*>(t.data) + i * 4, 4);
  return w;
}

// An int32 tensor holding `words` bit for bit.
inline HostTensor words_tensor(const std::vector<uint32_t>& words, std::vector<int64_t> shape) {
  HostTensor t = HostTensor::make(DType::i32, std::move(shape));
  std::memcpy(t.bytes.data(), words.data(), words.size() * 4);
  return t;
}

// Error(invalid_argument) when `values` does not have `count` elements or
// holds a value above 15.
inline void check_nibbles(std::span<const uint8_t> values, int64_t count, int64_t cols,
                          const char* name, const char* what) {
  if (static_cast<int64_t>(values.size()) != count)
    fail(ErrorKind::invalid_argument, "invalid argument '", name, "' has ", values.size(),
         " elements: expected ", count, " (", what, ")");
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] > 15)
      fail(ErrorKind::invalid_argument, "invalid argument '", name, "[",
           static_cast<int64_t>(i) / cols, ", ", static_cast<int64_t>(i) % cols, "]' = ",
           int(values[i]), ": expected a 4-bit value 0..15");
}

// The integer zero point of every group and column ([G, N]) of a layer that
// has them: its zeros, or 8 everywhere for a symmetric layer. A float_min
// layer has none: Error(invalid_argument) naming `format`, which stores them.
inline std::vector<uint8_t> integer_zero_points(const QuantizedLinear& layer, const char* format) {
  if (layer.zero_point == ZeroPoint::float_min)
    fail(ErrorKind::invalid_argument, "invalid argument 'zero_point' = float_min: ", format,
         " stores integer zero points; expected symmetric or integer (convert with "
         "to_zero_point(layer, ZeroPoint::integer), exact when every min is -scale*z)");
  if (layer.zero_point == ZeroPoint::symmetric)
    return std::vector<uint8_t>(static_cast<size_t>(layer.num_groups() * layer.N), 8);
  return layer.zeros;
}

}  // namespace lowbit::formats::detail
