// The device KV cache (pools, rotations, block tables) and the kernels that
// quantize K/V into it: one warp per vector where the rotation is Hadamard
// (or the parts are fp16), else one thread per coordinate (Haar's matrix).
// Both reproduce VectorQuantizer::quantize
// operation by operation, because the cache's bytes are what CPU and GPU
// compare:
//  - ||x||^2 in double (products of floats are exact in double; only the
//    summation order differs, below fp32's rounding of the norm);
//  - x / gamma as an IEEE fp32 division;
//  - haar: y_j = sum_i unit_i M[i][j] as separate fp32 multiply and add in
//    increasing i (__fmul_rn / __fadd_rn: nvcc would otherwise fuse them into
//    FMAs, which the host code does not use), so y is bit-identical;
//    hadamard: the same butterflies (strides 1, 2, 4, ...) in fp32;
//  - fp32 compares against the same fp32 boundaries;
//  - the renormalized scale from the double norm and the double ||c[idx]||.
#include "lowbit/kv/device_cache.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/kv/append_warp.cuh"

namespace lowbit::kv {

// ---------------------------------------------------------------- the cache --

DeviceKvCache::DeviceKvCache(const KvCacheConfig& config) : config_(config) {
  config_.validate();
  LOWBIT_CHECK_ARG(device_head_dim_supported(config_.head_dim), "head_dim", config_.head_dim,
                   "64 or 128 (the head dimensions the CUDA kernels are built for)");
  // The host cache computes the layout; a one-page host cache of the same
  // config is cheap and keeps a single definition of it.
  KvCacheConfig probe = config_;
  probe.num_layers = 1;
  probe.num_pages = 1;
  const PagedKvCache host(probe);
  layout_ = host.layout();
  pool_bytes_ = config_.num_pages * config_.num_kv_heads * layout_.bytes;
  const QuantizerOptions options{config_.scale_dtype, config_.renormalize, config_.codebook};
  if (is_quantized(config_.k_format))
    k_quantizer_ = std::make_unique<VectorQuantizer>(kv_format_bits(config_.k_format), config_.head_dim, options);
  if (is_quantized(config_.v_format))
    v_quantizer_ = std::make_unique<VectorQuantizer>(kv_format_bits(config_.v_format), config_.head_dim, options);
  const size_t d = static_cast<size_t>(config_.head_dim);
  for (int l = 0; l < config_.num_layers; ++l) {
    pools_.emplace_back(static_cast<size_t>(pool_bytes_), Device::cuda);
    LOWBIT_CUDA_CHECK(cudaMemset(pools_.back().data(), 0, pools_.back().size()));
    const Rotation r = Rotation::make(config_.rotation, config_.head_dim,
                                      layer_rotation_seed(config_.rotation_seed_base, l));
    const std::vector<float> m = r.dense_matrix();
    std::vector<float> mt(m.size());
    for (size_t i = 0; i < d; ++i)
      for (size_t j = 0; j < d; ++j) mt[j * d + i] = m[i * d + j];
    rotations_.emplace_back(m.size() * 4, Device::cuda);
    Buffer::copy(rotations_.back().data(), Device::cuda, m.data(), Device::cpu, m.size() * 4);
    rotations_t_.emplace_back(mt.size() * 4, Device::cuda);
    Buffer::copy(rotations_t_.back().data(), Device::cuda, mt.data(), Device::cpu, mt.size() * 4);
    if (config_.rotation == RotationKind::hadamard) {
      signs_.emplace_back(d * 4, Device::cuda);
      Buffer::copy(signs_.back().data(), Device::cuda, r.signs().data(), Device::cpu, d * 4);
    } else {
      signs_.emplace_back();
    }
  }
  std::vector<float> books(64, 0.0f);
  for (int p = 0; p < 2; ++p) {
    const VectorQuantizer* q = p == 0 ? k_quantizer_.get() : v_quantizer_.get();
    if (q == nullptr) continue;
    const Codebook& book = q->codebook();
    std::copy(book.boundaries_f32.begin(), book.boundaries_f32.end(), books.begin() + 32 * p);
    std::copy(book.centroids_f32.begin(), book.centroids_f32.end(), books.begin() + 32 * p + 16);
  }
  codebooks_ = Buffer(books.size() * 4, Device::cuda);
  Buffer::copy(codebooks_.data(), Device::cuda, books.data(), Device::cpu, books.size() * 4);
}

namespace {
void check_layer_index(int layer, int num_layers) {
  LOWBIT_CHECK_ARG(layer >= 0 && layer < num_layers, "layer", layer,
                   "0 to num_layers - 1 = " + std::to_string(num_layers - 1));
}
}  // namespace

std::byte* DeviceKvCache::pool(int layer) const {
  check_layer_index(layer, config_.num_layers);
  return pools_[static_cast<size_t>(layer)].as<std::byte>();
}
const float* DeviceKvCache::rotation(int layer) const {
  check_layer_index(layer, config_.num_layers);
  return rotations_[static_cast<size_t>(layer)].as<const float>();
}
const float* DeviceKvCache::rotation_t(int layer) const {
  check_layer_index(layer, config_.num_layers);
  return rotations_t_[static_cast<size_t>(layer)].as<const float>();
}
const float* DeviceKvCache::hadamard_signs(int layer) const {
  check_layer_index(layer, config_.num_layers);
  return signs_[static_cast<size_t>(layer)].as<const float>();
}
const float* DeviceKvCache::device_codebook(KvPart part) const {
  return codebooks_.as<const float>() + (part == KvPart::key ? 0 : 32);
}

void DeviceKvCache::upload(const PagedKvCache& host) {
  const KvCacheConfig& h = host.config();
  const bool same = h.num_layers == config_.num_layers && h.num_kv_heads == config_.num_kv_heads &&
                    h.head_dim == config_.head_dim && h.page_size == config_.page_size &&
                    h.num_pages == config_.num_pages && h.k_format == config_.k_format &&
                    h.v_format == config_.v_format && h.scale_dtype == config_.scale_dtype &&
                    h.rotation == config_.rotation && h.rotation_seed_base == config_.rotation_seed_base;
  if (!same)
    fail(ErrorKind::invalid_argument,
         "invalid argument 'host': its config differs from the device cache's (layers, heads, head_dim, "
         "page_size, num_pages, formats, scale dtype and rotation must all match)");
  for (int l = 0; l < config_.num_layers; ++l) {
    const std::span<const std::byte> src = host.layer_pool(l);
    Buffer::copy(pool(l), Device::cuda, src.data(), Device::cpu, src.size());
  }
}

std::vector<std::byte> DeviceKvCache::download_pool(int layer) const {
  std::vector<std::byte> out(static_cast<size_t>(pool_bytes_));
  Buffer::copy(out.data(), Device::cpu, pool(layer), Device::cuda, out.size());
  return out;
}

// ------------------------------------------------------------ block tables --

namespace {
// The checked, flattened form of explicit tables: [rows][stride] pages and
// the lengths, with t's rows, stride, host_lengths and max_length set.
void flatten_tables(std::span<const std::vector<int32_t>> tables, std::span<const int64_t> lengths,
                    int page_size, DeviceBlockTables& t, std::vector<int32_t>& flat, std::vector<int32_t>& lens) {
  LOWBIT_CHECK_ARG(!tables.empty() && tables.size() == lengths.size(), "tables", tables.size(),
                   "one table per length (" + std::to_string(lengths.size()) + "), at least one");
  LOWBIT_CHECK_ARG(page_size >= kMinPageSize, "page_size", page_size, "at least 16");
  t.rows = static_cast<int>(tables.size());
  t.stride = 1;
  t.max_length = 0;
  for (size_t r = 0; r < tables.size(); ++r) {
    const int64_t len = lengths[r];
    LOWBIT_CHECK_ARG(len >= 0 && len < (int64_t{1} << 31), "lengths[" + std::to_string(r) + "]", len,
                     "0 to 2^31 - 1");
    const int64_t pages = (len + page_size - 1) / page_size;
    LOWBIT_CHECK_ARG(static_cast<int64_t>(tables[r].size()) >= pages, "tables[" + std::to_string(r) + "]",
                     tables[r].size(), "at least ceil(length / page_size) = " + std::to_string(pages) + " pages");
    t.stride = std::max<int64_t>(t.stride, static_cast<int64_t>(tables[r].size()));
    t.max_length = std::max(t.max_length, len);
  }
  flat.assign(static_cast<size_t>(t.rows * t.stride), 0);
  lens.resize(static_cast<size_t>(t.rows));
  for (size_t r = 0; r < tables.size(); ++r) {
    std::copy(tables[r].begin(), tables[r].end(), flat.begin() + static_cast<int64_t>(r) * t.stride);
    lens[r] = static_cast<int32_t>(lengths[r]);
  }
  t.host_lengths.assign(lengths.begin(), lengths.end());
}
}  // namespace

DeviceBlockTables DeviceBlockTables::from_host(std::span<const std::vector<int32_t>> tables,
                                               std::span<const int64_t> lengths, int page_size) {
  DeviceBlockTables t;
  std::vector<int32_t> flat, lens;
  flatten_tables(tables, lengths, page_size, t, flat, lens);
  t.tables = Buffer(flat.size() * 4, Device::cuda);
  Buffer::copy(t.tables.data(), Device::cuda, flat.data(), Device::cpu, flat.size() * 4);
  t.lengths = Buffer(lens.size() * 4, Device::cuda);
  Buffer::copy(t.lengths.data(), Device::cuda, lens.data(), Device::cpu, lens.size() * 4);
  return t;
}

void DeviceBlockTables::assign(std::span<const std::vector<int32_t>> tables, std::span<const int64_t> lengths,
                               int page_size, cudaStream_t stream) {
  std::vector<int32_t> flat, lens;
  DeviceBlockTables next;
  flatten_tables(tables, lengths, page_size, next, flat, lens);  // checks before anything changes
  rows = next.rows;
  stride = next.stride;
  max_length = next.max_length;
  host_lengths = std::move(next.host_lengths);
  if (this->tables.size() < flat.size() * 4) this->tables = Buffer(flat.size() * 4, Device::cuda);
  if (this->lengths.size() < lens.size() * 4) this->lengths = Buffer(lens.size() * 4, Device::cuda);
  // Pageable sources: each copy is staged before the call returns, so the
  // vectors may go; the device side runs in stream order.
  LOWBIT_CUDA_CHECK(
      cudaMemcpyAsync(this->tables.data(), flat.data(), flat.size() * 4, cudaMemcpyHostToDevice, stream));
  LOWBIT_CUDA_CHECK(
      cudaMemcpyAsync(this->lengths.data(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, stream));
}

DeviceBlockTables DeviceBlockTables::from_cache(const PagedKvCache& cache, std::span<const int> seqs) {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> lengths;
  for (int s : seqs) {
    const std::span<const int32_t> t = cache.block_table(s);
    tables.emplace_back(t.begin(), t.end());
    lengths.push_back(cache.length(s));
  }
  return from_host(tables, lengths, cache.config().page_size);
}

// --------------------------------------------------------------- workspace --

namespace {
float* grow(Buffer& b, size_t floats) {
  if (b.size() < floats * 4) b = Buffer(std::max<size_t>(floats * 4, 256), Device::cuda);
  return b.as<float>();
}
}  // namespace

float* AttentionWorkspace::q_rotated(size_t floats) { return grow(q_, floats); }
float* AttentionWorkspace::partial_out(size_t floats) { return grow(out_, floats); }
float* AttentionWorkspace::partial_lse(size_t floats) { return grow(lse_, floats); }

// ------------------------------------------------------------ write kernel --

namespace {

constexpr int kWriteVectors = 8;     // vectors quantized together (one load of M[i][j] serves all)

struct PartFormat {
  int bits = 0;                // 2, 3, 4; 16 = fp16 pass-through
  int nbounds = 0;
  float bounds[15] = {};
  float centroids[16] = {};
  int64_t rows_offset = 0, scales_offset = 0, row_bytes = 0, scale_bytes = 0;
};

struct WriteArgs {
  std::byte* pool;
  int64_t slab_bytes;
  int num_kv_heads, page_size;
  const int32_t* tables;
  int64_t table_stride;
  const int32_t* lengths;
  int row;            // prefill: the row written; -1: decode (token n is row n at lengths[n] - 1)
  int64_t first_pos;  // prefill only
  int64_t n_tokens;
  const float* k;
  const float* v;
  const float* rot;    // M, row-major
  const float* signs;  // hadamard signs or nullptr (then haar)
  bool renormalize, scale_f32;
  PartFormat part[2];  // key, value
};

// The kernel runs one thread per coordinate: D threads. The block's sum in
// the order of the warp append (append_warp.cuh, sum_double_over_lanes):
// gathered into one warp's layout, which every warp then sums alike.
template <int D>
__device__ double block_sum_double(double x, double* scratch) {
  __syncthreads();  // scratch may still be read from the previous call
  scratch[threadIdx.x] = x;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  double v[D / 32];
#pragma unroll
  for (int u = 0; u < D / 32; ++u) v[u] = scratch[lane + 32 * u];
  return sum_double_over_lanes<D>(v);
}

// kVectors: vectors quantized together per CTA (one load of M[i][j] serves
// them all). 8 for prefill-sized calls; 1 for decode, whose 2 x heads x batch
// vectors would otherwise run on a handful of CTAs, each working through 8
// vectors one barrier-separated step at a time.
template <int kVectors, int D>
__global__ void __launch_bounds__(D) write_kernel(WriteArgs a) {
  constexpr int kD = D, kWriteThreads = D;
  extern __shared__ float4 smem_f4[];
  float* m_s = reinterpret_cast<float*>(smem_f4);      // [d][d]
  float* x_s = m_s + kD * kD;                           // [kVectors][d]
  uint8_t* idx_s = reinterpret_cast<uint8_t*>(x_s + kVectors * kD);  // [kVectors][d]
  __shared__ double scratch[kWriteThreads];
  const int j = threadIdx.x;
  const bool haar = a.signs == nullptr;
  if (haar) {
    // 64 KB per CTA at d = 128: float4 loads, all D / 4 of a thread in flight
    // at once, one round trip (one 4-byte load per loop trip was ~30 us of L2
    // round trips at decode, most of the append's time; eight in flight, four
    // round trips from HBM on the critical path of a decode step).
    constexpr int kVecs = kD * kD / 4, kInFlight = kD * kD / 4 / kWriteThreads;  // all of it in one round
    const float4* src = reinterpret_cast<const float4*>(a.rot);
    float4* dst = reinterpret_cast<float4*>(m_s);
    for (int base = j; base < kVecs; base += kInFlight * kWriteThreads) {
      float4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
        if (base + u * kWriteThreads < kVecs) v[u] = __ldg(src + base + u * kWriteThreads);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
        if (base + u * kWriteThreads < kVecs) dst[base + u * kWriteThreads] = v[u];
    }
  }
  // Programmatic dependent launch (lowbit/cuda/pdl.cuh): the rotation, which
  // no kernel writes, was loaded above while the previous kernel finished;
  // k/v and the cache pages are touched only after it completed.
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  const int H = a.num_kv_heads;
  const int64_t items = a.n_tokens * H * 2;
  const int64_t batches = (items + kVectors - 1) / kVectors;
  const float hadamard_norm = static_cast<float>(1.0 / sqrt(static_cast<double>(kD)));

  for (int64_t batch = blockIdx.x; batch < batches; batch += gridDim.x) {
    float y[kVectors];
    double gamma_exact[kVectors];
    float xv[kVectors];
    std::byte* slab_of[kVectors];  // the (page, head) slab each vector goes to
    int slot_of[kVectors];
    // Every global load of the batch first: the vectors, then where each one
    // goes (the sequence length, then its page). Loaded inside the per-vector
    // loops below, behind their barriers, they were one L2 round trip per
    // vector each: most of a decode step's append time.
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const int64_t item = batch * kVectors + v;
      xv[v] = 0.0f;
      slab_of[v] = nullptr;
      slot_of[v] = 0;
      if (item < items) {
        const int64_t token = item / (2 * H);
        const int h = static_cast<int>((item / 2) % H);
        const float* src = (item % 2 == 0) ? a.k : a.v;
        xv[v] = src[(token * H + h) * kD + j];
        const int row = a.row < 0 ? static_cast<int>(token) : a.row;
        const int64_t pos = a.row < 0 ? a.lengths[row] - 1 : a.first_pos + token;
        const int32_t page = a.tables[row * a.table_stride + pos / a.page_size];
        slot_of[v] = static_cast<int>(pos % a.page_size);
        slab_of[v] = a.pool + (static_cast<int64_t>(page) * H + h) * a.slab_bytes;
      }
    }
    for (int v = 0; v < kVectors; ++v) {
      const double sq = static_cast<double>(xv[v]) * xv[v];
      gamma_exact[v] = sqrt(block_sum_double<D>(sq, scratch));
      const float gamma = static_cast<float>(gamma_exact[v]);
      x_s[v * kD + j] = gamma > 0.0f ? xv[v] / gamma : 0.0f;
    }
    __syncthreads();
    if (haar) {
      float acc[kVectors] = {};
      for (int i = 0; i < kD; ++i) {
        const float m = m_s[i * kD + j];
#pragma unroll
        for (int v = 0; v < kVectors; ++v) acc[v] = __fadd_rn(acc[v], __fmul_rn(x_s[v * kD + i], m));
      }
      for (int v = 0; v < kVectors; ++v) y[v] = acc[v];
    } else {
      // x * s, then the Walsh-Hadamard butterflies in place, stride 1, 2, 4, ...
      for (int v = 0; v < kVectors; ++v) x_s[v * kD + j] = __fmul_rn(x_s[v * kD + j], a.signs[j]);
      for (int hstride = 1; hstride < kD; hstride *= 2) {
        __syncthreads();
        for (int p = j; p < kVectors * kD / 2; p += kWriteThreads) {
          const int v = p / (kD / 2), q = p % (kD / 2);
          const int lo = (q / hstride) * 2 * hstride + q % hstride;
          float* row = x_s + v * kD;
          const float b0 = row[lo], b1 = row[lo + hstride];
          row[lo] = __fadd_rn(b0, b1);
          row[lo + hstride] = __fsub_rn(b0, b1);
        }
      }
      __syncthreads();
      for (int v = 0; v < kVectors; ++v) y[v] = __fmul_rn(x_s[v * kD + j], hadamard_norm);
    }

    for (int v = 0; v < kVectors; ++v) {
      const int64_t item = batch * kVectors + v;
      const int part_index = static_cast<int>(item % 2);
      const PartFormat& f = a.part[part_index];
      int idx = 0;
      for (int b = 0; b < f.nbounds; ++b) idx += (y[v] >= f.bounds[b]) ? 1 : 0;
      idx_s[v * kD + j] = static_cast<uint8_t>(idx);
      const double c = f.bits <= 4 ? static_cast<double>(f.centroids[idx]) : 0.0;
      const double cn2 = block_sum_double<D>(c * c, scratch);  // uniform across the block: no divergence
      if (item >= items) continue;
      const int slot = slot_of[v];
      std::byte* slab = slab_of[v];
      std::byte* dst = slab + f.rows_offset + slot * f.row_bytes;
      if (f.bits == 16) {
        reinterpret_cast<__half*>(dst)[j] = __float2half_rn(xv[v]);
        continue;
      }
      if (j == 0) {
        const float gamma = static_cast<float>(gamma_exact[v]);
        float value = gamma;
        if (a.renormalize && gamma > 0.0f) value = static_cast<float>(gamma_exact[v] / sqrt(cn2));
        std::byte* s = slab + f.scales_offset + slot * f.scale_bytes;
        if (a.scale_f32)
          *reinterpret_cast<float*>(s) = value;
        else
          *reinterpret_cast<__half*>(s) = __float2half_rn(value);
      }
      __syncwarp();
    }
    __syncthreads();  // idx_s complete
    for (int v = 0; v < kVectors; ++v) {
      const int64_t item = batch * kVectors + v;
      if (item >= items) break;
      const PartFormat& f = a.part[item % 2];
      if (f.bits == 16) continue;
      uint8_t* dst = reinterpret_cast<uint8_t*>(slab_of[v] + f.rows_offset + slot_of[v] * f.row_bytes);
      const uint8_t* ix = idx_s + v * kD;
      if (f.bits == 4) {
        if (j < kD / 2) dst[j] = static_cast<uint8_t>(ix[2 * j] | (ix[2 * j + 1] << 4));
      } else {
        // 2-bit plane (the whole index for tq2, the low bits for tq3)
        if (j < kD / 4)
          dst[j] = static_cast<uint8_t>((ix[4 * j] & 3) | ((ix[4 * j + 1] & 3) << 2) | ((ix[4 * j + 2] & 3) << 4) |
                                        ((ix[4 * j + 3] & 3) << 6));
        if (f.bits == 3 && j < kD / 8) {
          uint8_t hb = 0;
          for (int k = 0; k < 8; ++k) hb = static_cast<uint8_t>(hb | (((ix[8 * j + k] >> 2) & 1) << k));
          dst[kD / 4 + j] = hb;
        }
      }
    }
    __syncthreads();  // x_s / idx_s reused by the next batch
  }
}

// One warp per vector: the decode attention's append (append_warp.cuh), as
// a kernel of its own for prefill blocks and appends. Why: the
// per-coordinate kernel above gives every vector two block-wide double sums
// and, with a Hadamard rotation, seven barrier-separated butterfly stages,
// eight vectors at a time in 128 threads; a 1k-token prefill of Qwen3-14B
// (16k vectors per layer) took ~150 us per layer there, a quarter of the
// prefill's non-GEMM time. Here a warp needs no barrier at all: the norm and
// the butterflies are lane shuffles. The arithmetic is the per-coordinate
// kernel's, operation for operation, so the bytes are the same (tested).
// Grid: (CTAs, 2), y = the part (K, V), so a warp's codebook and signs are
// loaded once; each warp then takes (token, KV head) vectors in turn.
constexpr int kWarpWriteWarps = 8;

template <int D>
__global__ void __launch_bounds__(kWarpWriteWarps * 32)
    write_warp_kernel(KvAppendTarget t, int row, int64_t first_pos, int64_t n_tokens, const float* k, const float* v) {
  __shared__ uint8_t scratch[kWarpWriteWarps][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = static_cast<int>(blockIdx.y);
  // Every input (the vectors, the lengths, the pages) may come from the
  // kernel before this one: nothing is read before the wait.
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  KvAppendPlan p = append_plan_begin<D>(t, part, 0, 0);  // the codebook and signs; row and slot per vector below
  const int H = t.num_kv_heads;
  const int64_t vectors = n_tokens * H;
  const float* src = part == 0 ? k : v;
  for (int64_t item = int64_t{blockIdx.x} * kWarpWriteWarps + warp; item < vectors;
       item += int64_t{gridDim.x} * kWarpWriteWarps) {
    const int64_t token = item / H;
    p.kv_head = static_cast<int>(item - token * H);
    p.row = row < 0 ? static_cast<int>(token) : row;
    p.length = row < 0 ? t.lengths[p.row] : static_cast<int32_t>(first_pos + token + 1);
    append_plan_slot(t, p);
    float x[D / 32];
#pragma unroll
    for (int u = 0; u < D / 32; ++u) x[u] = src[item * D + lane + 32 * u];
    append_vector_warp<D>(t, p, x, scratch[warp]);
  }
}

PartFormat part_format(const DeviceKvCache& cache, KvPart part) {
  PartFormat f;
  const PageLayout& l = cache.layout();
  const bool key = part == KvPart::key;
  f.rows_offset = key ? l.k_rows : l.v_rows;
  f.scales_offset = key ? l.k_scales : l.v_scales;
  f.row_bytes = key ? l.k_row_bytes : l.v_row_bytes;
  f.scale_bytes = key ? l.k_scale_bytes : l.v_scale_bytes;
  const VectorQuantizer* q = cache.quantizer(part);
  if (q == nullptr) {
    f.bits = 16;
    return f;
  }
  f.bits = q->bits();
  const Codebook& book = q->codebook();
  f.nbounds = static_cast<int>(book.boundaries_f32.size());
  for (int i = 0; i < f.nbounds; ++i) f.bounds[i] = book.boundaries_f32[static_cast<size_t>(i)];
  for (int i = 0; i < book.levels(); ++i) f.centroids[i] = book.centroids_f32[static_cast<size_t>(i)];
  return f;
}

KvAppendTarget append_target_of(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables);

// Whether one warp can quantize this cache's vectors (append_warp.cuh): it
// applies the Hadamard rotation only, as lane shuffles; fp16 parts need none.
bool warp_quantizable(const DeviceKvCache& cache) {
  const bool quantized_part = cache.quantizer(KvPart::key) != nullptr || cache.quantizer(KvPart::value) != nullptr;
  return !quantized_part || cache.config().rotation == RotationKind::hadamard;
}

void launch_write(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int row, int64_t first_pos,
                  int64_t n_tokens, const float* k, const float* v, cudaStream_t stream, KvWriteKernel kernel) {
  LOWBIT_CHECK_ARG(k != nullptr && v != nullptr, "k/v", "null", "device pointers to the K and V values");
  const KvCacheConfig& c = cache.config();
  int device = 0, sms = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (kernel == KvWriteKernel::automatic && warp_quantizable(cache)) {
    const KvAppendTarget t = append_target_of(cache, layer, tables);
    const int64_t vectors = n_tokens * c.num_kv_heads;
    // Four CTAs of 8 warps per SM at most; each warp then takes its vectors in turn.
    const int64_t ctas = std::min<int64_t>((vectors + kWarpWriteWarps - 1) / kWarpWriteWarps, 4 * int64_t{sms});
    const dim3 grid(static_cast<unsigned>(ctas), 2);
    if (c.head_dim == 64)
      cuda::launch_with_pdl(write_warp_kernel<64>, grid, dim3(kWarpWriteWarps * 32), 0, stream, t, row, first_pos,
                            n_tokens, k, v);
    else
      cuda::launch_with_pdl(write_warp_kernel<128>, grid, dim3(kWarpWriteWarps * 32), 0, stream, t, row, first_pos,
                            n_tokens, k, v);
    LOWBIT_CUDA_CHECK_LAUNCH();
    return;
  }
  WriteArgs a{};
  a.pool = cache.pool(layer);
  a.slab_bytes = cache.layout().bytes;
  a.num_kv_heads = c.num_kv_heads;
  a.page_size = c.page_size;
  a.tables = tables.tables.as<const int32_t>();
  a.table_stride = tables.stride;
  a.lengths = tables.lengths.as<const int32_t>();
  a.row = row;
  a.first_pos = first_pos;
  a.n_tokens = n_tokens;
  a.k = k;
  a.v = v;
  a.rot = cache.rotation(layer);
  a.signs = cache.hadamard_signs(layer);
  a.renormalize = c.renormalize;
  a.scale_f32 = c.scale_dtype == ScaleDType::f32;
  a.part[0] = part_format(cache, KvPart::key);
  a.part[1] = part_format(cache, KvPart::value);
  const int64_t vectors = n_tokens * c.num_kv_heads * 2;
  const size_t d = static_cast<size_t>(c.head_dim);
  auto launch = [&](auto kernel, int per_cta) {
    const size_t smem = sizeof(float) * (d * d + static_cast<size_t>(per_cta) * d) + per_cta * d;
    cuda::ensure_dynamic_smem(kernel, static_cast<int>(smem));
    const int64_t batches = (vectors + per_cta - 1) / per_cta;
    // Each CTA loads M (64 KB at d = 128) once: few enough CTAs that this stays small
    // beside the K/V traffic, enough for every SM to hold two.
    const int grid = static_cast<int>(std::min<int64_t>(batches, 2 * int64_t{sms}));
    cuda::launch_with_pdl(kernel, dim3(grid), dim3(static_cast<unsigned>(d)), smem, stream, a);
  };
  // Up to one vector per CTA while that stays within 64 CTAs (4 MB of
  // rotation loads from L2 at d = 128): a batch-4 decode step of 8 KV heads.
  const bool one = vectors <= 64;
  if (d == 64) {
    if (one) launch(write_kernel<1, 64>, 1);
    else launch(write_kernel<kWriteVectors, 64>, kWriteVectors);
  } else {
    if (one) launch(write_kernel<1, 128>, 1);
    else launch(write_kernel<kWriteVectors, 128>, kWriteVectors);
  }
}

}  // namespace

namespace {
// device_append_target without the rotation check (the caller made it).
KvAppendTarget append_target_of(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables) {
  const KvCacheConfig& c = cache.config();
  KvAppendTarget t;
  t.pool = cache.pool(layer);
  t.slab_bytes = cache.layout().bytes;
  t.tables = tables.tables.as<const int32_t>();
  t.table_stride = tables.stride;
  t.lengths = tables.lengths.as<const int32_t>();
  t.signs = cache.hadamard_signs(layer);
  t.num_kv_heads = c.num_kv_heads;
  t.page_size = c.page_size;
  t.head_dim = c.head_dim;
  t.renormalize = c.renormalize;
  t.scale_f32 = c.scale_dtype == ScaleDType::f32;
  for (KvPart part : {KvPart::key, KvPart::value}) {
    const PartFormat f = part_format(cache, part);
    KvAppendPart& p = t.part[part == KvPart::key ? 0 : 1];
    p.bounds = cache.device_codebook(part);
    p.centroids = p.bounds + 16;
    p.rows_offset = f.rows_offset;
    p.scales_offset = f.scales_offset;
    p.row_bytes = static_cast<int32_t>(f.row_bytes);
    p.scale_bytes = static_cast<int32_t>(f.scale_bytes);
    p.bits = f.bits;
    p.nbounds = f.nbounds;
  }
  return t;
}
}  // namespace

KvAppendTarget device_append_target(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables) {
  if (!warp_quantizable(cache))
    throw Error(ErrorKind::unsupported,
                "device_append_target: K/V quantized with Haar rotations are appended by device_append_tokens "
                "(a 64 KB matrix per layer); a kernel's epilogue applies only the Hadamard rotation");
  return append_target_of(cache, layer, tables);
}

void device_append_tokens(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, const float* k,
                          const float* v, cudaStream_t stream, KvWriteKernel kernel) {
  for (int r = 0; r < tables.rows; ++r)
    LOWBIT_CHECK_ARG(tables.host_lengths[static_cast<size_t>(r)] >= 1, "tables.lengths[" + std::to_string(r) + "]",
                     tables.host_lengths[static_cast<size_t>(r)], "at least 1 (extend the sequence first)");
  launch_write(cache, layer, tables, -1, 0, tables.rows, k, v, stream, kernel);
}

void device_write_tokens(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int row,
                         int64_t first_pos, int64_t n_tokens, const float* k, const float* v, cudaStream_t stream,
                         KvWriteKernel kernel) {
  LOWBIT_CHECK_ARG(row >= 0 && row < tables.rows, "row", row, "0 to rows - 1 = " + std::to_string(tables.rows - 1));
  LOWBIT_CHECK_ARG(n_tokens >= 1, "n_tokens", n_tokens, "at least 1");
  const int64_t len = tables.host_lengths[static_cast<size_t>(row)];
  LOWBIT_CHECK_ARG(first_pos >= 0 && first_pos + n_tokens <= len, "first_pos", first_pos,
                   "first_pos + n_tokens within the row's length " + std::to_string(len));
  launch_write(cache, layer, tables, row, first_pos, n_tokens, k, v, stream, kernel);
}

}  // namespace lowbit::kv
