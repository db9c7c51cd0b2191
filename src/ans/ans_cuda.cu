// CUDA kernels of lowbit/ans and the chain engine (ans_cuda_engine.cuh):
// the seed-faithful MATVANS kernel, lowbit's int8 GEMV, the fused lowbit
// decode + GEMV, the on-GPU requantization, the cuBLAS / cuBLASLt baselines,
// and run_chain_cuda. docs/ans-kernels.md explains the design and the numbers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "ans_cuda_engine.cuh"
#include "lowbit/ans/ans_cuda.h"
#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/cublas_check.h"
#include "lowbit/cuda/device.h"

namespace lowbit::ans {
namespace gpu {

using lowbit::detail::concat;

namespace {

constexpr uint32_t kLower = 1u << 16;  // rANS L: states lie in [2^16, 2^32)
constexpr int kMaxGpuCols = 131071;    // int32 accumulation is exact up to here (chain.h)

__host__ __device__ inline uint64_t align16(uint64_t n) { return (n + 15) / 16 * 16; }

// ---- the requantization between steps ----------------------------------------
//
// One block: the vectors are at most a few ten thousand entries, so a single
// block reads y once for the absmax and once more to round, with no atomics,
// no memset and no second launch. v = round_half_even(127 y / max|y|) in
// double: 127 y is exact, the quotient is correctly rounded, and a quotient
// that is not a tie lies at least 1 / (2 max|y|) >= 2^-32 from one, far more
// than double's error at magnitudes <= 127, so rint() rounds exactly as the
// CPU's integer formula (chain.cpp).
constexpr int kRequantThreads = 1024;

template <typename T>
__device__ inline double abs_as_double(T v) {
  return v < 0 ? -static_cast<double>(v) : static_cast<double>(v);
}

template <typename T>
__global__ void __launch_bounds__(kRequantThreads)
    requantize_kernel(const T* __restrict__ y, uint32_t n, int8_t* __restrict__ v, float* __restrict__ vf) {
  __shared__ double warp_max[kRequantThreads / 32];
  double m = 0;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) m = fmax(m, abs_as_double(y[i]));
  for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmax(m, warp_max[w]);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double q = m > 0 ? rint(127.0 * static_cast<double>(y[i]) / m) : 0.0;
    v[i] = static_cast<int8_t>(q);
    if (vf != nullptr) vf[i] = static_cast<float>(q);
  }
}

// ---- the seed-faithful kernel (MATVANS report, Algorithm 1) ------------------
//
// One thread per row, the ppf/cdf tables and the input vector in shared
// memory, one symbol per step; the only additions to the report's loop are
// the bounds checks that turn a corrupt payload into an error flag instead of
// an out-of-bounds read.
constexpr int kSeedThreads = 128;

__global__ void __launch_bounds__(kSeedThreads)
    seed_kernel(const uint8_t* __restrict__ blob, MatrixParams p, const int8_t* __restrict__ v,
                int32_t* __restrict__ y, uint32_t* __restrict__ err) {
  extern __shared__ __align__(16) uint8_t sm[];
  uint8_t* s_ppf = sm;
  uint8_t* s_cdf = sm + 256;
  int8_t* s_v = reinterpret_cast<int8_t*>(sm + 528);
  for (uint32_t i = threadIdx.x; i < 528; i += blockDim.x) sm[i] = blob[p.tables_off + i];
  for (uint32_t i = threadIdx.x; i < p.cols; i += blockDim.x) s_v[i] = v[i];
  __syncthreads();
  const uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= p.rows) return;
  const uint32_t* cursors = reinterpret_cast<const uint32_t*>(blob + p.cursors_off);
  const uint16_t* payload = reinterpret_cast<const uint16_t*>(blob + p.payload_off);
  uint32_t c = cursors[r];
  const uint32_t end = r + 1 < p.rows ? cursors[r + 1] : p.payload_words;
  bool bad = c + 2 > end;
  int32_t acc = 0;
  if (!bad) {
    uint32_t x = (uint32_t{payload[c]} << 16) | payload[c + 1];
    c += 2;
    for (uint32_t j = 0; j < p.cols; ++j) {
      const uint32_t q = x & 0xFFu;
      const uint32_t s = s_ppf[q];
      acc += (p.w_min + static_cast<int32_t>(s)) * s_v[j];
      const uint32_t cdf = s_cdf[s];
      const uint32_t prob = (s_cdf[s + 1] - cdf) & 0xFFu;
      x = (x >> 8) * prob + q - cdf;
      if (x < kLower) {
        if (c >= end) {
          bad = true;
          break;
        }
        x = (x << 16) | payload[c++];
      }
    }
    // Every row ends exactly at the next cursor with x = 2^16; the last row may
    // end 2 words before payload_size when those are the later encoder's zero tail.
    const bool tail = r + 1 == p.rows && c + 2 == end && payload[c] == 0 && payload[c + 1] == 0;
    bad = bad || x != kLower || (c != end && !tail);
  }
  y[r] = bad ? 0 : acc;
  if (bad) atomicOr(err, 1u);
}

// ---- lowbit's int8 GEMV (the bar to beat) -------------------------------------
//
// One warp per row: 16-byte streaming loads of the row (no reuse, so evict
// first), the vector through the read-only cache (every warp reads it), four
// dp4a per 16 bytes, a shuffle reduction. Four loads are issued before the
// first dp4a so each lane keeps 64 bytes in flight.
constexpr int kGemvThreads = 256;

__global__ void __launch_bounds__(kGemvThreads)
    int8_gemv_kernel(const int8_t* __restrict__ w, uint32_t rows, uint32_t cols, const int8_t* __restrict__ v,
                     int32_t* __restrict__ y) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t row = blockIdx.x * (kGemvThreads / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  int32_t acc = 0;
  if (cols % 16 == 0) {  // rows and v are 16-byte aligned (cudaMalloc, cols multiple of 16)
    const int4* wr = reinterpret_cast<const int4*>(w + uint64_t{row} * cols);
    const int4* vr = reinterpret_cast<const int4*>(v);
    const uint32_t n = cols / 16;
    uint32_t i = lane;
    for (; i + 96 < n; i += 128) {
      int4 a[4], b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] = __ldcs(wr + i + 32 * u);
#pragma unroll
      for (int u = 0; u < 4; ++u) b[u] = __ldg(vr + i + 32 * u);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        acc = __dp4a(a[u].x, b[u].x, acc);
        acc = __dp4a(a[u].y, b[u].y, acc);
        acc = __dp4a(a[u].z, b[u].z, acc);
        acc = __dp4a(a[u].w, b[u].w, acc);
      }
    }
    for (; i < n; i += 32) {
      const int4 a = __ldcs(wr + i), b = __ldg(vr + i);
      acc = __dp4a(a.x, b.x, acc);
      acc = __dp4a(a.y, b.y, acc);
      acc = __dp4a(a.z, b.z, acc);
      acc = __dp4a(a.w, b.w, acc);
    }
  } else {  // any width: bytes
    const int8_t* wr = w + uint64_t{row} * cols;
    for (uint32_t j = lane; j < cols; j += 32) acc += int32_t{wr[j]} * int32_t{v[j]};
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) y[row] = acc;
}

// ---- the fused lowbit decode + GEMV ---------------------------------------------
//
// One warp per tile (persistent blocks stride over the tiles). The format
// (lowbit_format.h) fixes the order: for each row, block of S = 32k quads,
// position p of the quad, slot m, lane l: stream 32m + l decodes column
// 4(bS + 32m + l) + p, and the lanes whose state fell below 2^16 take the
// tile's next words in lane order (ballot + popc). So lane l owns quad
// bS + 32m + l: after 4 positions it holds 4 decoded weights in one register,
// multiplied with 4 activations by one dp4a; across the warp the activation
// words are consecutive (one coalesced 128-byte load).
//
// Why each piece:
//   * the word stream is staged in a per-warp shared-memory ring by cp.async,
//     kAhead chunks of 64 words ahead, because the word a lane reads in one
//     step feeds its very next decode: a global load there would put a DRAM
//     latency on every step's dependency chain;
//   * one table lookup per symbol: for P <= 12 a packed u32 per slot
//     (value | freq-1 << 8 | q - cdf << 20) gives the value and both update
//     terms at once, x' = freq * (x >> P) + (q - cdf); the table is built on
//     the host (16 KiB, copied with the matrix) because building it in every
//     block would cost more than decoding a small tile;
//   * full blocks run without per-column bounds checks (kFull), the last
//     partial block with them;
//   * the word reads are cheap to address: each warp's ring is 1024 bytes at a
//     1024-aligned shared address, and the warp keeps its position as a byte
//     count, so a lane's word address is one LEA (position + 2 * its prefix
//     popcount) and one LOP3 ((t & 0x3fe) | ring): the step is issue-bound
//     (docs/ans-kernels.md), so instructions are what costs;
//   * the chunk-boundary test runs every fourth step with the data two chunks
//     ahead guaranteed (four steps read at most 128 words), and a refill issues
//     from per-lane offsets prepared once per tile.
constexpr int kFusedThreads = 256;
constexpr int kFusedWarps = kFusedThreads / 32;
constexpr int kChunkWords = 64;                 // 128 bytes = 8 lanes x 16 bytes of cp.async
constexpr int kRingChunks = 8;
constexpr int kRingWords = kChunkWords * kRingChunks;
constexpr int kAhead = 4;                       // chunks issued ahead of the one being read
constexpr uint32_t kRingBytes = 2 * kRingWords;  // 1024: a power of two, and the alignment of each ring
static_assert(kRingBytes == 1024, "the ring addressing masks with 0x3fe");

__device__ inline void cp_async16(uint32_t smem_addr, const void* gmem, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}


struct FusedTables {
  const uint32_t* lut32;  // packed
  const uint8_t* lut8;    // two-level: slot -> symbol
  const uint32_t* fc;     // two-level: symbol -> freq | cdf << 16
  uint32_t mask;
  int P;
  int w_min;
};

__device__ inline uint32_t ld_shared_u16(uint32_t addr) {
  unsigned short w;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(w) : "r"(addr));
  return w;
}

struct WarpStream {
  uint32_t ring;       // the warp's ring: a 1024-aligned shared-space address
  const uint8_t* src;  // this lane's 16 bytes of chunk 0 (lanes 0..7)
  uint32_t dst;        // ring + 16 * lane
  uint32_t off;        // 16 * lane: this lane's byte offset within a chunk
  uint32_t n_bytes;    // bytes of the tile's word stream (< 2^31, checked on the host)
  uint32_t pos;        // bytes consumed so far: 2 x words
  uint32_t boundary;   // byte position of the next chunk
  uint32_t chunk;      // chunk being read
  bool overrun;        // read far past the tile (corrupt): keeps the u32 positions from wrapping
};

// Issues chunk `c` of the tile's words into the ring (lanes 0..7, 16 bytes
// each); 16-byte pieces past the tile are zero-filled, never read from memory.
__device__ inline void issue_chunk(const WarpStream& ws, uint32_t c, uint32_t lane) {
  if (lane < 8) {
    const uint32_t o = c * kChunkWords * 2;
    const bool in = o + ws.off < ws.n_bytes;
    cp_async16(ws.dst | ((c % kRingChunks) * kChunkWords * 2), in ? ws.src + o : ws.src, in ? 16u : 0u);
  }
  cp_async_commit();
}

template <int kSlots, bool kPacked, bool kFull>
__device__ __forceinline__ int32_t fused_block(uint32_t (&x)[kSlots], const FusedTables& tb, WarpStream& ws,
                                               uint32_t block, uint32_t cols, uint32_t quads, const int8_t* v,
                                               uint32_t lane, int32_t acc) {
  constexpr uint32_t S = 32 * kSlots;
  const uint32_t lt = (1u << lane) - 1;
  // The activations first: loaded at the end, next to the dp4a, their
  // latency stalled the warp once per block (in-order issue).
  const int32_t* v32 = reinterpret_cast<const int32_t*>(v);
  int32_t va[kSlots];
#pragma unroll
  for (int m = 0; m < kSlots; ++m) {
    const uint32_t quad = block * S + 32 * m + lane;
    va[m] = (kFull || quad < quads) ? __ldg(v32 + quad) : 0;
  }
  uint32_t pk[kSlots];
#pragma unroll
  for (int m = 0; m < kSlots; ++m) pk[m] = 0;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
#pragma unroll
    for (int m = 0; m < kSlots; ++m) {
      const uint32_t quad = block * S + 32 * m + lane;
      const bool valid = kFull || 4 * quad + p < cols;
      uint32_t s = x[m];
      bool need = false;
      if (valid) {
        const uint32_t q = s & tb.mask;
        if constexpr (kPacked) {
          const uint32_t e = tb.lut32[q];
          s = (((e >> 8) & 0xFFFu) + 1) * (s >> tb.P) + (e >> 20);
          pk[m] |= (e & 0xFFu) << (8 * p);
        } else {
          const uint32_t sym = tb.lut8[q];
          const uint32_t e = tb.fc[sym];
          s = (e & 0xFFFFu) * (s >> tb.P) + q - (e >> 16);
          pk[m] |= (static_cast<uint32_t>(tb.w_min + static_cast<int>(sym)) & 0xFFu) << (8 * p);
        }
        need = s < kLower;
      }
      const uint32_t bal = __ballot_sync(0xffffffffu, need);
      if (need) s = (s << 16) | ld_shared_u16(((ws.pos + 2 * __popc(bal & lt)) & (kRingBytes - 2)) | ws.ring);
      x[m] = s;
      ws.pos += 2 * __popc(bal);
      if ((p * kSlots + m) % 4 == 3 && ws.pos >= ws.boundary) {  // warp-uniform
        ws.overrun = ws.overrun || ws.pos > ws.n_bytes + 1024;
        do {  // four steps read at most 128 words: at most two chunks to pass
          ++ws.chunk;
          ws.boundary += 2 * kChunkWords;
          issue_chunk(ws, ws.chunk + kAhead, lane);
        } while (ws.pos >= ws.boundary);
        cp_async_wait<kAhead - 2>();  // chunks up to chunk + 2 have landed
        __syncwarp();
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kSlots; ++m) acc = __dp4a(static_cast<int32_t>(pk[m]), va[m], acc);
  return acc;
}

// Occupancy matters twice: warps hide the decode's dependency chain, and a
// 8192-row matrix with one row per tile has 8192 warps, which fit an H100 in
// one wave only at 64 warps per SM (32 registers for one state per lane).
template <int kSlots, bool kPacked>
__global__ void __launch_bounds__(kFusedThreads, kSlots == 1 ? 8 : 4)
    lowbit_fused_kernel(const uint8_t* __restrict__ blob, MatrixParams p, const int8_t* __restrict__ v,
                        int32_t* __restrict__ y, uint32_t* __restrict__ err) {
  extern __shared__ __align__(16) uint8_t sm[];
  {  // the decode table, prepared on the host
    const uint4* src = reinterpret_cast<const uint4*>(blob + p.tables_off);
    uint4* dst = reinterpret_cast<uint4*>(sm);
    for (uint32_t i = threadIdx.x; i < p.lut_bytes / 16; i += blockDim.x) dst[i] = src[i];
  }
  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The rings start at the first 1024-aligned shared address after the table
  // (the host adds 1024 bytes of slack for this).
  const uint32_t sm_addr = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const uint32_t ring = ((sm_addr + p.lut_bytes + kRingBytes - 1) & ~(kRingBytes - 1)) + warp * kRingBytes;
  __syncthreads();
  FusedTables tb;
  tb.lut32 = reinterpret_cast<const uint32_t*>(sm);
  tb.lut8 = sm;
  tb.fc = reinterpret_cast<const uint32_t*>(sm + align16(1u << p.precision));
  tb.P = p.precision;
  tb.mask = (1u << p.precision) - 1;
  tb.w_min = p.w_min;
  constexpr uint32_t S = 32 * kSlots;
  const uint32_t quads = (p.cols + 3) / 4;
  const uint32_t blocks = (quads + S - 1) / S;
  const uint32_t full_blocks = p.cols / (4 * S);
  const uint32_t* offs = reinterpret_cast<const uint32_t*>(blob + p.cursors_off);
  const uint8_t* payload = blob + p.payload_off;
  bool bad = false;
  for (uint32_t t = blockIdx.x * kFusedWarps + warp; t < p.tiles; t += gridDim.x * kFusedWarps) {
    const uint64_t tb0 = uint64_t{offs[t]} * 16, tb1 = uint64_t{offs[t + 1]} * 16;
    if (tb1 < tb0 + 4 * S) {  // the reader checks this; never read a tile that cannot hold its states
      bad = true;
      continue;
    }
    uint32_t x[kSlots];
#pragma unroll
    for (int m = 0; m < kSlots; ++m) {
      x[m] = reinterpret_cast<const uint32_t*>(payload + tb0)[32 * m + lane];
      bad = bad || x[m] < kLower;
    }
    WarpStream ws;
    ws.ring = ring;
    ws.off = 16 * lane;
    ws.src = payload + tb0 + 4 * S + ws.off;
    ws.dst = ring + ws.off;
    ws.n_bytes = static_cast<uint32_t>(tb1 - tb0 - 4 * S);
    ws.pos = 0;
    ws.chunk = 0;
    ws.boundary = 2 * kChunkWords;
    ws.overrun = false;
    for (uint32_t c = 0; c <= kAhead; ++c) issue_chunk(ws, c, lane);
    cp_async_wait<kAhead - 2>();
    __syncwarp();
    const uint32_t r_end = min(p.rows, (t + 1) * p.rows_per_tile);
    for (uint32_t r = t * p.rows_per_tile; r < r_end; ++r) {
      int32_t acc = 0;
      uint32_t b = 0;
      for (; b < full_blocks; ++b)
        acc = fused_block<kSlots, kPacked, true>(x, tb, ws, b, p.cols, quads, v, lane, acc);
      for (; b < blocks; ++b)
        acc = fused_block<kSlots, kPacked, false>(x, tb, ws, b, p.cols, quads, v, lane, acc);
      for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (lane == 0) y[r] = acc;
    }
    // Every stream ends at 2^16 and the words end within the tile's last 16 bytes.
#pragma unroll
    for (int m = 0; m < kSlots; ++m) bad = bad || x[m] != kLower;
    bad = bad || ws.overrun || ws.pos > ws.n_bytes || ws.n_bytes - ws.pos >= 16;
    cp_async_wait<0>();
    __syncwarp();
    // The < 16 bytes after the last word are zero padding (in the ring by now).
    if (!bad && ws.pos + 2 * lane < ws.n_bytes)
      bad = ld_shared_u16(((ws.pos + 2 * lane) & (kRingBytes - 2)) | ws.ring) != 0;
  }
  if (bad) atomicOr(err, 1u);
}

template <int kSlots, bool kPacked>
void launch_fused_t(const uint8_t* blob, const MatrixParams& p, const int8_t* v, int32_t* y, uint32_t* err,
                    int sm_count, cudaStream_t stream) {
  const size_t smem = p.lut_bytes + kRingBytes /* alignment slack */ + size_t{kRingBytes} * kFusedWarps;
  auto kernel = lowbit_fused_kernel<kSlots, kPacked>;
  // The occupancy query is cached per thread for the last (device, size).
  static thread_local int configured_device = -1, configured_smem = -1, blocks_per_sm = 0;
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  if (configured_device != device || configured_smem != static_cast<int>(smem)) {
    cuda::ensure_dynamic_smem(kernel, static_cast<int>(smem));
    LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kFusedThreads, smem));
    configured_device = device, configured_smem = static_cast<int>(smem);
  }
  const uint64_t want = (uint64_t{p.tiles} + kFusedWarps - 1) / kFusedWarps;
  const uint64_t grid = std::max<uint64_t>(1, std::min<uint64_t>(want, uint64_t(std::max(1, blocks_per_sm)) * sm_count));
  kernel<<<static_cast<unsigned>(grid), kFusedThreads, smem, stream>>>(blob, p, v, y, err);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void launch_fused(const uint8_t* blob, const MatrixParams& p, const int8_t* v, int32_t* y, uint32_t* err,
                  int sm_count, cudaStream_t stream) {
  const bool pk = p.packed_lut;
  switch (p.slots) {
    case 1: return pk ? launch_fused_t<1, true>(blob, p, v, y, err, sm_count, stream)
                      : launch_fused_t<1, false>(blob, p, v, y, err, sm_count, stream);
    case 2: return pk ? launch_fused_t<2, true>(blob, p, v, y, err, sm_count, stream)
                      : launch_fused_t<2, false>(blob, p, v, y, err, sm_count, stream);
    case 4: return pk ? launch_fused_t<4, true>(blob, p, v, y, err, sm_count, stream)
                      : launch_fused_t<4, false>(blob, p, v, y, err, sm_count, stream);
    case 8: return pk ? launch_fused_t<8, true>(blob, p, v, y, err, sm_count, stream)
                      : launch_fused_t<8, false>(blob, p, v, y, err, sm_count, stream);
    default: fail(ErrorKind::format, "lowbit matrix with states_per_lane = ", p.slots, ": expected 1, 2, 4 or 8");
  }
}

}  // namespace

// ---- buffers --------------------------------------------------------------------

PinnedBytes::PinnedBytes(size_t n) : size(n) {
  if (n > 0) LOWBIT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data), n));
}
PinnedBytes::~PinnedBytes() {
  if (data != nullptr) cudaFreeHost(data);
}
PinnedBytes::PinnedBytes(PinnedBytes&& o) noexcept : data(std::exchange(o.data, nullptr)), size(std::exchange(o.size, 0)) {}
PinnedBytes& PinnedBytes::operator=(PinnedBytes&& o) noexcept {
  std::swap(data, o.data);
  std::swap(size, o.size);
  return *this;
}
DeviceBytes::DeviceBytes(size_t n) : size(n) {
  if (n > 0) LOWBIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), n));
}
DeviceBytes::~DeviceBytes() {
  if (data != nullptr) cudaFree(data);
}
DeviceBytes::DeviceBytes(DeviceBytes&& o) noexcept : data(std::exchange(o.data, nullptr)), size(std::exchange(o.size, 0)) {}
DeviceBytes& DeviceBytes::operator=(DeviceBytes&& o) noexcept {
  std::swap(data, o.data);
  std::swap(size, o.size);
  return *this;
}

const char* method_name(Method m) {
  switch (m) {
    case Method::seed: return "matvans_seed";
    case Method::lowbit_fused: return "lowbit_fused";
    case Method::int8_gemv: return "lowbit_int8_gemv";
    case Method::cublas_sgemv: return "cublas_sgemv_fp32";
    case Method::cublaslt_int8: return "cublaslt_int8_n32";
  }
  return "?";
}

// ---- preparing matrices -----------------------------------------------------------

namespace {
void check_gpu_shape(uint64_t rows, uint64_t cols) {
  if (cols > static_cast<uint64_t>(kMaxGpuCols) || rows > 0x7FFFFFFFu)
    fail(ErrorKind::unsupported, "a ", rows, " x ", cols, " matrix on the GPU: the int32 accumulator is exact only up to ",
         kMaxGpuCols, " columns");
}
}  // namespace

PreparedMatrix prepare_seed(const SeedMatrix& m) {
  check_gpu_shape(m.rows, m.cols);
  PreparedMatrix out;
  out.method = Method::seed;
  MatrixParams& p = out.p;
  p.rows = m.rows;
  p.cols = m.cols;
  p.w_min = m.w_min;
  p.payload_words = static_cast<uint32_t>(m.payload.size());
  p.tables_off = 0;  // ppf u8[256] | cdf u8[G + 1] padded to 272
  p.cursors_off = 528;
  p.payload_off = align16(p.cursors_off + 4ull * m.rows);
  out.blob = PinnedBytes(align16(p.payload_off + 2ull * m.payload.size()));
  std::memset(out.blob.data, 0, out.blob.size);
  std::memcpy(out.blob.data, m.ppf.data(), 256);
  std::memcpy(out.blob.data + 256, m.cdf.data(), m.cdf.size());
  std::memcpy(out.blob.data + p.cursors_off, m.cursors.data(), 4 * m.cursors.size());
  std::memcpy(out.blob.data + p.payload_off, m.payload.data(), 2 * m.payload.size());
  return out;
}

PreparedMatrix prepare_lowbit(const LowbitMatrix& m) {
  check_gpu_shape(m.rows, m.cols);
  const FreqModel model = m.model();
  model.validate("lowbit matrix");
  PreparedMatrix out;
  out.method = Method::lowbit_fused;
  MatrixParams& p = out.p;
  p.rows = m.rows;
  p.cols = m.cols;
  p.w_min = m.w_min;
  p.precision = m.precision;
  p.slots = m.states_per_lane;
  p.rows_per_tile = m.rows_per_tile;
  p.tiles = m.tiles();
  p.packed_lut = m.precision <= 12;
  const uint32_t slots_n = 1u << m.precision;
  p.lut_bytes = static_cast<uint32_t>(p.packed_lut ? align16(4ull * slots_n) : align16(slots_n) + 1024);
  p.tables_off = 0;
  p.cursors_off = p.lut_bytes;
  p.payload_off = align16(p.cursors_off + 4ull * m.tile_offsets.size());
  for (size_t t = 0; t + 1 < m.tile_offsets.size(); ++t)
    if (uint64_t{m.tile_offsets[t + 1] - m.tile_offsets[t]} * 16 >= (1ull << 31))
      fail(ErrorKind::unsupported, "a lowbit tile of more than 2 GiB on the GPU");
  out.blob = PinnedBytes(align16(p.payload_off + m.payload.size()));
  std::memset(out.blob.data, 0, out.blob.size);
  uint8_t* lut = out.blob.data;
  uint32_t c = 0;
  for (int i = 0; i < model.grid_size(); ++i) {
    const uint32_t f = model.freq[static_cast<size_t>(i)];
    if (p.packed_lut) {
      const uint32_t value = static_cast<uint32_t>(static_cast<uint8_t>(static_cast<int8_t>(m.w_min + i)));
      for (uint32_t q = c; q < c + f; ++q) {
        const uint32_t e = value | ((f - 1) << 8) | ((q - c) << 20);
        std::memcpy(lut + 4ull * q, &e, 4);
      }
    } else {
      for (uint32_t q = c; q < c + f; ++q) lut[q] = static_cast<uint8_t>(i);
      const uint32_t e = f | (c << 16);
      std::memcpy(lut + align16(slots_n) + 4ull * i, &e, 4);
    }
    c += f;
  }
  std::memcpy(out.blob.data + p.cursors_off, m.tile_offsets.data(), 4 * m.tile_offsets.size());
  std::memcpy(out.blob.data + p.payload_off, m.payload.data(), m.payload.size());
  return out;
}

PreparedMatrix prepare_dense(const Int8Matrix& m, Method method) {
  check_gpu_shape(static_cast<uint64_t>(m.rows), static_cast<uint64_t>(m.cols));
  LOWBIT_CHECK_ARG(method == Method::int8_gemv || method == Method::cublas_sgemv || method == Method::cublaslt_int8,
                   "method", method_name(method), "a dense method");
  PreparedMatrix out;
  out.method = method;
  out.p.rows = static_cast<uint32_t>(m.rows);
  out.p.cols = static_cast<uint32_t>(m.cols);
  const uint64_t n = static_cast<uint64_t>(m.rows) * static_cast<uint64_t>(m.cols);
  if (method == Method::cublas_sgemv) {
    out.blob = PinnedBytes(4 * n);
    float* f = reinterpret_cast<float*>(out.blob.data);
    for (uint64_t i = 0; i < n; ++i) f[i] = static_cast<float>(m.data[i]);
  } else {
    out.blob = PinnedBytes(n);
    std::memcpy(out.blob.data, m.data.data(), n);
  }
  return out;
}

// ---- the engine -------------------------------------------------------------------

struct ChainEngine::LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  ~LtPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

namespace {
constexpr int kLtColumns = 32;  // the vector padded to a 32-column matrix, as the anchors ran cuBLASLt
constexpr size_t kLtWorkspace = 32u << 20;
}  // namespace

ChainEngine::ChainEngine(std::vector<PreparedMatrix> matrices, const std::vector<int8_t>& v0, bool resident)
    : mats_(std::move(matrices)) {
  LOWBIT_CHECK_ARG(!mats_.empty(), "matrices", 0, "at least one matrix");
  method_ = mats_.front().method;
  uint32_t n = static_cast<uint32_t>(v0.size());
  max_dim_ = n;
  size_t max_blob = 0;
  for (size_t k = 0; k < mats_.size(); ++k) {
    const MatrixParams& p = mats_[k].p;
    if (mats_[k].method != method_) fail(ErrorKind::internal, "a chain engine with mixed methods");
    if (p.cols != n)
      fail(ErrorKind::format, "matrix ", k, " has ", p.cols, " columns: expected ", n, " (the previous vector's length)");
    n = p.rows;
    max_dim_ = std::max(max_dim_, n);
    max_blob = std::max(max_blob, mats_[k].blob.size);
  }
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev));
  // Vectors padded so that 16-byte and quad loads past the end stay inside
  // (their products are multiplied by zero weights or not used).
  const size_t vbytes = (size_t{max_dim_} + 256) * kLtColumns;
  v0_ = DeviceBytes(v0.size() + 256);
  v_ = DeviceBytes(vbytes);
  y_ = DeviceBytes((size_t{max_dim_} + 64) * 4 * kLtColumns);
  err_ = DeviceBytes(4);
  LOWBIT_CUDA_CHECK(cudaMemset(v_.data, 0, v_.size));
  LOWBIT_CUDA_CHECK(cudaMemset(v0_.data, 0, v0_.size));
  LOWBIT_CUDA_CHECK(cudaMemset(err_.data, 0, 4));
  // Poisoned: a row a kernel forgot to write shows up as a wrong final vector.
  LOWBIT_CUDA_CHECK(cudaMemset(y_.data, 0x5A, y_.size));
  LOWBIT_CUDA_CHECK(cudaMemcpy(v0_.data, v0.data(), v0.size(), cudaMemcpyHostToDevice));
  if (method_ == Method::cublas_sgemv) {
    std::vector<float> f(v0.begin(), v0.end());
    vf0_ = DeviceBytes(4 * (v0.size() + 64));
    vf_ = DeviceBytes(4 * (size_t{max_dim_} + 64));
    LOWBIT_CUDA_CHECK(cudaMemcpy(vf0_.data, f.data(), 4 * f.size(), cudaMemcpyHostToDevice));
    LOWBIT_CUBLAS_CHECK(cublasCreate(&cublas_));
  }
  if (method_ == Method::cublaslt_int8) {
    LOWBIT_CUBLAS_CHECK(cublasLtCreate(&lt_));
    lt_workspace_ = DeviceBytes(kLtWorkspace);
    for (const PreparedMatrix& m : mats_) {
      auto plan = std::make_unique<LtPlan>();
      const uint64_t N = m.p.rows, K = m.p.cols;
      LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32I, CUDA_R_32I));
      const cublasOperation_t ta = CUBLAS_OP_T, tn = CUBLAS_OP_N;
      LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
      LOWBIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tn, sizeof tn));
      // W row-major N x K is column-major K x N (ld K); op(A) = A^T is N x K.
      LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8I, K, N, static_cast<int64_t>(K)));
      LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8I, K, kLtColumns, static_cast<int64_t>(K)));
      LOWBIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32I, N, kLtColumns, static_cast<int64_t>(N)));
      cublasLtMatmulPreference_t pref = nullptr;
      LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = kLtWorkspace;
      LOWBIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      cublasLtMatmulHeuristicResult_t res{};
      int found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(lt_, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &res, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      plan->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
      if (plan->ok) plan->algo = res.algo;
      lt_ok_ = lt_ok_ && plan->ok;
      lt_plans_.push_back(std::move(plan));
    }
  }
  if (resident) {
    for (const PreparedMatrix& m : mats_) {
      resident_.emplace_back(m.blob.size);
      LOWBIT_CUDA_CHECK(cudaMemcpy(resident_.back().data, m.blob.data, m.blob.size, cudaMemcpyHostToDevice));
    }
  }
  stream_buf_[0] = DeviceBytes(max_blob);
  stream_buf_[1] = DeviceBytes(max_blob);
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) {
    LOWBIT_CUDA_CHECK(cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming));
    LOWBIT_CUDA_CHECK(cudaEventCreateWithFlags(&used_[i], cudaEventDisableTiming));
  }
  LOWBIT_CUDA_CHECK(cudaEventCreateWithFlags(&fence_, cudaEventDisableTiming));
}

ChainEngine::~ChainEngine() {
  cudaDeviceSynchronize();
  lt_plans_.clear();
  if (lt_) cublasLtDestroy(lt_);
  if (cublas_) cublasDestroy(cublas_);
  for (int i = 0; i < 2; ++i) {
    if (copied_[i]) cudaEventDestroy(copied_[i]);
    if (used_[i]) cudaEventDestroy(used_[i]);
  }
  if (fence_) cudaEventDestroy(fence_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
}

uint64_t ChainEngine::blob_bytes() const {
  uint64_t s = 0;
  for (const PreparedMatrix& m : mats_) s += m.blob.size;
  return s;
}

void ChainEngine::start(cudaStream_t stream) {
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(v_.data, v0_.data, mats_.front().p.cols, cudaMemcpyDeviceToDevice, stream));
  if (method_ == Method::cublas_sgemv)
    LOWBIT_CUDA_CHECK(
        cudaMemcpyAsync(vf_.data, vf0_.data, 4ull * mats_.front().p.cols, cudaMemcpyDeviceToDevice, stream));
}

void ChainEngine::product(size_t k, const uint8_t* blob, cudaStream_t stream) {
  const PreparedMatrix& m = mats_[k];
  const MatrixParams& p = m.p;
  const int8_t* v = reinterpret_cast<const int8_t*>(v_.data);
  int32_t* y = reinterpret_cast<int32_t*>(y_.data);
  uint32_t* err = reinterpret_cast<uint32_t*>(err_.data);
  switch (m.method) {
    case Method::seed: {
      const size_t smem = 528 + p.cols;
      if (smem > 48 * 1024) cuda::ensure_dynamic_smem(seed_kernel, static_cast<int>(smem));
      seed_kernel<<<(p.rows + kSeedThreads - 1) / kSeedThreads, kSeedThreads, smem, stream>>>(blob, p, v, y, err);
      LOWBIT_CUDA_CHECK_LAUNCH();
      break;
    }
    case Method::lowbit_fused: launch_fused(blob, p, v, y, err, sm_count_, stream); break;
    case Method::int8_gemv:
      int8_gemv_kernel<<<(p.rows + kGemvThreads / 32 - 1) / (kGemvThreads / 32), kGemvThreads, 0, stream>>>(
          reinterpret_cast<const int8_t*>(blob), p.rows, p.cols, v, y);
      LOWBIT_CUDA_CHECK_LAUNCH();
      break;
    case Method::cublas_sgemv: {
      const float one = 1.0f, zero = 0.0f;
      LOWBIT_CUBLAS_CHECK(cublasSetStream(cublas_, stream));
      // W row-major rows x cols = column-major cols x rows: y = (W^T)^T v.
      LOWBIT_CUBLAS_CHECK(cublasSgemv(cublas_, CUBLAS_OP_T, static_cast<int>(p.cols), static_cast<int>(p.rows), &one,
                                      reinterpret_cast<const float*>(blob), static_cast<int>(p.cols),
                                      reinterpret_cast<const float*>(vf_.data), 1, &zero,
                                      reinterpret_cast<float*>(y_.data), 1));
      break;
    }
    case Method::cublaslt_int8: {
      const LtPlan& plan = *lt_plans_[k];
      if (!plan.ok)
        fail(ErrorKind::unsupported, "cuBLASLt found no int8 algorithm for a ", p.rows, " x ", p.cols,
             " matrix times ", kLtColumns, " columns");
      const int32_t one = 1, zero = 0;
      LOWBIT_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.op, &one, blob, plan.a, v_.data, plan.b, &zero, y_.data, plan.c,
                                         y_.data, plan.c, &plan.algo, lt_workspace_.data, lt_workspace_.size, stream));
      break;
    }
  }
}

void ChainEngine::requantize(size_t k, cudaStream_t stream) {
  const uint32_t n = mats_[k].p.rows;
  int8_t* v = reinterpret_cast<int8_t*>(v_.data);
  if (method_ == Method::cublas_sgemv) {
    requantize_kernel<float><<<1, kRequantThreads, 0, stream>>>(reinterpret_cast<const float*>(y_.data), n, v,
                                                               reinterpret_cast<float*>(vf_.data));
  } else {
    requantize_kernel<int32_t><<<1, kRequantThreads, 0, stream>>>(reinterpret_cast<const int32_t*>(y_.data), n, v,
                                                                 nullptr);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void ChainEngine::enqueue(cudaStream_t stream, cudaEvent_t* events) {
  if (resident_.size() != mats_.size()) fail(ErrorKind::internal, "ChainEngine::enqueue without resident matrices");
  start(stream);
  if (events) LOWBIT_CUDA_CHECK(cudaEventRecord(events[0], stream));
  for (size_t k = 0; k < mats_.size(); ++k) {
    product(k, resident_[k].data, stream);
    if (events) LOWBIT_CUDA_CHECK(cudaEventRecord(events[2 * k + 1], stream));
    requantize(k, stream);
    if (events) LOWBIT_CUDA_CHECK(cudaEventRecord(events[2 * k + 2], stream));
  }
}

void ChainEngine::enqueue_product(cudaStream_t stream, size_t k) {
  if (resident_.size() != mats_.size()) fail(ErrorKind::internal, "ChainEngine::enqueue_product without resident matrices");
  product(k, resident_[k].data, stream);
}

void ChainEngine::enqueue_with_copies(cudaStream_t stream, cudaEvent_t* events) {
  if (stream_buf_[0].data == nullptr) fail(ErrorKind::internal, "ChainEngine::enqueue_with_copies on a resident engine");
  start(stream);
  if (events) LOWBIT_CUDA_CHECK(cudaEventRecord(events[0], stream));
  // Copies may start only once the timed region has begun on `stream`.
  LOWBIT_CUDA_CHECK(cudaEventRecord(fence_, stream));
  LOWBIT_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, fence_, 0));
  for (size_t k = 0; k < mats_.size(); ++k) {
    const int b = static_cast<int>(k % 2);
    if (k >= 2) LOWBIT_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, used_[b], 0));
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(stream_buf_[b].data, mats_[k].blob.data, mats_[k].blob.size,
                                      cudaMemcpyHostToDevice, copy_stream_));
    LOWBIT_CUDA_CHECK(cudaEventRecord(copied_[b], copy_stream_));
    LOWBIT_CUDA_CHECK(cudaStreamWaitEvent(stream, copied_[b], 0));
    product(k, stream_buf_[b].data, stream);
    LOWBIT_CUDA_CHECK(cudaEventRecord(used_[b], stream));
    if (events) LOWBIT_CUDA_CHECK(cudaEventRecord(events[2 * k + 1], stream));
    requantize(k, stream);
    if (events) LOWBIT_CUDA_CHECK(cudaEventRecord(events[2 * k + 2], stream));
  }
}

std::vector<int8_t> ChainEngine::final_vector() {
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int8_t> out(mats_.back().p.rows);
  LOWBIT_CUDA_CHECK(cudaMemcpy(out.data(), v_.data, out.size(), cudaMemcpyDeviceToHost));
  return out;
}

void ChainEngine::check_errors(std::string_view where) {
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t e = 0;
  LOWBIT_CUDA_CHECK(cudaMemcpy(&e, err_.data, 4, cudaMemcpyDeviceToHost));
  if (e != 0) {
    LOWBIT_CUDA_CHECK(cudaMemset(err_.data, 0, 4));
    fail(ErrorKind::format, where, ": the GPU decoder (", method_name(method_),
         ") found a corrupt payload: a row or tile reads past its words, or a stream does not end at the state 2^16");
  }
}

}  // namespace gpu

// ---- run_chain_cuda ------------------------------------------------------------------

ChainRun run_chain_cuda(const AnsFile& file, std::string_view where, const CudaRunOptions& options) {
  if (cuda_device_count() == 0) fail(ErrorKind::unsupported, where, ": --device cuda: no CUDA device is visible; use --device cpu");
  cuda::DeviceGuard guard(options.device);
  std::vector<gpu::PreparedMatrix> mats;
  std::vector<int8_t> v0;
  std::optional<uint32_t> recorded;
  uint64_t weights = 0;
  if (const auto* s = std::get_if<SeedFile>(&file)) {
    v0 = s->v0;
    if (s->has_hash) recorded = s->result_hash;
    for (const SeedMatrix& m : s->matrices) {
      mats.push_back(gpu::prepare_seed(m));
      weights += uint64_t{m.rows} * m.cols;
    }
  } else if (const auto* l = std::get_if<LowbitFile>(&file)) {
    v0 = l->v0;
    recorded = l->result_hash;
    for (const LowbitMatrix& m : l->matrices) {
      mats.push_back(gpu::prepare_lowbit(m));
      weights += uint64_t{m.rows} * m.cols;
    }
  } else {
    const auto& b = std::get<BaselineFile>(file);
    v0 = b.chain.v0;
    recorded = b.chain.result_hash;
    for (const Int8Matrix& m : b.chain.matrices) {
      mats.push_back(gpu::prepare_dense(m, gpu::Method::int8_gemv));
      weights += static_cast<uint64_t>(m.rows * m.cols);
    }
  }
  ChainRun run;
  run.recorded_hash = recorded;
  run.weights = weights;
  if (mats.empty()) {
    run.final_vector = v0;
    run.hash = fxhash32(run.final_vector);
    return run;
  }
  const size_t K = mats.size();
  gpu::ChainEngine engine(std::move(mats), v0, !options.with_copies);
  std::vector<cudaEvent_t> events(2 * K + 1);
  for (auto& e : events) LOWBIT_CUDA_CHECK(cudaEventCreate(&e));
  cudaStream_t stream = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    if (options.with_copies)
      engine.enqueue_with_copies(stream, events.data());
    else
      engine.enqueue(stream, events.data());
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    engine.check_errors(where);
    run.final_vector = engine.final_vector();
    float ms = 0;
    for (size_t k = 0; k < K; ++k) {
      LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * k], events[2 * k + 1]));
      run.matrix_seconds.push_back(ms * 1e-3);
      LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * k + 1], events[2 * k + 2]));
      run.requantize_seconds += ms * 1e-3;
    }
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, events[0], events[2 * K]));
    run.total_seconds = ms * 1e-3;
  } catch (...) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    for (auto& e : events) cudaEventDestroy(e);
    throw;
  }
  cudaStreamDestroy(stream);
  for (auto& e : events) cudaEventDestroy(e);
  run.hash = fxhash32(run.final_vector);
  return run;
}

}  // namespace lowbit::ans
