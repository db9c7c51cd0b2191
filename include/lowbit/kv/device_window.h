// fp16 copies of each sequence's newest K/V on a CUDA device: the GPU side of
// the engine's KvOptions::fp16_window (engine/kv_store.h has the CPU side and
// docs/engine.md, "An fp16 window of recent tokens", the numbers).
//
// With a window of N tokens, the query at position p reads positions
// p - N + 1 .. p from these copies and every older position from the paged
// TurboQuant cache (device_cache.h). Every token is still quantized into the
// pages when it is written, so nothing is re-encoded when it leaves the
// window.
//
// Layout: per layer, one ring of `capacity` token slots per (sequence slot,
// KV head), position p at slot p % capacity, fp16 rows of head_dim values:
// K and V each [slots][num_kv_heads][capacity][head_dim]. A quantized part's
// copies are kept in the cache's rotated domain (x @ M, the layer's rotation,
// unnormalized), where the decode kernel scores keys and sums values: the
// window's partial result then merges with the code chunks' partials like
// one more chunk, and the merge's single un-rotation serves both. An fp16
// part's copies are its values as they are.
//
// A ring and not pages: the copies of a position are dead once the position
// is older than the window of every query still to come, and the newest
// positions overwrite them in place, with no allocator and no block table.
// `capacity` >= N + (the longest prefill block attended at once) - 1, so that
// a block's queries find all their window positions; the engine attends long
// prompt blocks in pieces (device_window_max_block).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/kv/paged_cache.h"

namespace lowbit::kv {

class DeviceKvCache;

class DeviceKvWindow {
 public:
  // Allocates the rings (zeroed) on the current device for `slots` sequence
  // slots. Throws Error(invalid_argument) for window < 1, capacity < window
  // or slots < 1.
  DeviceKvWindow(const KvCacheConfig& config, int64_t window, int64_t capacity, int slots);

  int64_t window() const { return window_; }
  int64_t capacity() const { return capacity_; }
  int slots() const { return slots_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  // fp16 [slots][num_kv_heads][capacity][head_dim] of one layer.
  void* k(int layer) const;
  void* v(int layer) const;
  // Every ring of every layer, K and V.
  int64_t bytes() const;

 private:
  int64_t window_ = 0, capacity_ = 0;
  int slots_ = 0, num_kv_heads_ = 0, head_dim_ = 0;
  std::vector<Buffer> k_, v_;
};

// The longest block of queries one windowed prefill call attends:
// capacity - window + 1 (its first query reads window - 1 positions before
// the block, its last the block's end).
int64_t device_window_max_block(const DeviceKvWindow& window);

// Stores the copies of positions first_pos .. first_pos + n - 1 into sequence
// slot `slot` (k, v: [n][num_kv_heads][head_dim] fp32 on the device, as
// device_write_tokens takes them), rotated as the cache rotates that part.
// Only the last `capacity` positions are stored: older ones would be
// overwritten by newer ones of the same call. Launched with PDL: it waits for
// the kernel before it (which made k and v) before it reads or writes.
void device_window_write(const DeviceKvCache& cache, const DeviceKvWindow& window, int layer, int slot,
                         int64_t first_pos, int64_t n, const float* k, const float* v, cudaStream_t stream = nullptr);

}  // namespace lowbit::kv
