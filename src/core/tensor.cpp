#include "lowbit/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <utility>

#include "lowbit/core/error.h"

#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/check.h"
#endif

namespace lowbit {

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  LOWBIT_CHECK_ARG(shape.size() <= static_cast<size_t>(kMaxRank), "shape.rank", shape.size(),
                   "at most 6 dimensions");
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t e : shape) {
    LOWBIT_CHECK_ARG(e >= 0, "shape", e, "non-negative extents");
    v.shape[i++] = e;
  }
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

int64_t TensorView::dim(int i) const {
  const int j = i < 0 ? i + rank : i;
  LOWBIT_CHECK_ARG(j >= 0 && j < rank, "dim", i, "an index within the tensor's rank");
  return shape[j];
}

std::string TensorView::shape_string() const {
  std::ostringstream out;
  out << '[';
  for (int d = 0; d < rank; ++d) out << (d ? ", " : "") << shape[d];
  out << ']';
  return out.str();
}

Buffer::Buffer(size_t bytes, Device device, int device_index)
    : bytes_(bytes), device_(device), device_index_(device_index) {
  if (bytes == 0) return;
  if (device == Device::cpu) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (data_ == nullptr)
      fail(ErrorKind::io, "out of host memory allocating ", bytes, " bytes");
    return;
  }
#ifdef LOWBIT_WITH_CUDA
  cuda::DeviceGuard guard(device_index);
  LOWBIT_CUDA_CHECK(cudaMalloc(&data_, bytes));
#else
  bytes_ = 0;
  fail(ErrorKind::unsupported, "cannot allocate ", bytes,
       " bytes of device memory: this lowbit was built without CUDA (LOWBIT_CUDA=OFF or no nvcc)");
#endif
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      device_index_(other.device_index_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    device_index_ = other.device_index_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  if (device_ == Device::cpu) {
    std::free(data_);
  } else {
#ifdef LOWBIT_WITH_CUDA
    cudaFree(data_);  // errors here cannot be reported from a destructor
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
}

void Buffer::copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef LOWBIT_WITH_CUDA
  LOWBIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  fail(ErrorKind::unsupported, "cannot copy to or from device memory: built without CUDA");
#endif
}

}  // namespace lowbit
