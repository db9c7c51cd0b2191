// Where a decode step's K/V vectors go and how they are quantized, as one
// plain struct that a kernel takes by value: what device_append_tokens
// (device_cache.h) does, for a kernel that stores them itself (the decode
// attention, DeviceDecodeOptions::append_k). Made by
// kv::device_append_target; the device side is kv/append_warp.cuh. Plain
// C++ header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lowbit::kv {

// One half of the cache (K or V) as the quantizer sees it.
struct KvAppendPart {
  const float* bounds = nullptr;     // device: nbounds Lloyd-Max boundaries (fp32)
  const float* centroids = nullptr;  // device: 2^bits centroids (fp32)
  int64_t rows_offset = 0, scales_offset = 0;  // in a (page, KV head) slab
  int32_t row_bytes = 0, scale_bytes = 0;
  int32_t bits = 16;  // 2, 3, 4 (TurboQuant) or 16 (fp16, stored as is)
  int32_t nbounds = 0;
};

struct KvAppendTarget {
  std::byte* pool = nullptr;  // the layer's pool
  int64_t slab_bytes = 0;
  const int32_t* tables = nullptr;  // [rows][table_stride] page numbers
  int64_t table_stride = 0;
  const int32_t* lengths = nullptr;  // row r's token goes to position lengths[r] - 1
  const float* signs = nullptr;      // the layer's Hadamard signs (device): the only rotation a warp applies
  int32_t num_kv_heads = 0, page_size = 0, head_dim = 0;
  bool renormalize = true, scale_f32 = false;
  KvAppendPart part[2];  // key, value
};

}  // namespace lowbit::kv
