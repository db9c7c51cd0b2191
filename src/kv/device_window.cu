// The fp16 window of each sequence's newest K/V on the device
// (device_window.h): the rings and the kernel that stores a block's copies.
// The window's attention is part of the decode call (device_attention.cu).
#include "lowbit/kv/device_window.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/kv/device_cache.h"
#include "lowbit/kv/window_warp.cuh"

namespace lowbit::kv {

DeviceKvWindow::DeviceKvWindow(const KvCacheConfig& config, int64_t window, int64_t capacity, int slots)
    : window_(window), capacity_(capacity), slots_(slots), num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim) {
  LOWBIT_CHECK_ARG(window >= 1, "window", window, "at least 1 token");
  LOWBIT_CHECK_ARG(capacity >= window && capacity < (int64_t{1} << 24), "capacity", capacity,
                   "at least the window (" + std::to_string(window) + ") and below 2^24 tokens");
  LOWBIT_CHECK_ARG(slots >= 1, "slots", slots, "at least 1 sequence slot");
  LOWBIT_CHECK_ARG(device_head_dim_supported(config.head_dim), "head_dim", config.head_dim,
                   "64 or 128 (the head dimensions the CUDA kernels are built for)");
  const size_t bytes = static_cast<size_t>(slots) * static_cast<size_t>(num_kv_heads_) *
                       static_cast<size_t>(capacity) * static_cast<size_t>(head_dim_) * 2;
  for (int l = 0; l < config.num_layers; ++l) {
    for (std::vector<Buffer>* rings : {&k_, &v_}) {
      rings->emplace_back(bytes, Device::cuda);
      LOWBIT_CUDA_CHECK(cudaMemset(rings->back().data(), 0, bytes));
    }
  }
}

void* DeviceKvWindow::k(int layer) const {
  LOWBIT_CHECK_ARG(layer >= 0 && layer < static_cast<int>(k_.size()), "layer", layer, "a layer of the window");
  return k_[static_cast<size_t>(layer)].data();
}

void* DeviceKvWindow::v(int layer) const {
  LOWBIT_CHECK_ARG(layer >= 0 && layer < static_cast<int>(v_.size()), "layer", layer, "a layer of the window");
  return v_[static_cast<size_t>(layer)].data();
}

int64_t DeviceKvWindow::bytes() const {
  int64_t total = 0;
  for (const Buffer& b : k_) total += static_cast<int64_t>(b.size());
  for (const Buffer& b : v_) total += static_cast<int64_t>(b.size());
  return total;
}

int64_t device_window_max_block(const DeviceKvWindow& window) { return window.capacity() - window.window() + 1; }

namespace {

struct WindowWriteArgs {
  __half* ring_k;  // the slot's rings: [num_kv_heads][capacity][D]
  __half* ring_v;
  WindowRotation rot_k, rot_v;
  int num_kv_heads;
  int64_t capacity, first_pos, skip, n;  // positions first_pos + skip .. first_pos + n - 1 are stored
  const float* k;
  const float* v;
};

// One CTA per (token, KV head): warp 0 stores its K, warp 1 its V.
template <int D>
__global__ void __launch_bounds__(64) window_write_kernel(WindowWriteArgs a) {
  cuda::pdl_wait();  // k and v come from the kernel before
  cuda::pdl_launch_dependents();
  __shared__ float stage[2][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = a.skip + blockIdx.x;
  const int h = blockIdx.y;
  const float* src = (warp == 0 ? a.k : a.v) + (i * a.num_kv_heads + h) * D;
  float x[D / 32];
#pragma unroll
  for (int u = 0; u < D / 32; ++u) x[u] = src[lane + 32 * u];
  const int64_t slot = (a.first_pos + i) % a.capacity;
  __half* dst = (warp == 0 ? a.ring_k : a.ring_v) + (h * a.capacity + slot) * D;
  store_window_vector_warp<D>(x, warp == 0 ? a.rot_k : a.rot_v, stage[warp], dst);
}

}  // namespace

void device_window_write(const DeviceKvCache& cache, const DeviceKvWindow& window, int layer, int slot,
                         int64_t first_pos, int64_t n, const float* k, const float* v, cudaStream_t stream) {
  const KvCacheConfig& c = cache.config();
  LOWBIT_CHECK_ARG(window.num_kv_heads() == c.num_kv_heads && window.head_dim() == c.head_dim, "window",
                   "another geometry", "a window made for this cache's config");
  LOWBIT_CHECK_ARG(slot >= 0 && slot < window.slots(), "slot", slot,
                   "0 to " + std::to_string(window.slots() - 1));
  LOWBIT_CHECK_ARG(first_pos >= 0 && n >= 1, "first_pos/n", std::to_string(first_pos) + "/" + std::to_string(n),
                   "a position >= 0 and at least one token");
  LOWBIT_CHECK_ARG(k != nullptr && v != nullptr, "k/v", "null", "device pointers to the K and V values");
  WindowWriteArgs a{};
  const int64_t ring = static_cast<int64_t>(slot) * c.num_kv_heads * window.capacity() * c.head_dim;
  a.ring_k = static_cast<__half*>(window.k(layer)) + ring;
  a.ring_v = static_cast<__half*>(window.v(layer)) + ring;
  const auto rotation_of = [&](KvFormat f) {
    WindowRotation r;
    if (!is_quantized(f)) return r;
    r.signs = cache.hadamard_signs(layer);
    if (r.signs == nullptr) r.matrix = cache.rotation(layer);
    return r;
  };
  a.rot_k = rotation_of(c.k_format);
  a.rot_v = rotation_of(c.v_format);
  a.num_kv_heads = c.num_kv_heads;
  a.capacity = window.capacity();
  a.first_pos = first_pos;
  a.skip = std::max<int64_t>(0, n - window.capacity());
  a.n = n;
  a.k = k;
  a.v = v;
  LOWBIT_CHECK_ARG(n - a.skip <= 0x7fffffff, "n", n, "fewer than 2^31 stored positions");
  const dim3 grid(static_cast<unsigned>(n - a.skip), static_cast<unsigned>(c.num_kv_heads));
  if (c.head_dim == 64) cuda::launch_with_pdl(window_write_kernel<64>, grid, dim3(64), 0, stream, a);
  else cuda::launch_with_pdl(window_write_kernel<128>, grid, dim3(64), 0, stream, a);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit::kv
