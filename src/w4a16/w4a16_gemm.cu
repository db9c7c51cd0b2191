// W4A16 GEMM kernels: y[M, N] = x[M, K] * dequant(W), weights in lowbit's
// tiled layout (lowbit/w4a16/w4a16_layout.h), fp32 accumulation on tensor
// cores (mma.sync.m16n8k16, sm_80 and later; on sm_90a `auto` prefers the
// wgmma kernel of w4a16_wgmma.cu), and the host side of every strategy.
//
// One CTA = 4 warps = one block of 64 output columns x up to 64 rows of M,
// over a range of k-iterations (64 rows of K each). Per stage (2 iterations)
// the CTA brings, with cp.async into a 3-stage shared-memory ring:
//   - the activation tile x[rows, 128]     (shared by the 4 warps: ldmatrix)
//   - 4 KB of packed weights               (each lane's own 2 x 16 bytes)
//   - the scale/zero pairs of <= 4 groups  (64 columns x 4 bytes each)
// Why this shape:
//   - decode (M <= 16) is a pure weight stream: every weight byte is used by
//     exactly one lane, so the only goals are many bytes in flight and little
//     work per byte. The 3-stage cp.async ring keeps 2 stages (9 KB per
//     CTA) of loads outstanding without holding them in registers, and split-K
//     multiplies the CTAs so every SM has several resident.
//   - a lane's 16 bytes dequantize into the B operands of 8 mma instructions
//     with one LOP3 (mask + OR magic exponent) and one HSUB2/HFMA2 + HMUL2 per
//     pair of weights: no per-element int->float conversion, no shuffles.
//   - (q - z) is formed exactly (small integers are exact in fp16/bf16) and
//     multiplied by s once, so each weight is round((q - z) * s): the closest
//     16-bit value to the reference's exact product.
#include "lowbit/w4a16/w4a16_gemm.h"
#include "lowbit/w4a16/w4a16_tune_rule.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device_attribute.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/cublas_check.h"
#include "lowbit/cuda/random.h"
#include "lowbit/cuda/timer.h"
#include "lowbit/w4a16/w4a16_layout.h"
#include "lowbit/w4a16/w4a16_wave_rule.h"
#include "w4a16_device.cuh"
#include "w4a16_gemv.h"
#include "w4a16_wgmma.h"

namespace lowbit {
namespace {

constexpr int kThreads = 128;  // 4 warps, one 16-column strip each
// A stage holds two 64-row k-iterations: one barrier and one wait per 2 KB of
// weights per warp instead of per 1 KB (the per-iteration bookkeeping, not the
// bytes, limited the first version). Three stages keep two in flight.
constexpr int kItersPerStage = 2;
constexpr int kStages = 3;
// 128 + 8 halves: rows 272 B apart, so ldmatrix's 8 rows hit 8 distinct bank groups.
constexpr int kXStride = 64 * kItersPerStage + 8;

enum ReduceMode : int { kReduceDirect = 0, kReduceAtomic = 1, kReduceOrdered = 2, kStreamK = 3 };

struct KernelArgs {
  const void* x;           // [M, K] (already permuted for act-order), row stride ldx
  int64_t ldx;
  const uint4* qweight;    // tiled layout
  const uint32_t* scale_zero;
  void* y;                 // [M, N], row stride ldy
  int64_t ldy;
  float* partial;          // atomic: [M, N_pad] zero-kept sums; ordered: [split, M, N_pad]
  int* counters;           // [m_passes * N_pad / 64], zero between calls
  int M, K, N, N_pad;
  int iters;               // K_pad / 64
  int rows_per_group;      // group size, or K_pad for per channel
  int group_shift;         // log2(group size), or -1 for per channel (one group): no division in the loop
  int split_k;
  int mode;
};

using namespace w4a16_detail;


template <int kMBlocks>
struct SharedLayout {
  static constexpr int kXBytes = kMBlocks * 16 * kXStride * 2;
  static constexpr int kWBytes = kItersPerStage * kThreads * 16;
  static constexpr int kSzBytes = kItersPerStage * 2 * 64 * 4;
  static constexpr int kStageBytes = kXBytes + kWBytes + kSzBytes;
  static constexpr int kBytes = kStages * kStageBytes;
};

// Which CTA of a stream-K launch owns global iteration p (of T = blocks x
// iters, split evenly: CTA c owns [c*T/P, (c+1)*T/P)).
__device__ __forceinline__ int streamk_owner(int64_t p, int64_t T, int P) {
  int c = static_cast<int>(p * P / T);
  while (c + 1 < P && (static_cast<int64_t>(c) + 1) * T / P <= p) ++c;
  while (c > 0 && static_cast<int64_t>(c) * T / P > p) --c;
  return c;
}

// The fused kernel.
//   data-parallel / split-K: grid = (N_pad / 64, split_k, m_passes); CTA (nb, s)
//     runs k-iterations [s*iters/S, (s+1)*iters/S) of block nb.
//   stream-K: grid = (P, 1, m_passes); the blocks x iters iterations are cut
//     into P equal contiguous ranges (one full wave of CTAs, so no SM idles in a
//     last partial wave); a range may cover the end of one block and the start
//     of the next, and blocks shared by several CTAs are fixed up like split-K.
// Residency wanted per SM: decode tiles need many CTAs in flight (registers
// capped at 72 for 7 CTAs); larger M tiles hold more accumulators.
template <int kMBlocks>
constexpr int kMinCtasPerSm = kMBlocks == 1 ? 7 : (kMBlocks == 2 ? 6 : 4);

template <typename T, int kMBlocks, bool kFloatZero>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<kMBlocks>) w4a16_fused_kernel(const KernelArgs args) {
  using L = SharedLayout<kMBlocks>;
  extern __shared__ __align__(16) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int m0 = blockIdx.z * kMBlocks * 16;
  const int n_blocks = args.N_pad / 64;
  const T* x = static_cast<const T*>(args.x);
  T* y = static_cast<T*>(args.y);

  auto stage_x = [&](int s) { return reinterpret_cast<T*>(smem + s * L::kStageBytes); };
  auto stage_w = [&](int s) { return reinterpret_cast<uint4*>(smem + s * L::kStageBytes + L::kXBytes); };
  auto stage_sz = [&](int s) {
    return reinterpret_cast<uint32_t*>(smem + s * L::kStageBytes + L::kXBytes + L::kWBytes);
  };

  // Rows past M are zero in every stage, written once here and never again:
  // at decode (M = 1) that saves 15 of 16 activation copies per iteration.
  const int valid_rows = min(kMBlocks * 16, args.M - m0);
  constexpr int kRowChunks = 8 * kItersPerStage;  // 16-byte chunks per activation row of a stage
  const int zero_chunks = (kMBlocks * 16 - valid_rows) * kRowChunks;
  for (int idx = tid; idx < kStages * zero_chunks; idx += kThreads) {
    const int s = idx / zero_chunks, rem = idx % zero_chunks;
    *reinterpret_cast<uint4*>(stage_x(s) + (valid_rows + rem / kRowChunks) * kXStride + (rem % kRowChunks) * 8) =
        make_uint4(0, 0, 0, 0);
  }

  // Loads `count` (1 or 2) k-iterations starting at `it` of block nb into
  // stage s. Every index here is a shift or a multiply by a constant: this
  // runs once per stage for every thread, and runtime divisions (the first
  // version's) cost more instructions than the dequantization itself.
  auto load_stage = [&](int s, int nb, int it, int count) {
    const int k0 = it * 64;
    T* xs = stage_x(s);
    for (int c = tid; c < valid_rows * kRowChunks; c += kThreads) {
      const int r = c / kRowChunks, kc = (c % kRowChunks) * 8;
      if (kc >= 64 * count) continue;
      const bool valid = k0 + kc < args.K;
      const T* src = valid ? x + static_cast<int64_t>(m0 + r) * args.ldx + k0 + kc : x;
      cp_async16(xs + r * kXStride + kc, src, valid ? 16 : 0);
    }
    // Weights: each thread fetches the 16 bytes per iteration it will dequantize.
    const uint4* wsrc = args.qweight + (static_cast<int64_t>(it) * n_blocks + nb) * kThreads + tid;
    for (int sub = 0; sub < count; ++sub)
      cp_async16(stage_w(s) + sub * kThreads + tid, wsrc + static_cast<int64_t>(sub) * n_blocks * kThreads, 16);
    // Scale/zero pairs of the groups of rows k0 + 32j (pairs equal unless group size 32).
    if (tid < 32 * count) {
      const int part = tid / 16, chunk = tid % 16;
      const int group = args.group_shift < 0 ? 0 : (k0 + 32 * part) >> args.group_shift;
      cp_async16(stage_sz(s) + part * 64 + chunk * 4,
                 args.scale_zero + static_cast<int64_t>(group) * args.N_pad + nb * 64 + chunk * 4, 16);
    }
  };

  const int col0 = warp * 16 + g, col1 = col0 + 8;  // this lane's two columns within the block
  float acc[kMBlocks][2][4];

  // Accumulates k-iterations [it_begin, it_end) of block nb into acc.
  auto run_segment = [&](int nb, int it_begin, int it_end) {
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int ns = 0; ns < 2; ++ns)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mb][ns][e] = 0.0f;
    const int n_iters = it_end - it_begin;
    const int n_stages = (n_iters + kItersPerStage - 1) / kItersPerStage;
    auto stage_count = [&](int j) { return min(kItersPerStage, n_iters - j * kItersPerStage); };
    __syncthreads();  // the previous segment's last stage is no longer being read
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_stages) load_stage(s, nb, it_begin + s * kItersPerStage, stage_count(s));
      cp_async_commit();
    }
    for (int j = 0; j < n_stages; ++j) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage j is visible to all; stage j-1 is no longer being read
      const int next = j + kStages - 1;
      if (next < n_stages) load_stage(next % kStages, nb, it_begin + next * kItersPerStage, stage_count(next));
      cp_async_commit();

      const int s = j % kStages;
      const int count = stage_count(j);
#pragma unroll
      for (int sub = 0; sub < kItersPerStage; ++sub) {
        if (sub >= count) break;
        const uint4 wq = stage_w(s)[sub * kThreads + tid];
        const uint32_t* sz = stage_sz(s) + sub * 128;
        const ColumnDequant<T> lo0 = column_dequant<T, kFloatZero>(sz[col0]);
        const ColumnDequant<T> lo1 = column_dequant<T, kFloatZero>(sz[col1]);
        // Rows k0+32.. share the group of rows k0.. unless groups are 32 rows.
        const bool one_group = args.group_shift < 0 || args.group_shift >= 6;
        const ColumnDequant<T> hi0 = one_group ? lo0 : column_dequant<T, kFloatZero>(sz[64 + col0]);
        const ColumnDequant<T> hi1 = one_group ? lo1 : column_dequant<T, kFloatZero>(sz[64 + col1]);
        uint32_t b[4][2][2];
        dequant_word<T, kFloatZero>(wq.x, lo0, lo1, b[0][0], b[0][1]);
        dequant_word<T, kFloatZero>(wq.y, lo0, lo1, b[1][0], b[1][1]);
        dequant_word<T, kFloatZero>(wq.z, hi0, hi1, b[2][0], b[2][1]);
        dequant_word<T, kFloatZero>(wq.w, hi0, hi1, b[3][0], b[3][1]);

        const T* xs = stage_x(s) + sub * 64;
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
          if (mb * 16 >= valid_rows) break;  // all-zero row blocks contribute nothing
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            uint32_t a[4];
            ldmatrix_x4(a, xs + (mb * 16 + lane % 16) * kXStride + ks * 16 + (lane / 16) * 8);
            mma_16816<T>(acc[mb][0], a, b[ks][0]);
            mma_16816<T>(acc[mb][1], a, b[ks][1]);
          }
        }
      }
    }
    cp_async_wait<0>();
  };

  // Writes acc for block nb: directly when this CTA computed the block's whole
  // K range, else as one of `contributors` partial sums (slot `slot` for the
  // ordered mode) of which the last to arrive writes y.
  auto finish_segment = [&](int nb, bool whole, int contributors, int slot, int mode) {
    const int block_col = nb * 64;
    // Calls f(row, col, value) for this lane's accumulators in rows < M: the
    // mma.m16n8k16 C fragment holds rows g and g+8, columns 2t and 2t+1.
    auto for_each_output = [&](auto&& f) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int ns = 0; ns < 2; ++ns)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = m0 + mb * 16 + g + (e >= 2 ? 8 : 0);
            const int col = block_col + warp * 16 + ns * 8 + 2 * t + (e & 1);
            if (row < args.M) f(row, col, acc[mb][ns][e]);
          }
    };
    if (whole) {
      for_each_output([&](int row, int col, float v) {
        if (col < args.N) y[static_cast<int64_t>(row) * args.ldy + col] = from_float<T>(v);
      });
      return;
    }
    float* partial = args.partial;
    if (mode == kReduceOrdered) partial += static_cast<int64_t>(slot) * args.M * args.N_pad;
    for_each_output([&](int row, int col, float v) {
      float* p = partial + static_cast<int64_t>(row) * args.N_pad + col;
      if (mode == kReduceOrdered)
        __stcg(p, v);
      else
        atomicAdd(p, v);
    });
    __threadfence();  // make this thread's partials visible device-wide before the count
    __syncthreads();
    int* counter = args.counters + blockIdx.z * n_blocks + nb;
    // The answer through the barrier itself, not a __shared__ flag: static
    // shared memory beside the dynamic ring cost the gemv and attention
    // kernels 2-10% (docs/w4a16-gemm.md, v26).
    if (!__syncthreads_or(tid == 0 && atomicAdd(counter, 1) == contributors - 1)) return;
    __threadfence();
    for (int idx = tid; idx < valid_rows * 64; idx += kThreads) {
      const int r = idx / 64, c = idx % 64;
      const int row = m0 + r, col = block_col + c;
      const int64_t offset = static_cast<int64_t>(row) * args.N_pad + col;
      float sum;
      if (mode == kReduceOrdered) {
        sum = 0.0f;
        for (int s = 0; s < contributors; ++s)  // fixed order: bitwise reproducible
          sum += __ldcg(args.partial + static_cast<int64_t>(s) * args.M * args.N_pad + offset);
      } else {
        sum = __ldcg(args.partial + offset);
        __stcg(args.partial + offset, 0.0f);  // keep the workspace zeroed for the next call
      }
      if (col < args.N) y[static_cast<int64_t>(row) * args.ldy + col] = from_float<T>(sum);
    }
    if (tid == 0) *counter = 0;  // ready for the next call
  };

  if (args.mode != kStreamK) {
    const int nb = blockIdx.x, split = blockIdx.y;
    const int it_begin = static_cast<int>(static_cast<int64_t>(split) * args.iters / args.split_k);
    const int it_end = static_cast<int>(static_cast<int64_t>(split + 1) * args.iters / args.split_k);
    run_segment(nb, it_begin, it_end);
    finish_segment(nb, args.split_k == 1, args.split_k, split, args.mode);
    return;
  }
  const int64_t T_total = static_cast<int64_t>(n_blocks) * args.iters;
  const int P = gridDim.x, c = blockIdx.x;
  int64_t pos = static_cast<int64_t>(c) * T_total / P;
  const int64_t end = (static_cast<int64_t>(c) + 1) * T_total / P;
  while (pos < end) {
    const int nb = static_cast<int>(pos / args.iters);
    const int64_t block_begin = static_cast<int64_t>(nb) * args.iters, block_end = block_begin + args.iters;
    const int64_t seg_end = min(end, block_end);
    run_segment(nb, static_cast<int>(pos - block_begin), static_cast<int>(seg_end - block_begin));
    const int first = streamk_owner(block_begin, T_total, P), last = streamk_owner(block_end - 1, T_total, P);
    finish_segment(nb, first == last, last - first + 1, c - first, kReduceAtomic);
    pos = seg_end;
  }
}

// xp[m, i] = x[m, perm[i]]: act-order layers are stored with rows sorted by
// group, so the activations are gathered once into that order.
template <typename T>
__global__ void permute_columns_kernel(const T* x, int64_t ldx, const int32_t* perm, T* xp, int M, int K) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(M) * K) return;
  const int m = static_cast<int>(idx / K), i = static_cast<int>(idx % K);
  xp[idx] = x[static_cast<int64_t>(m) * ldx + perm[i]];
}

// Phase 1 of the decoupled strategy: the whole W as 16-bit values [K_pad, N_pad].
// One CTA per 64 x 64 tile (the tile one fused-kernel CTA reads per
// iteration): each lane dequantizes its 32 weights into shared memory, then
// the tile leaves as 64 coalesced 128-byte rows.
template <typename T, bool kFloatZero>
__global__ void __launch_bounds__(kThreads) dequantize_tiled_kernel(const uint4* qweight, const uint32_t* scale_zero,
                                                                    T* out, int iters, int rows_per_group, int N_pad) {
  constexpr int kStride = 64 + 8;  // halves; keeps the column-wise stores below off one bank
  __shared__ __align__(16) T tile[64 * kStride];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int n_blocks = N_pad / 64, it = blockIdx.x / n_blocks, nb = blockIdx.x % n_blocks;
  const int k0 = it * 64, c0 = warp * 16 + g, c1 = c0 + 8;
  const uint4 wq = qweight[static_cast<int64_t>(blockIdx.x) * kThreads + tid];
  const uint32_t* sz_lo = scale_zero + static_cast<int64_t>(k0 / rows_per_group) * N_pad + nb * 64;
  const uint32_t* sz_hi = scale_zero + static_cast<int64_t>((k0 + 32) / rows_per_group) * N_pad + nb * 64;
  const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t* sz = j < 2 ? sz_lo : sz_hi;
    uint32_t b0[2], b1[2];
    dequant_word<T, kFloatZero>(words[j], column_dequant<T, kFloatZero>(sz[c0]),
                                column_dequant<T, kFloatZero>(sz[c1]), b0, b1);
    // b?[0] holds rows 2t, 2t+1 and b?[1] rows 2t+8, 2t+9 of k-step j.
    const int r = 16 * j + 2 * t;
    const T* v00 = reinterpret_cast<const T*>(&b0[0]);
    const T* v01 = reinterpret_cast<const T*>(&b0[1]);
    const T* v10 = reinterpret_cast<const T*>(&b1[0]);
    const T* v11 = reinterpret_cast<const T*>(&b1[1]);
    tile[r * kStride + c0] = v00[0];
    tile[(r + 1) * kStride + c0] = v00[1];
    tile[(r + 8) * kStride + c0] = v01[0];
    tile[(r + 9) * kStride + c0] = v01[1];
    tile[r * kStride + c1] = v10[0];
    tile[(r + 1) * kStride + c1] = v10[1];
    tile[(r + 8) * kStride + c1] = v11[0];
    tile[(r + 9) * kStride + c1] = v11[1];
  }
  __syncthreads();
  for (int chunk = tid; chunk < 64 * 8; chunk += kThreads) {  // 8 chunks of 16 bytes per row
    const int r = chunk / 8, c = (chunk % 8) * 8;
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(k0 + r) * N_pad + nb * 64 + c) =
        *reinterpret_cast<const uint4*>(tile + r * kStride + c);
  }
}

template <typename T, int kMBlocks, bool kFloatZero>
void launch_fused(const KernelArgs& args, dim3 grid, cudaStream_t stream) {
  using L = SharedLayout<kMBlocks>;
  auto kernel = w4a16_fused_kernel<T, kMBlocks, kFloatZero>;
  cuda::ensure_dynamic_smem(kernel, L::kBytes);
  kernel<<<grid, kThreads, L::kBytes, stream>>>(args);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <typename T, bool kFloatZero>
void launch_fused_rows(const KernelArgs& args, int rows_per_pass, dim3 grid, cudaStream_t stream) {
  switch (rows_per_pass) {
    case 16: return launch_fused<T, 1, kFloatZero>(args, grid, stream);
    case 32: return launch_fused<T, 2, kFloatZero>(args, grid, stream);
    default: return launch_fused<T, 4, kFloatZero>(args, grid, stream);
  }
}

int sm_count(int device) { return cuda::device_attribute(cudaDevAttrMultiProcessorCount, device); }
int64_t l2_bytes(int device) { return std::max(1, cuda::device_attribute(cudaDevAttrL2CacheSize, device)); }

// The problem as the wgmma and gemv kernels take it (partials and counters
// are filled in by the caller when K is split).
w4a16_detail::TiledGemmArgs tiled_args(const void* x, int64_t ldx, const W4A16Weights& w, const TensorView& y,
                                       int64_t M, int iters, int group_shift, int split_k) {
  w4a16_detail::TiledGemmArgs a{};
  a.x = x;
  a.ldx = ldx;
  a.qweight = static_cast<const uint4*>(w.qweight());
  a.scale_zero = w.scale_zero();
  a.y = y.data;
  a.ldy = y.strides[0];
  a.M = static_cast<int>(M);
  a.K = static_cast<int>(w.K());
  a.N = static_cast<int>(w.N());
  a.N_pad = static_cast<int>(w.N_padded());
  a.iters = iters;
  a.group_shift = group_shift;
  a.split_k = split_k;
  return a;
}

void check_activation(const TensorView& v, const char* name, const W4A16Weights& w, int64_t cols) {
  if (v.device != Device::cuda)
    fail_argument(name, device_name(v.device), "a CUDA device tensor");
  if (v.dtype != w.act_dtype())
    fail(ErrorKind::invalid_argument, "'", name, "' has dtype ", dtype_name(v.dtype), ": expected ",
         dtype_name(w.act_dtype()), " (the weights were prepared for it)");
  if (v.rank != 2 || v.shape[1] != cols || v.strides[1] != 1)
    fail(ErrorKind::invalid_argument, "'", name, "' is ", v.shape_string(), ": expected [M, ", cols,
         "] with contiguous rows");
}

}  // namespace

const char* w4a16_strategy_name(W4A16Strategy s) {
  switch (s) {
    case W4A16Strategy::automatic: return "auto";
    case W4A16Strategy::data_parallel: return "data_parallel";
    case W4A16Strategy::split_k_atomic: return "split_k_atomic";
    case W4A16Strategy::split_k_deterministic: return "split_k_deterministic";
    case W4A16Strategy::stream_k: return "stream_k";
    case W4A16Strategy::decoupled: return "decoupled";
    case W4A16Strategy::wgmma: return "wgmma";
    case W4A16Strategy::gemv: return "gemv";
  }
  return "?";
}

std::optional<W4A16Strategy> parse_w4a16_strategy(std::string_view name) {
  for (auto s : {W4A16Strategy::automatic, W4A16Strategy::data_parallel, W4A16Strategy::split_k_atomic,
                 W4A16Strategy::split_k_deterministic, W4A16Strategy::stream_k, W4A16Strategy::decoupled,
                 W4A16Strategy::wgmma, W4A16Strategy::gemv})
    if (name == w4a16_strategy_name(s)) return s;
  return std::nullopt;
}

W4A16Weights W4A16Weights::prepare(const formats::QuantizedLinear& layer, DType act_dtype, int device) {
  const formats::PackedLinear packed = pack_w4a16_tiled(layer, act_dtype);
  W4A16Weights w;
  w.K_ = layer.K;
  w.N_ = layer.N;
  w.K_pad_ = w4a16_padded_k(layer.K);
  w.N_pad_ = w4a16_padded_n(layer.N);
  w.group_size_ = layer.group_size;
  w.float_zero_ = layer.zero_point == formats::ZeroPoint::float_min;
  w.act_dtype_ = act_dtype;
  w.device_ = device;
  cuda::DeviceGuard guard(device);
  auto upload = [&](const formats::HostTensor& t) {
    Buffer b(t.bytes.size(), Device::cuda, device);
    Buffer::copy(b.data(), Device::cuda, t.bytes.data(), Device::cpu, t.bytes.size());
    return b;
  };
  w.qweight_ = upload(packed.tensor("qweight"));
  w.scale_zero_ = upload(packed.tensor("scale_zero"));
  if (packed.has("perm")) w.perm_ = upload(packed.tensor("perm"));
  return w;
}

namespace {
// scale_zero[i] = (s, z) with s in [0.001, 0.01] and z a whole number in [0, 15].
template <typename T>
__global__ void random_scale_zero_kernel(uint32_t* out, int64_t count, uint64_t seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;  // splitmix64
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  const float s = 0.001f + 0.009f * static_cast<float>(h & 0xFFFFFF) / 16777216.0f;
  const float z = static_cast<float>((h >> 32) & 0xF);
  const T st = from_float<T>(s), zt = from_float<T>(z);
  out[i] = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&st)) |
           (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&zt)) << 16);
}
}  // namespace

W4A16Weights W4A16Weights::random(int64_t K, int64_t N, int group_size, DType act_dtype, uint64_t seed, int device) {
  (void)w4a16_layout_name(act_dtype);  // validates act_dtype
  LOWBIT_CHECK_ARG(formats::is_supported_group_size(group_size), "group_size", group_size,
                   "32, 64, 128, 256 or -1");
  LOWBIT_CHECK_ARG(K > 0 && N > 0 && (group_size == -1 || K % group_size == 0), "K", K,
                   "a positive multiple of the group size");
  W4A16Weights w;
  w.K_ = K;
  w.N_ = N;
  w.K_pad_ = w4a16_padded_k(K);
  w.N_pad_ = w4a16_padded_n(N);
  w.group_size_ = group_size;
  w.act_dtype_ = act_dtype;
  w.device_ = device;
  cuda::DeviceGuard guard(device);
  const int64_t groups = group_size == -1 ? 1 : w.K_pad_ / group_size;
  w.qweight_ = Buffer(static_cast<size_t>(w.K_pad_ * w.N_pad_ / 2), Device::cuda, device);
  w.scale_zero_ = Buffer(static_cast<size_t>(groups * w.N_pad_) * 4, Device::cuda, device);
  cuda::fill_random_bytes(w.qweight_.data(), w.qweight_.size(), seed);
  const int64_t count = groups * w.N_pad_;
  const unsigned blocks = static_cast<unsigned>((count + 255) / 256);
  if (act_dtype == DType::bf16)
    random_scale_zero_kernel<__nv_bfloat16><<<blocks, 256>>>(w.scale_zero_.as<uint32_t>(), count, seed + 1);
  else
    random_scale_zero_kernel<half><<<blocks, 256>>>(w.scale_zero_.as<uint32_t>(), count, seed + 1);
  LOWBIT_CUDA_CHECK_LAUNCH();
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  return w;
}

W4A16Workspace::W4A16Workspace() = default;
W4A16Workspace::~W4A16Workspace() {
  if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
}

void* W4A16Workspace::scratch(int slot, size_t bytes, bool zeroed, int device, cudaStream_t stream) {
  Slot& s = slots_[slot];
  if (s.buffer.size() < bytes || s.buffer.device_index() != device || s.zeroed != zeroed) {
    s.buffer = Buffer(std::max<size_t>(bytes, 256), Device::cuda, device);
    s.zeroed = zeroed;
    // On the caller's stream: a plain cudaMemset runs on the legacy default
    // stream, which a non-blocking stream (the engine's) does not wait for,
    // so the first kernel could read the counters before they were zeroed.
    if (zeroed) LOWBIT_CUDA_CHECK(cudaMemsetAsync(s.buffer.data(), 0, s.buffer.size(), stream));
  }
  return s.buffer.data();
}

void* W4A16Workspace::cublas_handle(int device) {
  if (cublas_ == nullptr || cublas_device_ != device) {
    if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
    cuda::DeviceGuard guard(device);
    cublasHandle_t h;
    LOWBIT_CUBLAS_CHECK(cublasCreate(&h));
    cublas_ = h;
    cublas_device_ = device;
  }
  return cublas_;
}

namespace {

// CTAs of the fused kernel that fit on the device at once (one full wave).
int resident_ctas(int rows_per_pass, bool bf16, int device) {
  int per_sm = 0;
  auto query = [&](auto kernel, int smem_bytes) {
    cuda::ensure_dynamic_smem(kernel, smem_bytes);
    LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem_bytes));
  };
  if (rows_per_pass == 16)
    bf16 ? query(w4a16_fused_kernel<__nv_bfloat16, 1, false>, SharedLayout<1>::kBytes)
         : query(w4a16_fused_kernel<half, 1, false>, SharedLayout<1>::kBytes);
  else if (rows_per_pass == 32)
    bf16 ? query(w4a16_fused_kernel<__nv_bfloat16, 2, false>, SharedLayout<2>::kBytes)
         : query(w4a16_fused_kernel<half, 2, false>, SharedLayout<2>::kBytes);
  else
    bf16 ? query(w4a16_fused_kernel<__nv_bfloat16, 4, false>, SharedLayout<4>::kBytes)
         : query(w4a16_fused_kernel<half, 4, false>, SharedLayout<4>::kBytes);
  return std::max(1, per_sm) * sm_count(device);
}

}  // namespace

bool w4a16_wgmma_available(int device) { return w4a16_detail::wgmma_supported(device); }

// `auto` takes the gemv kernel up to this many rows on sm_90a (w4a16_plan).
constexpr int64_t kGemvAutoMaxRows = 4;

W4A16Plan w4a16_plan(int64_t M, const W4A16Weights& w, const W4A16Options& options) {
  LOWBIT_CHECK_ARG(options.tail_split >= 0, "tail_split", options.tail_split, "0 (chosen), 1 (none) or >= 2");
  LOWBIT_CHECK_ARG(options.stream_k_ctas >= 0, "stream_k_ctas", options.stream_k_ctas,
                   "0 (chosen), 1 (none) or a CTA count >= 2");
  LOWBIT_CHECK_ARG(options.wgmma_group_rows >= 0, "wgmma_group_rows", options.wgmma_group_rows,
                   "0 (the rule) or a count of row tiles >= 1");
  LOWBIT_CHECK_ARG(options.shared_fixup >= 0 && options.shared_fixup <= 2, "shared_fixup", options.shared_fixup,
                   "0 (the rule), 1 (never) or 2 (past one wave too)");
  W4A16Plan plan{options.strategy, 1, M <= 16 ? 16 : (M <= 32 ? 32 : 64)};
  const bool bf16 = w.act_dtype() == DType::bf16;
  const int iters = static_cast<int>(w.K_padded() / 64);
  if (plan.strategy == W4A16Strategy::automatic) {
    // On sm_90a the wgmma kernel: at decode its 16-row tile beats the
    // mma.sync kernels (no 16-row mma padding, two warpgroups per x tile,
    // copy-engine loads), and above it serves up to 256 rows per weight read.
    // Above 512 rows it runs 256-row tiles one CTA per SM, so a grid that
    // fills its last wave poorly (e.g. 160 tiles on 132 SMs: 61%) lost to
    // the decoupled GEMM (dequantize once, cuBLAS at full rate) at M = 1024
    // (0.74x vs 0.62x cuBLAS on the 5120-column layers) while wgmma won or
    // tied the others; the decoupled GEMM is kept only where the leftover
    // tiles cannot be split along K (w4a16_wave_rule.h).
    // Without sm_90a: the fused mma.sync kernel up to 64 rows, then the
    // decoupled GEMM (cheaper than re-reading the weights every 64 rows).
    // The H100 measurements behind this: docs/w4a16-gemm.md.
    // Up to kGemvAutoMaxRows rows on sm_90a, the gemv kernel: since it has
    // no static shared memory (v26) it beats wgmma on all nine benchmark
    // shapes at M = 1 (geometric mean 2.42x cuBLAS at split 4 or 8 against
    // 2.22x; before, 2.17-2.19x against 2.24x, docs/w4a16-gemm.md "v7",
    // "v13", "v26"), and since its last CTA fetches the partials with
    // cp.async (v27) at 2-4 rows too (2.37 / 2.26 / 2.21x against 2.22 /
    // 2.14 / 2.13x). x staged for ~16 k-iterations takes shared memory that
    // leaves room for 5 CTAs per SM up to 3 rows, 4 at 4-7 and 3 at 8, and
    // wgmma's 16-row tile wins at 6 and 8 rows (2.11 against 1.97x, 2.15
    // against 1.75x; 5 rows not measured).
    if (w4a16_wgmma_available(w.device())) {
      plan.strategy = M <= kGemvAutoMaxRows ? W4A16Strategy::gemv : W4A16Strategy::wgmma;
      if (M > 512) {
        const int rows = 256;  // choose_wgmma_tile_rows above 512 rows
        const int64_t tiles = (M + rows - 1) / rows *
                              ((w.N_padded() + w4a16_detail::kWgmmaColsPerTile - 1) / w4a16_detail::kWgmmaColsPerTile);
        const int64_t wave = static_cast<int64_t>(w4a16_detail::wgmma_ctas_per_sm(rows, bf16)) * sm_count(w.device());
        const double filled = static_cast<double>(tiles) / static_cast<double>((tiles + wave - 1) / wave * wave);
        const bool tail =
            options.split_k <= 0 && choose_wgmma_tail(tiles, wave, iters, options.tail_split).tail_tiles > 0;
        // Fewer tiles than a wave run stream-K where that pays (below), so
        // their fill is not the grid's either. Asked as for whole row tiles:
        // where a partly filled last one keeps the wgmma plan off stream-K
        // (choose_wgmma_stream_k), this choice stays what it was before that
        // condition (v45), since wgmma's uniform split against the decoupled
        // GEMM was not measured there.
        const bool stream_k = options.split_k <= 0 && tiles < wave &&
                              choose_wgmma_stream_k(tiles, wave, iters, wgmma_uniform_split(tiles, wave, iters),
                                                    (M + rows - 1) / rows * rows, rows, options.stream_k_ctas,
                                                    M * w.K_padded() * 2, l2_bytes(w.device()), false) > 0;
        if (filled < 0.75 && !tail && !stream_k) plan.strategy = W4A16Strategy::decoupled;
      }
      // M = 256 q + r: the r rows past the last whole 256-row tile as a GEMM
      // of their own where a row of tiles costs well more than reading the
      // weights again (choose_row_remainder). Either part's plan taking the
      // decoupled GEMM keeps the call whole: cuBLAS pads nothing.
      if (plan.strategy == W4A16Strategy::wgmma && M > 256) {
        const int64_t col_tiles =
            (w.N_padded() + w4a16_detail::kWgmmaColsPerTile - 1) / w4a16_detail::kWgmmaColsPerTile;
        const int64_t wave_of_256 =
            static_cast<int64_t>(w4a16_detail::wgmma_ctas_per_sm(256, bf16)) * sm_count(w.device());
        const int tile_rows = choose_wgmma_tile_rows(M, col_tiles, wave_of_256);
        const int64_t r = choose_row_remainder(M, tile_rows, col_tiles, iters, wave_of_256,
                                               static_cast<int64_t>(w.weight_bytes()), options.row_remainder);
        if (r > 0) {
          W4A16Options whole = options;
          whole.row_remainder = 1;
          W4A16Plan first = w4a16_plan(M - r, w, whole);
          if (first.strategy == W4A16Strategy::wgmma && w4a16_plan(r, w, whole).strategy != W4A16Strategy::decoupled) {
            first.remainder_rows = r;
            return first;
          }
        }
      }
    } else {
      plan.strategy = M <= 64 ? W4A16Strategy::split_k_deterministic : W4A16Strategy::decoupled;
    }
  }
  if (plan.strategy == W4A16Strategy::gemv) {
    // split_k is the K split over the CTAs of each 128-column block: between
    // the least whose share of x fits in shared memory and one k-iteration
    // per CTA.
    plan.rows_per_pass = w4a16_detail::kGemvRowsPerPass;
    const int least = w4a16_detail::gemv_min_split(M, iters, w.device());
    const int choice = options.split_k > 0
                           ? options.split_k
                           : w4a16_detail::gemv_choose_split(M, static_cast<int>(w.N_padded()), iters,
                                                             w.group_size() == 32, w.device());
    plan.split_k = std::clamp(choice, least, std::max(least, iters));
    return plan;
  }
  if (plan.strategy == W4A16Strategy::wgmma) {
    const int r = options.rows_per_tile;
    LOWBIT_CHECK_ARG(r == 0 || r == 16 || r == 32 || r == 64 || r == 128 || r == 256, "rows_per_tile", r,
                     "0, 16, 32, 64, 128 or 256");
    const int64_t col_tiles =
        (w.N_padded() + w4a16_detail::kWgmmaColsPerTile - 1) / w4a16_detail::kWgmmaColsPerTile;
    const int sms = sm_count(w.device());
    auto tiles = [&](int rows) { return (M + rows - 1) / rows * col_tiles; };
    // The smallest tile that holds M up to 256 rows (larger M: 256-row
    // tiles, but 128-row ones at 257-384 rows where 256-row tiles would fill
    // the wave poorly: choose_wgmma_tile_rows).
    // Measured on the H100 (docs/w4a16-gemm.md): halving 128/256-row tiles
    // to fill the SMs instead of splitting K was slower at M = 128/256.
    plan.rows_per_pass =
        r > 0 ? r
              : choose_wgmma_tile_rows(M, col_tiles, static_cast<int64_t>(w4a16_detail::wgmma_ctas_per_sm(256, bf16)) * sms);
    // Decode tiles (16, 32 rows): fewer tiles than one wave of resident CTAs
    // leaves SMs idle, so K is split until the wave is full, keeping at
    // least 4 k-iterations per CTA. They are a pure weight stream shared by
    // the CTAs of an SM, so the slowest SM holds ceil(CTAs / SMs) of them:
    // Qwen3-14B's gate/up layer (272 tiles of 80 iterations) gave 3 CTAs to
    // 8 SMs and 2 to the rest at split 1 (66 us; 61 us at split 4). Up to 4x
    // the first split is tried, each CTA charged kCtaOverheadIters for its
    // pipeline fill and its share of the split-K reduction.
    // Larger tiles split K by the first split that fills the wave (the
    // balanced choice took larger splits there, and the run that had it was
    // slower at M >= 128: docs/w4a16-gemm.md); grids of more than a wave
    // split only the leftover tiles of their last one (choose_wgmma_tail,
    // w4a16_wave_rule.h; tail_split = 1 turns that off, for comparisons).
    const int64_t n_tiles = tiles(plan.rows_per_pass);
    // 64-row tiles: the build for two or for three resident CTAs per SM
    // (choose_wgmma_dense); the rules below then size the grid by its wave.
    const int ctas_forced = options.wgmma_ctas_per_sm;
    LOWBIT_CHECK_ARG(ctas_forced == 0 || ctas_forced == 2 || ctas_forced == 3, "wgmma_ctas_per_sm", ctas_forced,
                     "0 (the rule), 2 or 3");
    if (plan.rows_per_pass == w4a16_detail::kWgmmaDenseRows) {
      const int64_t wave_of_two =
          static_cast<int64_t>(w4a16_detail::wgmma_ctas_per_sm(plan.rows_per_pass, bf16, false)) * sms;
      plan.wgmma_dense = ctas_forced == 3 || (ctas_forced == 0 && choose_wgmma_dense(n_tiles, wave_of_two, iters));
    }
    const int64_t wave =
        static_cast<int64_t>(w4a16_detail::wgmma_ctas_per_sm(plan.rows_per_pass, bf16, plan.wgmma_dense)) * sms;
    // Whether a tile of this many K splits may share its fix-up (allowed,
    // built into this kernel, within the counter word's bits).
    auto fixup_shareable = [&](int64_t splits) {
      return options.shared_fixup != 1 && splits <= w4a16_detail::kWgmmaSharedFixupMaxSplits &&
             w4a16_detail::wgmma_shared_fixup_built(plan.rows_per_pass, plan.wgmma_dense);
    };
    const bool tail_rule = options.split_k <= 0 && options.tail_split != 1 &&
                           plan.rows_per_pass >= w4a16_detail::kWgmmaMinTailRows;
    int64_t choice = options.split_k;
    if (tail_rule) {
      const WgmmaTailSplit tail = choose_wgmma_tail(n_tiles, wave, iters, options.tail_split);
      plan.tail_tiles = tail.tail_tiles;
      plan.tail_split = tail.tail_split;
      if (tail.tail_tiles > 0) choice = 1;
    }
    // Fewer tiles than a wave: stream-K where the uniform split below
    // leaves much of the wave idle (choose_wgmma_stream_k). Forced, also
    // over a wave or more of tiles, in place of the tail split.
    if (options.split_k <= 0 && plan.rows_per_pass >= w4a16_detail::kWgmmaMinTailRows &&
        (n_tiles < wave || options.stream_k_ctas >= 2) && options.stream_k_ctas != 1) {
      // On 64- and 128-row tiles a uniform split that shares its fix-up
      // beats the short-K stream-K (choose_wgmma_stream_k, v48).
      const int64_t uniform = wgmma_uniform_split(n_tiles, wave, iters);
      const bool split_shares_fixup = plan.rows_per_pass < 256 && fixup_shareable(uniform);
      plan.stream_k_ctas = choose_wgmma_stream_k(n_tiles, wave, iters, uniform, M, plan.rows_per_pass,
                                                 options.stream_k_ctas, M * w.K_padded() * 2, l2_bytes(w.device()),
                                                 split_shares_fixup);
      if (plan.stream_k_ctas > 0) {
        choice = 1;
        plan.tail_tiles = 0;
        plan.tail_split = 1;
      }
    }
    if (choice <= 0) {
      constexpr int64_t kCtaOverheadIters = 3;
      const int64_t max_split = std::max(1, iters / 4);
      const int64_t first = wgmma_uniform_split(n_tiles, wave, iters);
      const int64_t last = plan.rows_per_pass <= 32 ? std::min(4 * first, max_split) : first;
      int64_t best_cost = -1;
      for (int64_t s = first; s <= last; ++s) {
        const int64_t cost = (n_tiles * s + sms - 1) / sms * ((iters + s - 1) / s + kCtaOverheadIters);
        if (best_cost < 0 || cost < best_cost) best_cost = cost, choice = s;
      }
    }
    plan.split_k = static_cast<int>(std::clamp<int64_t>(choice, 1, iters));
    // The shared fix-up makes the CTAs of a split tile wait for each other:
    // only where all the CTAs that wait fit in one wave, so that none waits
    // for a CTA that cannot start (the kernel bounds its waits besides).
    const int64_t waiting = plan.stream_k_ctas > 0 ? 0
                            : plan.tail_tiles > 0  ? plan.tail_tiles * plan.tail_split
                            : plan.split_k > 1     ? n_tiles * plan.split_k
                                                   : 0;
    const int splits_per_tile = plan.tail_tiles > 0 ? plan.tail_split : plan.split_k;
    plan.shared_fixup =
        waiting > 0 && (waiting <= wave || options.shared_fixup == 2) && fixup_shareable(splits_per_tile);
    if (plan.stream_k_ctas == 0) {
      const int64_t row_tiles = (M + plan.rows_per_pass - 1) / plan.rows_per_pass;
      const int64_t x_tile_bytes = static_cast<int64_t>(plan.rows_per_pass) * w.K_padded() * 2;
      plan.wgmma_group_rows =
          choose_wgmma_group_rows(row_tiles, x_tile_bytes, l2_bytes(w.device()), options.wgmma_group_rows);
    }
    return plan;
  }
  const int64_t m_passes = (M + plan.rows_per_pass - 1) / plan.rows_per_pass;
  const int64_t blocks = (w.N_padded() / 64) * m_passes;
  const bool split = plan.strategy == W4A16Strategy::split_k_atomic ||
                     plan.strategy == W4A16Strategy::split_k_deterministic;
  if (split || plan.strategy == W4A16Strategy::stream_k) {
    // The weight stream needs every SM busy with several CTAs: aim for exactly
    // one full wave of resident CTAs, so that none idles in a partial last wave.
    const int64_t wave = resident_ctas(plan.rows_per_pass, bf16, w.device());
    if (split) {
      const int64_t choice = options.split_k > 0 ? options.split_k : std::max<int64_t>(1, wave / blocks);
      plan.split_k = static_cast<int>(std::clamp<int64_t>(choice, 1, iters));
    } else {
      const int64_t per_pass = std::max<int64_t>(1, wave / m_passes);
      const int64_t choice = options.split_k > 0 ? options.split_k : per_pass;
      plan.split_k = static_cast<int>(std::clamp<int64_t>(choice, 1, (w.N_padded() / 64) * iters));
    }
  }
  return plan;
}

int64_t w4a16_row_sq_blocks(int64_t N) { return (N + 127) / 128; }
int64_t w4a16_row_sq_floats(int64_t N) {
  return int64_t{w4a16_detail::kGemvRowSqCopies} *
         w4a16_detail::gemv_row_sq_copy_stride(static_cast<int>(w4a16_row_sq_blocks(N)));
}

void w4a16_gemm(const TensorView& x, const W4A16Weights& w, const TensorView& y, W4A16Workspace& workspace,
                const W4A16Options& options, cudaStream_t stream) {
  check_activation(x, "x", w, options.x_silu_mul ? 2 * w.K() : w.K());
  check_activation(y, "y", w, w.N());
  if (options.x_silu_mul && options.strategy != W4A16Strategy::gemv)
    fail(ErrorKind::unsupported, "W4A16Options::x_silu_mul is read by the gemv strategy only; the options ask for '",
         w4a16_strategy_name(options.strategy), "'");
  if (options.x_silu_mul && w.act_order())
    fail(ErrorKind::unsupported, "W4A16Options::x_silu_mul does not take act-order weights");
  const bool x_norm = options.x_norm_weight != nullptr;
  if ((x_norm || options.residual_row_sq != nullptr) && options.strategy != W4A16Strategy::gemv)
    fail(ErrorKind::unsupported, "W4A16Options::", x_norm ? "x_norm_weight" : "residual_row_sq",
         " is done by the gemv strategy only; the options ask for '", w4a16_strategy_name(options.strategy), "'");
  if (x_norm) {
    if (w.act_order()) fail(ErrorKind::unsupported, "W4A16Options::x_norm_weight does not take act-order weights");
    if (options.x_silu_mul)
      fail(ErrorKind::unsupported, "W4A16Options::x_norm_weight and x_silu_mul both say how to read x: pick one");
    if (options.residual_row_sq != nullptr)
      fail(ErrorKind::unsupported, "W4A16Options::x_norm_weight and residual_row_sq in one GEMM are not supported "
                                   "(a decoder layer's GEMMs need one or the other)");
    if (options.x_norm_row_sq == nullptr)
      fail(ErrorKind::invalid_argument, "W4A16Options::x_norm_weight needs x_norm_row_sq (the sums of squares)");
    if (!(options.x_norm_eps >= 0.0f) || !std::isfinite(options.x_norm_eps))
      fail_argument("x_norm_eps", options.x_norm_eps, "a finite value >= 0");
  }
  if (options.attention_inputs != nullptr) {
    const W4A16AttentionInputs& ai = *options.attention_inputs;
    if (options.strategy != W4A16Strategy::gemv)
      fail(ErrorKind::unsupported, "W4A16Options::attention_inputs is done by the gemv strategy only; the options "
                                   "ask for '", w4a16_strategy_name(options.strategy), "'");
    if (options.residual_row_sq != nullptr)
      fail(ErrorKind::unsupported, "W4A16Options::attention_inputs and residual_row_sq in one GEMM are not supported");
    if (ai.num_heads <= 0 || ai.num_kv_heads <= 0 || ai.head_dim <= 0 || ai.head_dim % 2 != 0 ||
        128 % ai.head_dim != 0)
      fail(ErrorKind::unsupported, "W4A16Options::attention_inputs: ", ai.num_heads, " heads, ", ai.num_kv_heads,
           " KV heads of ", ai.head_dim, ": expected positive counts and an even head dimension that divides 128");
    if ((ai.num_heads + 2 * ai.num_kv_heads) * ai.head_dim != w.N())
      fail(ErrorKind::invalid_argument, "W4A16Options::attention_inputs: (", ai.num_heads, " + 2 x ",
           ai.num_kv_heads, ") heads of ", ai.head_dim, " are not the GEMM's N = ", w.N());
    if (ai.positions == nullptr || ai.inv_freq == nullptr || ai.q_out == nullptr || ai.k_out == nullptr ||
        ai.v_out == nullptr)
      fail(ErrorKind::invalid_argument,
           "W4A16Options::attention_inputs needs positions, inv_freq, q_out, k_out and v_out");
    if (!(ai.eps >= 0.0f) || !std::isfinite(ai.eps))
      fail_argument("attention_inputs eps", ai.eps, "a finite value >= 0");
    if (ai.q_rotation_signs != nullptr && ai.head_dim != 64 && ai.head_dim != 128)
      fail(ErrorKind::unsupported, "W4A16Options::attention_inputs: the query rotation is built for head_dim 64 "
                                   "and 128, not ", ai.head_dim);
    if (ai.q_rotation_signs != nullptr && !(std::isfinite(ai.q_scale) && ai.q_scale > 0.0f))
      fail_argument("attention_inputs q_scale", ai.q_scale, "a finite value > 0");
  }
  if (x.shape[0] != y.shape[0])
    fail(ErrorKind::invalid_argument, "x is ", x.shape_string(), " and y is ", y.shape_string(),
         ": expected the same number of rows M");
  if (x.strides[0] % 8 != 0 || reinterpret_cast<uintptr_t>(x.data) % 16 != 0)
    fail(ErrorKind::invalid_argument, "x rows must start at 16-byte boundaries: row stride ", x.strides[0],
         " elements, address ", x.data, ": expected a multiple of 8 elements and a 16-byte aligned pointer");
  const int64_t M = x.shape[0];
  if (M == 0) return;
  if (M > (int64_t{1} << 30)) fail_argument("M", M, "at most 2^30 rows");
  cuda::DeviceGuard guard(w.device());
  const W4A16Plan plan = w4a16_plan(M, w, options);
  if (plan.remainder_rows > 0) {
    // Two GEMMs on the same stream, the first M - r rows and the last r
    // (W4A16Plan::remainder_rows); each plans its own rows again.
    const int64_t first_rows = M - plan.remainder_rows;
    W4A16Options whole = options;
    whole.row_remainder = 1;
    auto rows = [&](const TensorView& t, int64_t begin, int64_t count) {
      TensorView v = t;
      v.shape[0] = count;
      v.data = static_cast<char*>(t.data) + begin * t.strides[0] * static_cast<int64_t>(dtype_bytes(t.dtype, 1));
      return v;
    };
    w4a16_gemm(rows(x, 0, first_rows), w, rows(y, 0, first_rows), workspace, whole, stream);
    w4a16_gemm(rows(x, first_rows, plan.remainder_rows), w, rows(y, first_rows, plan.remainder_rows), workspace,
               whole, stream);
    return;
  }
  const bool bf16 = w.act_dtype() == DType::bf16;
  const size_t elem = 2;

  // Act-order: gather the activations into the sorted row order of the weights.
  const void* xin = x.data;
  int64_t ldx = x.strides[0];
  if (w.act_order()) {
    void* xp = workspace.scratch(0, static_cast<size_t>(M * w.K()) * elem, false, w.device(), stream);
    const int64_t total = M * w.K();
    const int threads = 256;
    const unsigned blocks = static_cast<unsigned>((total + threads - 1) / threads);
    if (bf16)
      permute_columns_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(x.data), ldx, w.perm(), static_cast<__nv_bfloat16*>(xp),
          static_cast<int>(M), static_cast<int>(w.K()));
    else
      permute_columns_kernel<half><<<blocks, threads, 0, stream>>>(static_cast<const half*>(x.data), ldx, w.perm(),
                                                                   static_cast<half*>(xp), static_cast<int>(M),
                                                                   static_cast<int>(w.K()));
    LOWBIT_CUDA_CHECK_LAUNCH();
    xin = xp;
    ldx = w.K();
  }
  const int iters = static_cast<int>(w.K_padded() / 64);
  const int rows_per_group = static_cast<int>(w.group_size() > 0 ? w.group_size() : w.K_padded());

  if (plan.strategy == W4A16Strategy::decoupled) {
    void* wf = workspace.scratch(1, static_cast<size_t>(w.K_padded() * w.N_padded()) * elem, false, w.device(),
                                 stream);
    const unsigned blocks = static_cast<unsigned>((w.N_padded() / 64) * iters);
    auto q = static_cast<const uint4*>(w.qweight());
    const int np = static_cast<int>(w.N_padded());
    if (bf16) {
      if (w.float_zero())
        dequantize_tiled_kernel<__nv_bfloat16, true><<<blocks, kThreads, 0, stream>>>(
            q, w.scale_zero(), static_cast<__nv_bfloat16*>(wf), iters, rows_per_group, np);
      else
        dequantize_tiled_kernel<__nv_bfloat16, false><<<blocks, kThreads, 0, stream>>>(
            q, w.scale_zero(), static_cast<__nv_bfloat16*>(wf), iters, rows_per_group, np);
    } else {
      if (w.float_zero())
        dequantize_tiled_kernel<half, true><<<blocks, kThreads, 0, stream>>>(
            q, w.scale_zero(), static_cast<half*>(wf), iters, rows_per_group, np);
      else
        dequantize_tiled_kernel<half, false><<<blocks, kThreads, 0, stream>>>(
            q, w.scale_zero(), static_cast<half*>(wf), iters, rows_per_group, np);
    }
    LOWBIT_CUDA_CHECK_LAUNCH();
    // Row-major y[M, N] = x[M, K] W[K, N] is column-major y^T = W^T x^T.
    auto handle = static_cast<cublasHandle_t>(workspace.cublas_handle(w.device()));
    LOWBIT_CUBLAS_CHECK(cublasSetStream(handle, stream));
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    LOWBIT_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(w.N()), static_cast<int>(M),
                                     static_cast<int>(w.K()), &alpha, wf, type, static_cast<int>(w.N_padded()), xin,
                                     type, static_cast<int>(ldx), &beta, y.data, type,
                                     static_cast<int>(y.strides[0]), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }

  const int group_shift = w4a16_detail::group_shift_of(w.group_size());
  if (plan.strategy == W4A16Strategy::wgmma) {
    if (!w4a16_wgmma_available(w.device()))
      fail(ErrorKind::unsupported, "W4A16 strategy 'wgmma' needs a compute capability 9.0 device and a build for "
                                   "sm_90a (CMAKE_CUDA_ARCHITECTURES with 90a)");
    w4a16_detail::TiledGemmArgs a = tiled_args(xin, ldx, w, y, M, iters, group_shift, plan.split_k);
    const int64_t tiles = (M + plan.rows_per_pass - 1) / plan.rows_per_pass *
                          ((w.N_padded() + w4a16_detail::kWgmmaColsPerTile - 1) / w4a16_detail::kWgmmaColsPerTile);
    // Slot 2: the partials (each split's whole tile of fp32 accumulators,
    // per tile or per tail tile; stream-K: one whole tile per CTA); slot 3:
    // one counter per tile, two with the shared fix-up (kept zero).
    const size_t tile_bytes =
        static_cast<size_t>(plan.rows_per_pass) * w4a16_detail::kWgmmaColsPerTile * sizeof(float);
    if (plan.stream_k_ctas > 0) {
      a.stream_k_ctas = static_cast<int>(plan.stream_k_ctas);
      a.partial = static_cast<float*>(
          workspace.scratch(2, static_cast<size_t>(plan.stream_k_ctas) * tile_bytes, false, w.device(), stream));
    } else if (plan.tail_tiles > 0) {
      a.tail_tiles = static_cast<int>(plan.tail_tiles);
      a.tail_split = plan.tail_split;
      a.partial = static_cast<float*>(workspace.scratch(
          2,
          static_cast<size_t>(plan.tail_tiles) * static_cast<size_t>(plan.tail_split) * tile_bytes, false,
          w.device(), stream));
    } else if (plan.split_k > 1) {
      a.partial = static_cast<float*>(workspace.scratch(
          2, static_cast<size_t>(tiles) * static_cast<size_t>(plan.split_k) * tile_bytes, false, w.device(),
          stream));
    }
    a.group_rows = static_cast<int>(plan.wgmma_group_rows);
    // With one row tile every weight is read once per K split; with more,
    // the row tiles of a column tile read it again, from L2 when it stayed.
    if (options.l2_streaming && M <= plan.rows_per_pass) a.weight_stream_bytes = w.qweight_bytes();
    a.shared_fixup = plan.shared_fixup;
    if (plan.stream_k_ctas > 0 || plan.tail_tiles > 0 || plan.split_k > 1)
      a.counters = static_cast<int*>(workspace.scratch(
          3, static_cast<size_t>(tiles) * (plan.shared_fixup ? 2 : 1) * sizeof(int), true, w.device(), stream));
    w4a16_detail::launch_wgmma(a, plan.rows_per_pass, plan.wgmma_dense, bf16, w.float_zero(), stream);
    return;
  }

  if (plan.strategy == W4A16Strategy::gemv) {
    w4a16_detail::TiledGemmArgs a = tiled_args(xin, ldx, w, y, M, iters, group_shift, plan.split_k);
    a.x_up_offset = options.x_silu_mul ? w.K() : 0;
    a.residual_row_sq = options.residual_row_sq;
    a.x_norm_weight = options.x_norm_weight;
    a.x_norm_row_sq = options.x_norm_row_sq;
    a.x_norm_blocks = static_cast<int>(w4a16_row_sq_blocks(w.K()));
    a.x_norm_eps = options.x_norm_eps;
    a.early_dependents = static_cast<int64_t>(w.qweight_bytes()) >= options.gemv_early_dependents_bytes;
    // Several passes of 8 rows read the weights again: no window then.
    if (options.l2_streaming && M <= w4a16_detail::kGemvRowsPerPass) a.weight_stream_bytes = w.qweight_bytes();
    if (options.attention_inputs != nullptr) {
      const W4A16AttentionInputs& ai = *options.attention_inputs;
      a.attention_inputs = true;
      a.attention = {ai.q_norm,
                     ai.k_norm,
                     ai.positions,
                     ai.inv_freq,
                     ai.q_out,
                     ai.k_out,
                     ai.v_out,
                     static_cast<int>(ai.num_heads),
                     static_cast<int>(ai.num_kv_heads),
                     static_cast<int>(ai.head_dim),
                     ai.eps,
                     ai.rope_interleaved,
                     ai.q_rotation_signs,
                     ai.q_scale};
    }
    if (plan.split_k > 1) {
      // Slot 2: the partials of every split; slot 3: one counter per column block (kept zero).
      const int N_pad = static_cast<int>(w.N_padded());
      a.partial = static_cast<float*>(workspace.scratch(
          2, w4a16_detail::gemv_partial_floats(plan.split_k, N_pad) * sizeof(float), false, w.device(), stream));
      a.counters = static_cast<int*>(workspace.scratch(
          3, static_cast<size_t>(w4a16_detail::gemv_col_blocks(N_pad)) * sizeof(int), true, w.device(), stream));
    }
    w4a16_detail::launch_gemv(a, bf16, w.float_zero(), w.device(), stream);
    return;
  }

  KernelArgs args{};
  args.x = xin;
  args.ldx = ldx;
  args.qweight = static_cast<const uint4*>(w.qweight());
  args.scale_zero = w.scale_zero();
  args.y = y.data;
  args.ldy = y.strides[0];
  args.M = static_cast<int>(M);
  args.K = static_cast<int>(w.K());
  args.N = static_cast<int>(w.N());
  args.N_pad = static_cast<int>(w.N_padded());
  args.iters = iters;
  args.rows_per_group = rows_per_group;
  args.group_shift = group_shift;
  const int m_passes = static_cast<int>((M + plan.rows_per_pass - 1) / plan.rows_per_pass);
  dim3 grid(static_cast<unsigned>(w.N_padded() / 64), 1, static_cast<unsigned>(m_passes));
  if (plan.strategy == W4A16Strategy::data_parallel) {
    args.split_k = 1;
    args.mode = kReduceDirect;
  } else {
    if (plan.strategy == W4A16Strategy::stream_k) {
      args.split_k = 1;
      args.mode = kStreamK;
      grid.x = static_cast<unsigned>(plan.split_k);
    } else {
      args.split_k = plan.split_k;
      args.mode = plan.strategy == W4A16Strategy::split_k_atomic ? kReduceAtomic : kReduceOrdered;
      grid.y = static_cast<unsigned>(plan.split_k);
    }
    const bool ordered = args.mode == kReduceOrdered;
    const size_t partial_floats =
        static_cast<size_t>(M * w.N_padded()) * (ordered ? static_cast<size_t>(args.split_k) : 1);
    // Slot 2: the atomic sums (kept zero) or the ordered partials; slot 3: counters (kept zero).
    args.partial =
        static_cast<float*>(workspace.scratch(2, partial_floats * sizeof(float), !ordered, w.device(), stream));
    args.counters = static_cast<int*>(workspace.scratch(
        3, static_cast<size_t>(m_passes) * static_cast<size_t>(w.N_padded() / 64) * sizeof(int), true, w.device(),
        stream));
  }
  if (bf16) {
    if (w.float_zero())
      launch_fused_rows<__nv_bfloat16, true>(args, plan.rows_per_pass, grid, stream);
    else
      launch_fused_rows<__nv_bfloat16, false>(args, plan.rows_per_pass, grid, stream);
  } else {
    if (w.float_zero())
      launch_fused_rows<half, true>(args, plan.rows_per_pass, grid, stream);
    else
      launch_fused_rows<half, false>(args, plan.rows_per_pass, grid, stream);
  }
}

W4A16Tuning w4a16_tune(const W4A16Weights& w, int64_t M, W4A16Workspace& workspace, cudaStream_t stream, int reps) {
  LOWBIT_CHECK_ARG(M >= 1, "M", M, "at least 1");
  LOWBIT_CHECK_ARG(reps >= 1, "reps", reps, "at least 1");
  W4A16Tuning tuning;
  std::vector<std::pair<std::string, W4A16Options>> candidates = {{"auto", W4A16Options{}}};
  if (M <= w4a16_detail::kGemvRowsPerPass) {
    candidates.emplace_back("gemv", W4A16Options{W4A16Strategy::gemv, 0});
    const int iters = static_cast<int>(w.K_padded() / 64);
    for (int split : {1, 2, 4, 8, 12, 16})
      if (split <= iters && split >= w4a16_detail::gemv_min_split(M, iters, w.device()))
        candidates.emplace_back("gemv_s" + std::to_string(split), W4A16Options{W4A16Strategy::gemv, split});
  }
  if (candidates.size() == 1) {
    tuning.best = candidates[0].second;
    return tuning;
  }
  cuda::DeviceGuard guard(w.device());
  // The kernels take the same time whatever the values: x is random fp16 bits
  // (finite as bf16 too), y is overwritten.
  Buffer x(static_cast<size_t>(M * w.K()) * 2, Device::cuda, w.device());
  Buffer y(static_cast<size_t>(M * w.N()) * 2, Device::cuda, w.device());
  cuda::fill_random_f16(x.data(), static_cast<size_t>(M * w.K()), 17, 1.0f, stream);
  const TensorView xv = TensorView::contiguous(x.data(), w.act_dtype(), {M, w.K()}, Device::cuda);
  const TensorView yv = TensorView::contiguous(y.data(), w.act_dtype(), {M, w.N()}, Device::cuda);
  cuda::CudaTimerOptions timer;
  timer.warmup = 2;
  timer.reps = reps;
  timer.flush_by_reading = true;
  timer.stream = stream;
  std::vector<TimedGemvSplit> gemv_times;
  for (const auto& [name, options] : candidates) {
    const double us = cuda::time_cuda([&](cudaStream_t s) { w4a16_gemm(xv, w, yv, workspace, options, s); }, timer)
                          .median_us;
    tuning.candidates.emplace_back(name, us);
    if (options.strategy == W4A16Strategy::gemv) gemv_times.push_back({w4a16_plan(M, w, options).split_k, us});
  }
  tuning.best = candidates[0].second;  // auto
  tuning.best_us = tuning.candidates[0].second;
  if (!gemv_times.empty()) {
    // Among the gemv splits, a larger one only when clearly faster
    // (choose_gemv_split); its time is the best of its runs.
    const int split = choose_gemv_split(gemv_times, kGemvSplitMargin);
    tuning.fastest_gemv = W4A16Options{W4A16Strategy::gemv, split};
    for (const TimedGemvSplit& t : gemv_times)
      if (t.split == split && (tuning.fastest_gemv_us == 0 || t.us < tuning.fastest_gemv_us)) tuning.fastest_gemv_us = t.us;
    if (tuning.fastest_gemv_us < tuning.best_us) {
      tuning.best = tuning.fastest_gemv;
      tuning.best_us = tuning.fastest_gemv_us;
    }
  }
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return tuning;
}

}  // namespace lowbit
