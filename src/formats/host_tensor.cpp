#include "lowbit/formats/host_tensor.h"

#include <cstring>
#include <sstream>

namespace lowbit::formats {

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::string HostTensor::describe() const {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "] " << dtype_name(dtype);
  return out.str();
}

void HostTensor::check_element(DType requested) const {
  if (requested != dtype)
    fail(ErrorKind::invalid_argument, "HostTensor::span<", dtype_name(requested),
         ">() on a tensor of dtype ", dtype_name(dtype), " (", describe(),
         "): expected the element type of the tensor's dtype");
}

TensorView HostTensor::view() const {
  LOWBIT_CHECK_ARG(shape.size() <= static_cast<size_t>(kMaxRank), "HostTensor.rank", shape.size(),
                   "at most 6 dimensions for a TensorView");
  TensorView v;
  v.data = const_cast<std::byte*>(bytes.data());
  v.dtype = dtype;
  v.device = Device::cpu;
  v.rank = rank();
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = stride;
    stride *= shape[d];
  }
  return v;
}

HostTensor HostTensor::make(DType dtype, std::vector<int64_t> shape) {
  LOWBIT_CHECK_ARG(shape.size() <= static_cast<size_t>(kMaxRank), "shape.rank", shape.size(),
                   "at most 6 dimensions");
  for (int64_t e : shape) LOWBIT_CHECK_ARG(e >= 0, "shape", e, "non-negative extents");
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(dtype_bytes(dtype, static_cast<size_t>(t.numel())), std::byte{0});
  return t;
}

HostTensor HostTensor::copy_of(const TensorView& view) {
  LOWBIT_CHECK_ARG(view.rank >= 0 && view.rank <= kMaxRank, "view.rank", view.rank, "0..6");
  HostTensor t = make(view.dtype, std::vector<int64_t>(view.shape.begin(), view.shape.begin() + view.rank));
  const int64_t n = t.numel();
  if (n == 0) return t;
  if (view.is_contiguous()) {
    Buffer::copy(t.bytes.data(), Device::cpu, view.data, view.device, t.bytes.size());
    return t;
  }
  if (view.dtype == DType::u4x2)
    fail(ErrorKind::invalid_argument, "HostTensor::copy_of: a u4x2 view ", view.shape_string(),
         " with strides that are not contiguous: expected a contiguous view (4-bit elements "
         "share bytes)");
  if (view.device != Device::cpu)
    fail(ErrorKind::unsupported, "HostTensor::copy_of: a non-contiguous ", device_name(view.device),
         " view ", view.shape_string(), ": expected a contiguous view for device memory");
  const size_t elem = dtype_bytes(view.dtype, 1);
  const auto* src = static_cast<const std::byte*>(view.data);
  std::byte* dst = t.bytes.data();
  std::array<int64_t, kMaxRank> index{};
  for (int64_t i = 0; i < n; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < view.rank; ++d) offset += index[d] * view.strides[d];
    std::memcpy(dst + static_cast<size_t>(i) * elem, src + offset * static_cast<int64_t>(elem), elem);
    for (int d = view.rank - 1; d >= 0; --d) {
      if (++index[d] < view.shape[d]) break;
      index[d] = 0;
    }
  }
  return t;
}

}  // namespace lowbit::formats
