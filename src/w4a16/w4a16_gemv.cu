// The decode W4A16 kernel (strategy `gemv`, sm_80 and later): y[M, N] =
// x[M, K] * dequant(W) for passes of up to 8 rows of x.
//
// At decode the GEMM is a stream of weights and nothing else, so the kernel
// is built around keeping HBM busy with the fewest instructions per byte:
//   - Each thread streams its own 16 bytes per 64-row k-iteration (one
//     column strip of the tiled layout per warp) through a private ring of
//     kDepth stages in shared memory, filled with cp.async. A thread only
//     ever reads back what it copied itself, so the ring needs no barrier
//     and no mbarrier: `cp.async.wait_group` per thread is the whole
//     protocol. The ring holds the bytes in flight (5 CTAs x 256 threads x
//     6 stages x 16 B = 120 KB per SM), which registers could not: a register
//     ring of the same depth spilled.
//   - The codes go into mma.m16n8k16 as the A operand (16 output columns x
//     16 rows of K; a lane's 16 bytes are the A fragments of four mma) with
//     the rows of x as its n = 8 columns, raw: one LOP3 turns a register
//     pair into 1024 + q (fp16; 1024 + 16q for the codes in bits 4..7, which
//     meet x / 16) or 128 + q (bf16). Scale and zero point are applied once
//     per window of up to 4 k-iterations of one group and column, in fp32,
//     from per-row sums of x computed when x is staged:
//     y += s * (dot - bias * S') + offset * X. No per-weight subtraction or
//     multiply, and no 16-bit rounding of the weights.
//   - x is staged once per CTA for its K range, already in the fragment
//     order (two 16-byte shared loads per lane and iteration).
//   - K is split over the CTAs of a column block; the last CTA of a block (a
//     counter per block) loads every partial at once and sums them in split
//     order: the result is bitwise reproducible. (Summing through a thread
//     block cluster's distributed shared memory instead, for splits up to 8,
//     measured the same or up to 23% slower on the H100: cluster launches
//     constrain where CTAs run.)
//   - For the decode step, instances that also read x through RMSNorm, add
//     y to the residual, or make the attention inputs instead of y
//     (GemvIo, W4A16Options): each is its own instance, and the epilogues
//     are out of line, because at 48 registers any of that code changed the
//     allocation of the others' k-loop.
//   - Launched with programmatic dependent launch (lowbit/cuda/pdl.cuh): the
//     first stages' weights and scales are requested before waiting for the
//     previous kernel; x, y and the workspace only after. The next kernel is
//     let launch at the same point when the weights are large (v28), else
//     after the K loop.
//   - One-row calls (the decode step at batch 1) run instances built for
//     one row (kOneRow): no other row's fold, x staged without run-time
//     divisions, the fused epilogues inlined. The compiler unrolls their
//     k-loop by two, which also drops the accumulator copies after the mma
//     chain: ~69 SASS instructions per k-iteration at group 128 against ~86
//     (v38), and with the rest of v39 the Qwen3-14B decode step 279 -> 305
//     tok/s on an H200 (docs/w4a16-gemm.md, v39). Group 32's instances have
//     no one-row copy.
//   - Group 128 (fold windows of two k-iterations) runs most of its range in
//     a loop over whole windows with no per-iteration tests (~54 SASS per
//     k-iteration at one row, v43); other groups, and each range's first
//     and last iterations, take the general loop.
//   - The ring is walked by running shared addresses (the slot read, the
//     slot refilled), and a slot's scale words are a fixed map of its codes'
//     address: no slot index arithmetic per k-iteration.
//   - No static shared memory: 16-48 bytes of it (a last-CTA flag, the
//     rows' 1 / rms) ahead of the dynamic region cost a decode step 2.4% and
//     single calls up to 5% (docs/w4a16-gemm.md, "v26").
// Measured on the H100 (docs/w4a16-gemm.md, "v7", "v26"): at M = 1, with L2
// evicted by writing (as the peers' anchors), it beats the wgmma kernel on
// all nine benchmark shapes since v26 (geometric mean 2.42x cuBLAS at split
// 4 or 8 against 2.22x; until then 2.17-2.19x against 2.24x), and since v27
// at 2-4 rows too, so `auto` takes it for 1-4 rows, at gemv_split_rule's
// K split; w4a16_tune times the splits per shape for the engine. With more
// rows the x staged for a CTA's ~16 k-iterations leaves room for fewer CTAs
// per SM (5 up to 3 rows, 4 at 4-7, 3 at 8), and from 6 rows wgmma's 16-row
// tile is faster (v27). It replaced a bulk-copy stream-K kernel (1.71x at
// M = 1) and runs on sm_80.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <type_traits>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/kv/hadamard_warp.cuh"
#include "lowbit/ops/head_math.cuh"
#include "lowbit/ops/silu.cuh"
#include "lowbit/w4a16/w4a16_tune_rule.h"
#include "w4a16_device.cuh"
#include "w4a16_gemv.h"

namespace lowbit::w4a16_detail {
namespace {

constexpr int kWarps = 8;  // column strips (16 columns) per CTA
constexpr int kThreads = kWarps * 32;
// k-iterations in flight per thread. LOWBIT_GEMV_DEPTH (a compile
// definition) builds another depth for measurement only.
#ifndef LOWBIT_GEMV_DEPTH
#define LOWBIT_GEMV_DEPTH 6
#endif
constexpr int kDepth = LOWBIT_GEMV_DEPTH;
// Resident CTAs per SM the registers are budgeted for (48 per thread at 5,
// 64 at 4). Shared memory allows 5 only for one scale group per k-iteration
// on Hopper (~40 KB per CTA of 227 KB); group 32's larger ring (~49 KB), and
// sm_80's 164 KB per SM, allow 4 whatever the registers, so those variants
// take the 64 registers instead of spilling.
// (The host's split rule takes the same number: gemv_choose_split.)
constexpr int ctas_per_sm_budget(bool two_groups, bool hopper) { return hopper && !two_groups ? 5 : 4; }
template <bool kTwoGroups>
constexpr int min_ctas_per_sm() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return ctas_per_sm_budget(kTwoGroups, false);
#else
  return ctas_per_sm_budget(kTwoGroups, true);
#endif
}
// The scale and zero point are applied once per window of up to 4
// k-iterations of one group (2 for group 128, 4 for 256 and per channel, 1
// for 64 and 32): the mma accumulates the raw codes across the window.
// Longer windows would let the raw sums (~1024 x the x sums) grow until the
// tensor cores' accumulation rounding shows.
constexpr int kFoldShiftMax = 2;
// log2 of a fold window's k-iterations: a window is one scale group (64-256
// rows; per channel: kFoldShiftMax), one iteration for group 32.
__host__ __device__ constexpr int gemv_fold_shift(bool two_groups, int group_shift) {
  if (two_groups) return 0;
  if (group_shift < 0) return kFoldShiftMax;
  return group_shift - 6 < kFoldShiftMax ? group_shift - 6 : kFoldShiftMax;
}

// Shared memory of a CTA: the per-thread rings, then x staged in fragment
// order ([row][iteration][t][16 halves]), then per row and iteration the sums
// (S' and X of rows k0..k0+31, then of k0+32..k0+63) the fold needs, then
// the same summed over each fold window (kFoldIters below).
struct GemvSmem {
  int scale_words;  // 2 (one group per iteration) or 4 (group 32: two)
  int rows, range;  // rows of x in the pass, k-iterations of the longest range
  __host__ __device__ int ring_codes_bytes() const { return kDepth * kThreads * 16; }
  __host__ __device__ int ring_scales_bytes() const { return kDepth * kThreads * 4 * scale_words; }
  __host__ __device__ int x_offset() const { return ring_codes_bytes() + ring_scales_bytes(); }
  __host__ __device__ int sums_offset() const { return x_offset() + rows * range * 128; }
  __host__ __device__ int window_sums_offset() const { return sums_offset() + rows * range * 16; }
  // W4A16Options::x_norm_weight: 1 / rms of each row of the pass.
  __host__ __device__ int x_inv_rms_offset() const { return window_sums_offset() + rows * range * 16; }
  __host__ __device__ int bytes() const { return x_inv_rms_offset() + kGemvRowsPerPass * 4; }
};

// The scale/zero words: 4-byte copies (cp.async.cg, which the weights use
// to bypass L1, moves only 16 bytes); through L1, the second k-iteration of
// a 128-row group finds its words there.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async16_bypass(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// Reads of a thread's own ring slots by shared address. `volatile`: the
// slots are written by cp.async, which the compiler does not see, so these
// must stay after the cp.async.wait_group (also volatile) that covers them.
__device__ __forceinline__ uint4 ld_shared_u4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
template <int kWords>
__device__ __forceinline__ void ld_shared_words(uint32_t addr, uint32_t (&w)[kWords]) {
  if constexpr (kWords == 2) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w[0]), "=r"(w[1]) : "r"(addr));
  } else {
    static_assert(kWords == 4);
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(addr));
  }
}

template <typename T>
__device__ __forceinline__ uint32_t scale_pair_by_16th(uint32_t v) {
  using V = typename Vec2<T>::type;
  if constexpr (std::is_same_v<T, half>) return as_u32(__hmul2(from_u32<V>(v), __float2half2_rn(0.0625f)));
  else return v;  // bf16 codes all carry 128 + q: x is used as is
}
__device__ __forceinline__ float scalar_to_float(half v) { return __half2float(v); }
__device__ __forceinline__ float scalar_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ float2 pair_to_float2(uint32_t v) {
  if constexpr (std::is_same_v<T, half>) return __half22float2(from_u32<half2>(v));
  else return __bfloat1622float2(from_u32<__nv_bfloat162>(v));
}

// Eight elements of x through RMSNorm, each rounded once as ops::rms_norm
// rounds it: (x * inv_rms) * w in fp32.
template <typename T>
__device__ __forceinline__ uint4 rms_normalized(uint4 x, uint4 w, float inv_rms) {
  const T* x8 = reinterpret_cast<const T*>(&x);
  const T* w8 = reinterpret_cast<const T*>(&w);
  uint4 out;
  T* o8 = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int i = 0; i < 8; ++i) o8[i] = from_float<T>(scalar_to_float(x8[i]) * inv_rms * scalar_to_float(w8[i]));
  return out;
}

// What the end of the kernel needs to write y (or its split-K partials).
struct OutputArgs {
  void* y;
  int64_t ldy;
  float* partial;
  int* counters;
  int N, N_pad, split_k, split, m0, rows, smem_bytes;
};

// The split-K count (atomic_add_acq_rel_gpu, by thread 0 once every thread's
// partials are stored) and its answer to every thread through the barrier
// itself: whether this CTA is the block's last. No __shared__ flag: static
// shared memory moved the dynamic shared memory of the decode attention
// kernel and cost it 7-10% (docs/kv-cache.md, v26).
__device__ __forceinline__ bool last_to_arrive(int* counter, int ctas) {
  return __syncthreads_or(threadIdx.x == 0 && atomic_add_acq_rel_gpu(counter, 1) == ctas - 1);
}

// A CTA's split-K partials: rows < rows of each warp's 16 columns into its
// split's rows (`stride` floats apart, w4a16_gemv_workspace.h). Every warp
// stores, those past N_pad too (they computed on the last strip), so that
// every partial the last CTA of the block loads was stored in this call.
// acc[e]: column 16 * warp + g (e < 2) or + 8 of the block, row 2t + (e & 1).
__device__ __forceinline__ void store_partials(float* mine, int64_t stride, int rows, const float (&acc)[4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int col0 = (blockIdx.x * kWarps + threadIdx.x / 32) * 16 + g;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = 2 * t + (e & 1), col = e < 2 ? col0 : col0 + 8;
    if (row < rows) __stcg(mine + static_cast<int64_t>(row) * stride + col, acc[e]);
  }
}

// The last CTA's split-K sum, first half: elements [e0, e0 + n) of the
// block's [row][column] outputs from every split's partials into
// red[split * n + i] (i = element - e0), as 16-byte cp.async copies that
// are all in flight at once, then the barrier. e0 and n are multiples of 4,
// so a piece never leaves its row. Register loads, four per thread and round
// (until v27), made this one L2 round trip after another, one per 1024
// partials: 16 in a row for 8 rows at split 16 (docs/w4a16-gemm.md, v27).
__device__ __forceinline__ void fetch_partials(float* red, const float* partial, int64_t stride, int split_k,
                                               int block_col, int e0, int n) {
  constexpr int kCols = kWarps * 16;
  const int pieces = n / 4;
  const uint32_t red_addr = smem_address(red);
  // Splits outside, pieces inside: no division by a run-time count.
  for (int s = 0; s < split_k; ++s) {
    const float* split_partial = partial + static_cast<int64_t>(s) * kGemvRowsPerPass * stride + block_col;
    for (int p = threadIdx.x; p < pieces; p += kThreads) {
      const int e = e0 + 4 * p;
      cp_async16_bypass(red_addr + (s * pieces + p) * 16, split_partial + (e / kCols) * stride + e % kCols);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
}
// Elements per fetch_partials round: a multiple of 4 whose copies of every
// split fit in `floats` of shared memory.
__device__ __forceinline__ int partial_chunk(int floats, int split_k) { return max(4, floats / split_k / 4 * 4); }

// The fused epilogues below (out of line: inlined into the kernel, their
// code changed the register allocation of its k-loop, e.g. 8 more
// instructions per k-iteration, two of them constant loads) start from the
// plain kernel's stores and split-K sum, with each final value handed to
// `finish(row, column of the block, value)` instead of stored, and then
// `done()` after a barrier, by every thread of the CTA that holds the
// block's final values (every CTA at split 1, the last one of the block
// otherwise). `early()` runs in every CTA before the split-K count: loads
// whose latency can hide behind it. The first 4 KB of shared memory are the
// epilogue's (`ring` overlays it at split 1, hence the barrier first).
// acc[e]: column col0 (e < 2) or col0 + 8 of the lane's warp strip, row
// 2t + (e & 1) of the pass.
constexpr int kEpilogueFloats = kGemvRowsPerPass * kWarps * 16;

template <typename Early, typename Finish, typename Done>
__device__ __forceinline__ void fused_epilogue(const OutputArgs& a, const float (&acc)[4], Early&& early,
                                               Finish&& finish, Done&& done) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kCols = kWarps * 16;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int strips = a.N_pad / 16, strip_raw = blockIdx.x * kWarps + warp;
  const int col0 = min(strip_raw, strips - 1) * 16 + g;
  const int block_col = blockIdx.x * kCols, rows = a.rows;
  auto for_each_output = [&](auto&& f) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 2 * t + (e & 1), col = e < 2 ? col0 : col0 + 8;
      if (strip_raw < strips && row < rows) f(row, col, acc[e]);
    }
  };
  if (a.split_k == 1) {
    __syncthreads();  // every thread is done with its ring
    for_each_output([&](int row, int col, float v) {
      if (col < a.N) finish(row, col - block_col, v, false);
    });
    __syncthreads();
    done();
    return;
  }
  const int elements = rows * kCols;  // [row][column of the block]
  float* red = reinterpret_cast<float*>(smem) + kEpilogueFloats;
  early();
  // A copy of the plain kernel's split-K sum (see there), with the
  // epilogue's 4 KB beside the partials. The plain kernel calling one shared
  // function instead changed its k-loop (149 SASS instructions, not 139).
  const int64_t stride = static_cast<int64_t>(gemv_partial_row_floats(a.N_pad));
  store_partials(a.partial + a.split * kGemvRowsPerPass * stride, stride, rows, acc);
  __syncthreads();
  int* counter = a.counters + blockIdx.x;
  if (!last_to_arrive(counter, a.split_k)) return;
  const int chunk = partial_chunk(a.smem_bytes / 4 - kEpilogueFloats, a.split_k);
  for (int e0 = 0; e0 < elements; e0 += chunk) {
    const int n = min(chunk, elements - e0);
    fetch_partials(red, a.partial, stride, a.split_k, block_col, e0, n);
    for (int i = tid; i < n; i += kThreads) {
      float sum = 0.0f;
      for (int s = 0; s < a.split_k; ++s) sum += red[s * n + i];
      const int e = e0 + i, row = e / kCols, c = e % kCols;
      if (block_col + c < a.N) finish(row, c, sum, e == tid);
    }
    __syncthreads();
  }
  done();
  if (tid == 0) *counter = 0;
}

// W4A16Options::residual_row_sq: y is the residual stream. The stored value
// is y + round(x W), rounded, as ops::add_rms_norm stores it; its square
// goes to shared memory ([row][column of the block]) and warp w sums row w's
// in a fixed order for the next GEMM's norm, in kGemvRowSqCopies copies.
// This is the tail of the kernel, which the next one waits for: the residual
// of each thread's first element is loaded before the split-K count.
template <typename T>
__device__ __forceinline__ void write_residual_outputs_body(const OutputArgs a, float* residual_row_sq, float acc0,
                                                           float acc1, float acc2, float acc3) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kCols = kWarps * 16;
  const float acc[4] = {acc0, acc1, acc2, acc3};
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, block_col = blockIdx.x * kCols;
  T* y = static_cast<T*>(a.y);
  float* squares = reinterpret_cast<float*>(smem);
  T residual_first{};
  fused_epilogue(
      a, acc,
      [&] {
        if (tid < a.rows * kCols && block_col + tid % kCols < a.N)
          residual_first = y[static_cast<int64_t>(a.m0 + tid / kCols) * a.ldy + block_col + tid % kCols];
      },
      [&](int row, int c, float v, bool first) {
        T* dst = y + static_cast<int64_t>(a.m0 + row) * a.ldy + block_col + c;
        const T out = from_float<T>(scalar_to_float(first ? residual_first : *dst) + scalar_to_float(from_float<T>(v)));
        const float h = scalar_to_float(out);
        squares[row * kCols + c] = h * h;
        *dst = out;
      },
      [&] {
        if (warp >= a.rows) return;
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < kCols / 32; ++u) {
          const int c = 32 * u + lane;
          if (block_col + c < a.N) sum += squares[warp * kCols + c];
        }
#pragma unroll
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
        if (lane < kGemvRowSqCopies) {  // every lane holds the sum: each writes one copy
          const int stride = gemv_row_sq_copy_stride(gridDim.x);
          residual_row_sq[(static_cast<int64_t>(a.m0 + warp) * kGemvRowSqCopies + lane) * stride + blockIdx.x] = sum;
        }
      });
}
// The out-of-line copy, which the instances for passes of any row count
// call (see the fused epilogues above). The one-row instances inline the
// body instead: calling this copy (and write_attention_inputs'), they gave
// wrong outputs on the H200 in 9 GPU tests at M = 1 while the same instances
// with their epilogues inlined, and every other instance, passed (v39; the
// cause was not found in the SASS).
template <typename T>
__device__ __noinline__ void write_residual_outputs(const OutputArgs a, float* residual_row_sq, float acc0,
                                                    float acc1, float acc2, float acc3) {
  write_residual_outputs_body<T>(a, residual_row_sq, acc0, acc1, acc2, acc3);
}

// What finish_head reads besides the head itself, per lane: the norm
// weights of elements lane, lane + 32, ..., the RoPE frequencies of pairs
// lane, lane + 32, the position, and the query rotation's signs. The
// epilogue is one warp per head on the step's critical path, after the
// split-K count: loaded there, these were dependent global round trips
// (~3 us of the ~4 us a Qwen3-14B layer's epilogue took, measured with
// per-CTA timer stamps). So every CTA loads them into registers before its
// split-K count (`early`), where their latency hides behind the partial
// stores and the count, and finish_head only computes.
struct HeadConstants {
  float norm_w[4], inv_freq[2], signs[4], pos;
};
template <typename T, int D>
__device__ __forceinline__ void load_head_constants(const AttentionInputsArgs& ai, int64_t token, int head,
                                                    HeadConstants& c) {
  const int lane = threadIdx.x % 32, hd = ai.head_dim;
  const bool is_q = head < ai.heads, is_v = head >= ai.heads + ai.kv_heads;
  if (is_v) return;
  const T* w = static_cast<const T*>(is_q ? ai.q_norm : ai.k_norm);
  if (w != nullptr) {
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (lane + 32 * u < hd) c.norm_w[u] = scalar_to_float(w[lane + 32 * u]);
  }
#pragma unroll
  for (int u = 0; u < 2; ++u)
    if (lane + 32 * u < hd / 2) c.inv_freq[u] = ai.inv_freq[lane + 32 * u];
  c.pos = static_cast<float>(ai.positions[token]);
  if (is_q && ai.q_signs != nullptr) kv::load_lane_signs<D>(ai.q_signs, c.signs);
}

// One head of the epilogue, past the GEMM's sum: the per-head norm and
// RoPE of ops::qkv_to_attention_inputs (q and k heads), then the store of
// q/k/v in fp32, or of the query rotated and scaled
// (W4A16AttentionInputs::q_rotation_signs) with the decode attention's own
// arithmetic (kv/hadamard_warp.cuh), so the bits are the attention's.
// D: the head dimension the rotation is built for (64 or 128, which
// W4A16Options validation requires for it); the norm, RoPE and stores take
// any even head_dim that divides 128.
template <typename T, int D>
__device__ __noinline__ void finish_head(const AttentionInputsArgs& ai, const HeadConstants& hc, float* v,
                                        int64_t token, int head) {
  const int hd = ai.head_dim, half = hd / 2;
  const int lane = threadIdx.x % 32;
  const bool is_q = head < ai.heads, is_v = head >= ai.heads + ai.kv_heads;
  const bool rotate = is_q && ai.q_signs != nullptr;
  auto round_to_t = [](float x) { return scalar_to_float(from_float<T>(x)); };
  if (!is_v) {
    if ((is_q ? ai.q_norm : ai.k_norm) != nullptr) {
      float sum_sq = 0.0f;
      for (int i = lane; i < hd; i += 32) sum_sq = ops::sum_sq_step(sum_sq, v[i]);
      for (int o = 16; o > 0; o >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
      const float inv_rms = ops::head_inv_rms(sum_sq, hd, ai.eps);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (lane + 32 * u < hd) v[lane + 32 * u] = round_to_t(ops::norm_scale(v[lane + 32 * u], inv_rms, hc.norm_w[u]));
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int i = lane + 32 * u;
      if (i >= half) break;
      float c, s;
      ops::rope_cos_sin(hc.pos, hc.inv_freq[u], &c, &s);
      const int p0 = ai.interleaved ? 2 * i : i, p1 = ai.interleaved ? 2 * i + 1 : i + half;
      float y0, y1;
      ops::rope_rotate(v[p0], v[p1], c, s, &y0, &y1);
      v[p0] = round_to_t(y0);
      v[p1] = round_to_t(y1);
    }
    __syncwarp();
  }
  if (rotate) {
    float x[D / 32];
#pragma unroll
    for (int u = 0; u < D / 32; ++u) x[u] = v[lane + 32 * u];
    kv::hadamard_rotate_warp<D>(x, hc.signs, ai.q_scale);
    float* out = ai.q_out + (token * ai.heads + head) * hd;
#pragma unroll
    for (int u = 0; u < D / 32; ++u) out[lane + 32 * u] = x[u];
    return;
  }
  float* out = is_q ? ai.q_out + (token * ai.heads + head) * hd
                    : (is_v ? ai.v_out + (token * ai.kv_heads + head - ai.heads - ai.kv_heads) * hd
                            : ai.k_out + (token * ai.kv_heads + head - ai.heads) * hd);
  for (int i = lane; i < hd; i += 32) out[i] = v[i];
}

// W4A16Options::attention_inputs: the block's 128 columns are whole heads
// (head_dim divides 128). The final values, rounded to T as the plain
// kernel stores them, go to shared memory; then one warp per (row, head)
// applies ops::qkv_to_attention_inputs's arithmetic (ops/head_math.cuh),
// element for element: the per-head norm (lane i summing elements i, i + 32,
// ... and the same butterfly), rounded to T; RoPE, rounded to T; widened to
// fp32 into q/k/v.
template <typename T>
__device__ __forceinline__ void write_attention_inputs_body(const OutputArgs a, const AttentionInputsArgs* attention,
                                                           float acc0, float acc1, float acc2, float acc3) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kCols = kWarps * 16;
  const float acc[4] = {acc0, acc1, acc2, acc3};
  const int warp = threadIdx.x / 32, block_col = blockIdx.x * kCols;
  float* values = reinterpret_cast<float*>(smem);  // [row][column of the block]
  const AttentionInputsArgs& ai = *attention;
  const int hd = ai.head_dim;
  const int block_heads = min(kCols, a.N - block_col) / hd;
  HeadConstants first;  // of the warp's first task, then of its current one
  auto load_task = [&](int task, HeadConstants& c) {
    const int row = task / block_heads, head = (block_col + (task % block_heads) * hd) / hd;
    if (hd == 64) load_head_constants<T, 64>(ai, a.m0 + row, head, c);
    else load_head_constants<T, 128>(ai, a.m0 + row, head, c);
  };
  auto load_first = [&] { load_task(warp, first); };
  fused_epilogue(
      a, acc,
      // Every CTA, before the split-K count: the constants of its warps'
      // first heads (HeadConstants).
      [&] {
        if (warp >= a.rows * block_heads) return;
        load_first();
      },
      [&](int row, int c, float v, bool) { values[row * kCols + c] = scalar_to_float(from_float<T>(v)); },
      [&] {
#pragma unroll 1
        for (int task = warp; task < a.rows * block_heads; task += kWarps) {
          const int row = task / block_heads, j = task % block_heads;
          const int head = (block_col + j * hd) / hd;
          float* v = values + row * kCols + j * hd;
          if (task != warp || a.split_k == 1) load_task(task, first);  // early() ran only at a K split
          if (hd == 64) finish_head<T, 64>(ai, first, v, a.m0 + row, head);
          else finish_head<T, 128>(ai, first, v, a.m0 + row, head);
        }
      });
}
// The out-of-line copy (see write_residual_outputs).
template <typename T>
__device__ __noinline__ void write_attention_inputs(const OutputArgs a, const AttentionInputsArgs* attention,
                                                    float acc0, float acc1, float acc2, float acc3) {
  write_attention_inputs_body<T>(a, attention, acc0, acc1, acc2, acc3);
}

// What a kernel instance reads and writes besides x W: plain; x through
// RMSNorm (W4A16Options::x_norm_weight); y added to a residual
// (W4A16Options::residual_row_sq); the attention inputs instead of y
// (W4A16Options::attention_inputs), with or without the norm. Separate
// instances because the code for any of them, present at all, changed the
// register allocation of the k-loop of the others (with the norm and the
// residual in one instance the plain kernel measured 7-10% slower on every
// Qwen3-14B shape, and with both in one fused instance its k-loop had three
// constant loads more).
enum class GemvIo { plain, x_norm, residual, attention, x_norm_attention };

template <typename T, bool kFloatZero, bool kTwoGroups, GemvIo kIo, bool kOneRow>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm<kTwoGroups>())
    w4a16_gemv_kernel(const __grid_constant__ GemvArgs args, const int m0, const int range_max) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kScaleWords = kTwoGroups ? 4 : 2;
  const GemvSmem layout{kScaleWords, kOneRow ? 1 : min(kGemvRowsPerPass, args.M - m0), range_max};
  const int rows = layout.rows;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int strips = args.N_pad / 16;
  const int strip_raw = blockIdx.x * kWarps + warp;
  const int strip = min(strip_raw, strips - 1);  // warps past N compute on the last strip and store nothing
  const int split = blockIdx.y;
  const int i0 = static_cast<int>(static_cast<int64_t>(split) * args.iters / args.split_k);
  const int i1 = static_cast<int>(static_cast<int64_t>(split + 1) * args.iters / args.split_k);
  const int col0 = strip * 16 + g, col1 = col0 + 8;  // this lane's two output columns

  uint4* ring_codes = reinterpret_cast<uint4*>(smem);
  uint32_t* ring_scales = reinterpret_cast<uint32_t*>(smem + layout.ring_codes_bytes());
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem + layout.x_offset());
  float4* sums = reinterpret_cast<float4*>(smem + layout.sums_offset());
  float4* window_sums = reinterpret_cast<float4*>(smem + layout.window_sums_offset());
  float* x_inv_rms = reinterpret_cast<float*>(smem + layout.x_inv_rms_offset());
  const int fold_shift = gemv_fold_shift(kTwoGroups, args.group_shift);
  const int fold_mask = args.gemv_fold_mask;  // (1 << fold_shift) - 1
  // Whether k-iteration `it` ends a fold window (so its ring slot carries scales).
  auto ends_window = [&](int it) { return ((it + 1) & fold_mask) == 0 || it + 1 == i1; };

  // The k-iterations go into the ring in order, one per call: 16 bytes of
  // codes and, for the last of a fold window, the scale/zero words of the
  // lane's two columns (group 32: of rows k0 and k0 + 32). Addresses advance
  // by addition: the 64-bit products and generic-to-shared conversions of a
  // per-call computation were a third of the loop's instructions.
  const int64_t iter_stride = static_cast<int64_t>(strips) * 32;
  const uint4* next_codes = args.qweight + static_cast<int64_t>(strip) * 32 + lane + i0 * iter_stride;
  // The scale/zero words that the next window's last issue fetches. Windows
  // map one to one onto groups (64-256 rows: a window is its group's
  // k-iterations, as fold_shift = log2(group / 64); 32 rows: one iteration,
  // two groups; per channel: the one group), so the pointer steps by a fixed
  // amount per window instead of being rebuilt from the iteration with a
  // shift and a 64-bit multiply at each issue (~14 of the loop's ~100
  // instructions per two iterations at group 128). The kernel issues at a
  // near-fixed rate (0.65 per scheduler and cycle in Nsight Compute), so its
  // time follows its instruction count: the decode step 258 -> 273 tok/s on
  // an H200 (docs/w4a16-gemm.md, v38).
  const int64_t scale_step = args.group_shift < 0 ? 0 : static_cast<int64_t>(kTwoGroups ? 2 : 1) * args.N_pad;
  const uint32_t* next_scales =
      args.scale_zero + col0 +
      (args.group_shift < 0 ? 0 : static_cast<int64_t>((i0 * 64) >> args.group_shift) * args.N_pad);
  const uint32_t ring_codes_addr = smem_address(ring_codes + tid);
  const uint32_t ring_scales_addr = smem_address(ring_scales + tid * kScaleWords);
  constexpr uint32_t kCodesSlotBytes = kThreads * 16, kScalesSlotBytes = kThreads * 4 * kScaleWords;
  // A slot's scale words sit at a fixed linear map of its codes' address
  // (kScaleWords / 4 bytes of scales per byte of codes), so one running
  // address per ring names both.
  static_assert(kScalesSlotBytes * 4 == kCodesSlotBytes * kScaleWords);
  // From the rings' bases, which are the same for every thread (a uniform
  // register); from the thread's own addresses, the compiler rebuilt it at
  // every use (5 instructions).
  const uint32_t codes_base = smem_address(ring_codes);
  const uint32_t scales_of_codes = smem_address(ring_scales) - (kScaleWords == 4 ? codes_base : codes_base / 2);
  auto scales_addr = [&](uint32_t codes_addr) {
    return kScaleWords == 4 ? codes_addr + scales_of_codes : (codes_addr >> 1) + scales_of_codes;
  };
  int next_it = i0;
  auto copy_codes = [&](uint32_t codes_dst) {
    cp_async16_bypass(codes_dst, next_codes);
    next_codes += iter_stride;
  };
  auto copy_scales = [&](uint32_t codes_dst) {
    const uint32_t* sz = next_scales;
    next_scales += scale_step;
    const uint32_t dst = scales_addr(codes_dst);
    cp_async4(dst, sz);
    cp_async4(dst + 4, sz + 8);
    if constexpr (kTwoGroups) {
      cp_async4(dst + 8, sz + args.N_pad);
      cp_async4(dst + 12, sz + args.N_pad + 8);
    }
  };
  auto issue = [&](uint32_t codes_dst) {
    copy_codes(codes_dst);
    if (ends_window(next_it)) copy_scales(codes_dst);
    ++next_it;
  };
#pragma unroll
  for (int u = 0; u < kDepth - 1; ++u) {
    if (i0 + u < i1) issue(ring_codes_addr + u * kCodesSlotBytes);
    cp_async_commit();
  }

  // With early_dependents (W4A16Options::gemv_early_dependents_bytes: large
  // weights) the next kernel may launch now: its CTAs take the SM slots this
  // grid leaves, request their own first weights (or K/V tiles) and wait for
  // this grid to complete, so their launch and first requests overlap this
  // kernel's stream instead of its tail (a Qwen3-14B decode step: +2-4%,
  // docs/engine.md v28). The launch happens only once every CTA of this grid
  // has got here, so a grid of several rounds of CTAs has launched them all.
  // Dependents read this kernel's outputs only after their own wait, which
  // returns when this grid is done. Small GEMMs let them launch after the K
  // loop (below): early, a step of ~1 MB GEMMs lost 10%.
  if (args.early_dependents) cuda::pdl_launch_dependents();
  // Everything above read only weights, which no kernel writes.
  cuda::pdl_wait();

  // Stage x[m0 .. m0+rows, 64*i0 .. 64*i1) in fragment order: for lane t and
  // k-step j of an iteration, the pairs (k, k+1) and (k+8, k+9) with
  // k = 16j + 2t; the second pair scaled by 1/16 for fp16 (it meets the codes
  // stored as 1024 + 16q). A chunk is 8 consecutive k (half a k-step), so the
  // 8 chunks of one (row, iteration) are 8 neighbouring lanes, which then
  // sum them for the fold.
  {
    // x through RMSNorm (W4A16Options::x_norm_weight, GemvIo::x_norm; K is
    // a multiple of 8 then): warp w totals row w's sums of squares, one per
    // column block of the GEMM that wrote x. Their loads are issued here and
    // waited for only once the first round of x loads is in flight too: one
    // L2 round trip after the wait for the previous kernel instead of two.
    constexpr bool x_norm = kIo == GemvIo::x_norm || kIo == GemvIo::x_norm_attention;
    float row_sq = 0.0f;
    if (x_norm && warp < rows) {
      const int stride = gemv_row_sq_copy_stride(args.x_norm_blocks);
      const float* sums_of_row = args.x_norm_row_sq +
                                 (static_cast<int64_t>(m0 + warp) * kGemvRowSqCopies +
                                  blockIdx.x % kGemvRowSqCopies) * stride;
      for (int b0 = 0; b0 < args.x_norm_blocks; b0 += 4 * 32) {
        float part[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int b = b0 + 32 * u + lane;
          part[u] = b < args.x_norm_blocks ? __ldcg(sums_of_row + b) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) row_sq += part[u];
      }
    }
    const int R = i1 - i0, chunks = rows * R * 8;
    for (int base = 0; base < chunks; base += kThreads) {
      const int c = base + tid;
      const bool valid = c < chunks;
      // One row: the chunk's iteration is a shift (the run-time divisions
      // by the range are ~60 instructions per thread).
      const int row = kOneRow ? 0 : c / (R * 8), il = kOneRow ? c >> 3 : (c / 8) % R;
      const int q = c % 8, j = q / 2, h = q % 2;
      float raw_sum = 0.0f, staged_sum = 0.0f;
      uint4 norm_x = make_uint4(0, 0, 0, 0), norm_w = make_uint4(0, 0, 0, 0);  // past K: the bits of 0.0
      if (x_norm) {
        const int k = (i0 + il) * 64 + 16 * j + 8 * h;
        if (valid && k < args.K) {
          norm_x = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(args.x) +
                                                        static_cast<int64_t>(m0 + row) * args.ldx + k));
          norm_w = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(args.x_norm_weight) + k));
        }
        if (base == 0) {
#pragma unroll
          for (int o = 16; o > 0; o /= 2) row_sq += __shfl_xor_sync(0xFFFFFFFFu, row_sq, o);
          if (warp < rows && lane == 0)  // ops::rms_norm's expression
            x_inv_rms[warp] = rsqrtf(row_sq / static_cast<float>(args.K) + args.x_norm_eps);
          __syncthreads();
        }
      }
      if (valid) {
        const int k = (i0 + il) * 64 + 16 * j + 8 * h;
        const T* src = static_cast<const T*>(args.x) + static_cast<int64_t>(m0 + row) * args.ldx + k;
        uint4 v;
        if (x_norm) {
          v = k < args.K ? rms_normalized<T>(norm_x, norm_w, x_inv_rms[row]) : norm_x;
        } else if (args.x_up_offset != 0) {
          // x through the decode step's SiLU (W4A16Options::x_silu_mul). K
          // is a multiple of 8, so a chunk is all inside the row or all past
          // it (zeros: the bits of 0.0 in fp16 and bf16).
          v = make_uint4(0, 0, 0, 0);
          if (k < args.K) {
            const uint4 gv = __ldg(reinterpret_cast<const uint4*>(src));
            const uint4 uv = __ldg(reinterpret_cast<const uint4*>(src + args.x_up_offset));
            const T* g8 = reinterpret_cast<const T*>(&gv);
            const T* u8 = reinterpret_cast<const T*>(&uv);
            T* e = reinterpret_cast<T*>(&v);
#pragma unroll
            for (int i = 0; i < 8; ++i)
              e[i] = from_float<T>(ops::silu_times(scalar_to_float(g8[i]), scalar_to_float(u8[i])));
          }
        } else if (k + 8 <= args.K) {
          v = __ldg(reinterpret_cast<const uint4*>(src));
        } else {
          T e[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) e[i] = k + i < args.K ? src[i] : from_float<T>(0.0f);
          v = *reinterpret_cast<const uint4*>(e);
        }
        const uint32_t pairs[4] = {v.x, v.y, v.z, v.w};
        uint32_t* dst = xs + (row * range_max + il) * 32 + 2 * j + h;
#pragma unroll
        for (int p = 0; p < 4; ++p) {  // pair p holds k offsets 2p, 2p+1: lane t = p
          const uint32_t staged = h ? scale_pair_by_16th<T>(pairs[p]) : pairs[p];
          dst[p * 8] = staged;
          const float2 a = pair_to_float2<T>(pairs[p]), b = pair_to_float2<T>(staged);
          raw_sum += a.x + a.y;
          staged_sum += b.x + b.y;
        }
      }
      // Lanes q = 0..3 hold rows k0..k0+31 of the iteration, q = 4..7 the rest.
#pragma unroll
      for (int o = 1; o < 4; o *= 2) {
        raw_sum += __shfl_xor_sync(0xFFFFFFFFu, raw_sum, o);
        staged_sum += __shfl_xor_sync(0xFFFFFFFFu, staged_sum, o);
      }
      if (valid && q % 4 == 0) {
        float2* s = reinterpret_cast<float2*>(sums + row * range_max + il) + q / 4;
        *s = make_float2(staged_sum, raw_sum);
      }
    }
    __syncthreads();
    // The sums of each fold window, added in iteration order (the same bits
    // on every run).
    const int w0 = i0 >> fold_shift, windows = ((i1 - 1) >> fold_shift) - w0 + 1;
    for (int e = tid; e < rows * windows; e += kThreads) {
      const int row = kOneRow ? 0 : e / windows, w = kOneRow ? e : e % windows;
      const int first = max(i0, (w0 + w) << fold_shift), last = min(i1, (w0 + w + 1) << fold_shift);
      float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int it = first; it < last; ++it) add_to(total, sums[row * range_max + it - i0]);
      // One scale group per iteration: the fold takes the two halves' sums
      // together, so they are added here once (the same bits as in the fold).
      window_sums[row * range_max + w] =
          kTwoGroups ? total : make_float4(total.x + total.z, total.y + total.w, 0.0f, 0.0f);
    }
  }
  __syncthreads();

  // acc[e]: column col0 (e < 2) or col1, row 2t + (e & 1) of the pass.
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int x_row = min(g, rows - 1);  // n = g of the mma; columns past the pass are never stored
  const int row_a = min(2 * t, rows - 1), row_b = min(2 * t + 1, rows - 1);
  const bool single_row = kOneRow || rows == 1;
  constexpr float kBias = kCodeBias<T>;
  float d[2][4] = {};  // [rows k0.. / k0+32..][D fragment] of the window; one accumulator unless group 32
  // The ring's slots by running shared addresses: the one read this
  // iteration, and the one read last iteration, which this one refills.
  uint32_t read_codes = ring_codes_addr;
  uint32_t issue_codes = ring_codes_addr + (kDepth - 1) * kCodesSlotBytes;
  const uint32_t ring_codes_end = ring_codes_addr + kDepth * kCodesSlotBytes;
  const uint32_t* x_next = xs + x_row * range_max * 32 + t * 8;
  // The fold windows are consecutive, so their sums advance by one per
  // window too (the index from the iteration cost 5-7 SASS instructions per
  // window, v38).
  const float4* sums_a = window_sums + row_a * range_max;
  const int sums_b_offset = (row_b - row_a) * range_max;
  // One k-iteration: `refill` (the slot read last iteration gets a later
  // iteration's copies, which it issues), the wait for this iteration's slot,
  // its four mma, and the fold when `fold`.
  auto iteration = [&](auto&& refill, bool fold) {
    refill(issue_codes);
    cp_async_commit();
    cp_async_wait<kDepth - 1>();
    const uint4 c = ld_shared_u4(read_codes);
    const uint32_t sc_addr = scales_addr(read_codes);
    issue_codes = read_codes;  // the next iteration refills it
    read_codes += kCodesSlotBytes;
    if (read_codes == ring_codes_end) read_codes = ring_codes_addr;

    const uint4* xv = reinterpret_cast<const uint4*>(x_next);
    x_next += 32;  // the next iteration's x (a running pointer: no per-iteration address rebuild)
    const uint4 xa = xv[0], xb = xv[1];
    const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t p[4];
      raw_word_pairs<T>(words[j], p);
      // A rows g / g+8 are columns col0 / col1; registers: k 2t.., k 2t+8..
      const uint32_t a[4] = {p[0], p[2], p[1], p[3]};
      const uint32_t b[2] = {xw[2 * j], xw[2 * j + 1]};
      mma_16816<T>(d[kTwoGroups && j >= 2 ? 1 : 0], a, b);
    }
    if (!fold) return;  // uniform: the window's codes keep accumulating
    // acc[e] += s * (dot - bias * S') + offset * X for the lane's columns and
    // rows; at M = 1 only D column 0 (acc[0], acc[2]) is real, and the fold
    // skips the other row (a uniform branch: fewer instructions per byte).
    // The other row's sums are read inside the fold's multi-row branch: read
    // before it, their copies and sums were 6-8 instructions per window at
    // one row too.
    const float4 sa = *sums_a;
    const float4* sums_b = sums_a + sums_b_offset;
    ++sums_a;
    auto fold_window = [&](float (&dd)[4], uint32_t w0_word, uint32_t w1_word, float2 a, auto b_of_sums) {
      float s0, o0, s1, o1;
      column_scale_offset<T, kFloatZero>(w0_word, s0, o0);
      column_scale_offset<T, kFloatZero>(w1_word, s1, o1);
      acc[0] += s0 * (dd[0] - kBias * a.x) + o0 * a.y;
      acc[2] += s1 * (dd[2] - kBias * a.x) + o1 * a.y;
      if (!single_row) {
        const float2 b = b_of_sums(*sums_b);
        acc[1] += s0 * (dd[1] - kBias * b.x) + o0 * b.y;
        acc[3] += s1 * (dd[3] - kBias * b.x) + o1 * b.y;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) dd[e] = 0.0f;
    };
    uint32_t sc[kScaleWords];
    ld_shared_words<kScaleWords>(sc_addr, sc);
    if constexpr (kTwoGroups) {
      fold_window(d[0], sc[0], sc[1], make_float2(sa.x, sa.y), [](float4 b) { return make_float2(b.x, b.y); });
      fold_window(d[1], sc[2], sc[3], make_float2(sa.z, sa.w), [](float4 b) { return make_float2(b.z, b.w); });
    } else {
      fold_window(d[0], sc[0], sc[1], make_float2(sa.x, sa.y), [](float4 b) { return make_float2(b.x, b.y); });
    }
  };
  // Any window length: each iteration tests whether it has a refill to
  // issue, whether that copy carries scales and whether it ends a window.
  auto refill_if_left = [&](uint32_t slot) {
    if (next_it < i1) issue(slot);
  };
  int it = i0;
  // Windows of two k-iterations (group 128, the decode step's weights): the
  // loop goes window by window while both refills of a window stay inside
  // the range and short of its last iteration. Which refill carries scales
  // and which iteration folds then follows from the parity alone, so those
  // tests, the refill guard and the refill count leave the loop (at one row
  // it has no branch but its back edge): f16 at one row 107 SASS
  // instructions per two k-iterations where the loop below executes ~138
  // (with more rows 120 against ~180; tools/sass/kernel_loops.py). Measured
  // on an H200: one-row GEMMs 1-5% faster, the Qwen3-14B decode step at
  // batch 1 +3.5% (docs/w4a16-gemm.md, v43). Same copies, mma and folds in
  // the same order as the loop below: the same bits.
  if (!kTwoGroups && fold_mask == 1) {
    if ((it & 1) != 0 && it < i1) {  // a range that starts mid-window: its first iteration ends that window
      iteration(refill_if_left, true);
      ++it;
    }
    // Iteration `it` (even) refills for it + kDepth - 1, iteration it + 1 for
    // it + kDepth: the odd one of the two ends a window and copies scales.
    constexpr bool kFirstCopiesScales = (kDepth % 2) == 0;
    for (; it + kDepth + 1 < i1; it += 2) {
      iteration(
          [&](uint32_t slot) {
            copy_codes(slot);
            if (kFirstCopiesScales) copy_scales(slot);
          },
          false);
      iteration(
          [&](uint32_t slot) {
            copy_codes(slot);
            if (!kFirstCopiesScales) copy_scales(slot);
          },
          true);
      next_it += 2;
    }
  }
  for (; it < i1; ++it) iteration(refill_if_left, ends_window(it));
  cp_async_wait<0>();
  if (!args.early_dependents) cuda::pdl_launch_dependents();

  // The fused epilogues: out of line, except in the one-row instances (see
  // write_residual_outputs).
  const OutputArgs outputs{args.y, args.ldy, args.partial, args.counters, args.N, args.N_pad, args.split_k,
                           split, m0, rows, layout.bytes()};
  if (kIo == GemvIo::residual && args.residual_row_sq != nullptr) {
    if constexpr (kOneRow)
      write_residual_outputs_body<T>(outputs, args.residual_row_sq, acc[0], acc[1], acc[2], acc[3]);
    else
      write_residual_outputs<T>(outputs, args.residual_row_sq, acc[0], acc[1], acc[2], acc[3]);
    return;
  }
  if ((kIo == GemvIo::attention || kIo == GemvIo::x_norm_attention) && args.attention_inputs) {
    if constexpr (kOneRow)
      write_attention_inputs_body<T>(outputs, &args.attention, acc[0], acc[1], acc[2], acc[3]);
    else
      write_attention_inputs<T>(outputs, &args.attention, acc[0], acc[1], acc[2], acc[3]);
    return;
  }
  T* y = static_cast<T*>(args.y);
  const bool stores = strip_raw < strips;
  auto for_each_output = [&](auto&& f) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 2 * t + (e & 1), col = e < 2 ? col0 : col1;
      if (stores && row < rows) f(row, col, acc[e]);
    }
  };
  if (args.split_k == 1) {
    for_each_output([&](int row, int col, float v) {
      if (col < args.N) y[static_cast<int64_t>(m0 + row) * args.ldy + col] = from_float<T>(v);
    });
    return;
  }

  constexpr int kCols = kWarps * 16;
  const int block_col = blockIdx.x * kCols;
  const int elements = rows * kCols;  // [row][column of the block]
  float* red = reinterpret_cast<float*>(smem);
  // Through global memory: partials [split][row][column] (whole column
  // blocks, w4a16_gemv_workspace.h), a counter per block;
  // the last CTA to arrive copies the block's partials into shared memory,
  // all at once as far as they fit (fetch_partials), and sums in order.
  const int64_t stride = static_cast<int64_t>(gemv_partial_row_floats(args.N_pad));
  store_partials(args.partial + split * kGemvRowsPerPass * stride, stride, rows, acc);
  __syncthreads();  // every thread's partials are stored before thread 0's release
  int* counter = args.counters + blockIdx.x;
  if (!last_to_arrive(counter, args.split_k)) return;
  const int chunk = partial_chunk(layout.bytes() / 4, args.split_k);
  for (int e0 = 0; e0 < elements; e0 += chunk) {
    const int n = min(chunk, elements - e0);
    fetch_partials(red, args.partial, stride, args.split_k, block_col, e0, n);
    for (int i = tid; i < n; i += kThreads) {
      float sum = 0.0f;
      for (int s = 0; s < args.split_k; ++s) sum += red[s * n + i];
      const int e = e0 + i, row = e / kCols, col = block_col + e % kCols;
      if (col < args.N) y[static_cast<int64_t>(m0 + row) * args.ldy + col] = from_float<T>(sum);
    }
    __syncthreads();
  }
  if (tid == 0) *counter = 0;  // ready for the next call
}

int smem_for(int M, int iters, int split, bool two_groups) {
  return GemvSmem{two_groups ? 4 : 2, std::min(M, kGemvRowsPerPass), (iters + split - 1) / split}.bytes();
}

struct DeviceLimits {
  int sms = 0, smem_per_cta = 0, smem_per_sm = 0, cc_major = 0;
};
// Per device, queried once: the SM count (the split rule), the dynamic
// shared memory a CTA may take (the least split), and what the resident
// CTAs per SM follow from (gemv_choose_split).
const DeviceLimits& device_limits(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceLimits> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  DeviceLimits l;
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_per_cta, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&l.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  return cache.emplace(device, l).first->second;
}

template <typename T, bool kFloatZero, bool kTwoGroups, GemvIo kIo>
void launch_typed(const GemvArgs& args, int device, cudaStream_t stream) {
  // One-row calls (the decode step at batch 1) take an instance built for
  // one row (kernel comment). Group 32 (two scale groups per k-iteration, not
  // the decode step's formats) has none: 20 instances fewer to compile.
  constexpr bool kOneRowInstance = !kTwoGroups;
  auto kernel = kOneRowInstance && args.M == 1
                    ? w4a16_gemv_kernel<T, kFloatZero, kTwoGroups, kIo, kOneRowInstance>
                    : w4a16_gemv_kernel<T, kFloatZero, kTwoGroups, kIo, false>;
  GemvArgs kernel_args = args;
  kernel_args.gemv_fold_mask = (1 << gemv_fold_shift(kTwoGroups, args.group_shift)) - 1;
  const DeviceLimits& limits = device_limits(device);
  cuda::ensure_dynamic_smem(kernel, limits.smem_per_cta);
  const int range_max = (args.iters + args.split_k - 1) / args.split_k;
  // Passes of 8 rows run one after the other on the stream; each finishes
  // before the next reuses the partials and counters.
  for (int m0 = 0; m0 < args.M; m0 += kGemvRowsPerPass) {
    cuda::launch_with_pdl_in_clusters(
        kernel, 0, cuda::L2StreamSpan{args.qweight, args.weight_stream_bytes},
        dim3(static_cast<unsigned>(gemv_col_blocks(args.N_pad)), static_cast<unsigned>(args.split_k)), dim3(kThreads),
        static_cast<size_t>(smem_for(args.M - m0, args.iters, args.split_k, kTwoGroups)), stream, kernel_args, m0,
        range_max);
  }
}

}  // namespace

static_assert(kWarps * 16 == kGemvBlockColumns, "w4a16_gemv_workspace.h counts the CTA's columns");

int gemv_min_split(int64_t M, int iters, int device) {
  const DeviceLimits& l = device_limits(device);
  for (int s = 1; s < iters; ++s)
    if (smem_for(static_cast<int>(std::min<int64_t>(M, kGemvRowsPerPass)), iters, s, true) <= l.smem_per_cta)
      return s;
  return std::max(1, iters);
}

int gemv_choose_split(int64_t M, int N_pad, int iters, bool two_groups, int device) {
  // gemv_split_rule (w4a16_tune_rule.h): ~16 k-iterations per CTA. It
  // replaced a model of rounds of resident CTAs (each a range plus a fixed
  // cost) that picked split 16 for 4096 x 4096 and 2 for Qwen3-14B's gate/up
  // where 4-8 were best (docs/w4a16-gemm.md, v26). The resident CTAs per SM
  // (for its last-round check): the register budget the kernel is built for
  // (min_ctas_per_sm) and the shared memory of a CTA at ~16 k-iterations
  // (plus the 1 KB the hardware reserves per CTA).
  const DeviceLimits& l = device_limits(device);
  const int by_registers = ctas_per_sm_budget(two_groups, l.cc_major >= 9);
  const int rows = static_cast<int>(std::min<int64_t>(M, kGemvRowsPerPass));
  const int by_smem = l.smem_per_sm / (smem_for(rows, iters, std::clamp((iters + 8) / 16, 1, 16), two_groups) + 1024);
  return gemv_split_rule(iters, gemv_col_blocks(N_pad), l.sms, std::max(1, std::min(by_registers, by_smem)), M);
}

void launch_gemv(const GemvArgs& args, bool bf16, bool float_zero, int device, cudaStream_t stream) {
  LOWBIT_REQUIRE(args.split_k >= 1 && args.split_k <= std::max(1, args.iters), "gemv: K split ", args.split_k,
                 " for ", args.iters, " k-iterations");
  const bool two_groups = args.group_shift == 5;  // group 32: two scale groups per 64-row iteration
  // 32-256 rows or per channel: the kernel's scale pointer steps once per fold window, one group each.
  LOWBIT_REQUIRE(args.group_shift < 0 || (args.group_shift >= 5 && args.group_shift <= 8), "gemv: group size ",
                 args.group_shift < 0 ? -1 : 1 << args.group_shift, " (32, 64, 128, 256 or per channel)");
  LOWBIT_REQUIRE(args.residual_row_sq == nullptr || (args.x_norm_weight == nullptr && !args.attention_inputs),
                 "gemv: residual_row_sq with x_norm_weight or attention_inputs in one call");
  LOWBIT_REQUIRE(smem_for(args.M, args.iters, args.split_k, two_groups) <= device_limits(device).smem_per_cta,
                 "gemv: K split ", args.split_k, " leaves more of x per CTA than shared memory holds");
  // The last CTA's sum fetches at least one 16-byte piece of every split
  // (partial_chunk) beside the epilogue's floats.
  LOWBIT_REQUIRE(4 * args.split_k + kEpilogueFloats <= smem_for(args.M, args.iters, args.split_k, two_groups) / 4,
                 "gemv: K split ", args.split_k, " has more partials per column than shared memory holds");
  auto by_groups = [&](auto t_tag, auto fz_tag) {
    using T = decltype(t_tag);
    constexpr bool kFz = decltype(fz_tag)::value;
    auto by_io = [&](auto groups_tag) {
      constexpr bool kTwo = decltype(groups_tag)::value;
      const bool norm = args.x_norm_weight != nullptr;
      if (args.attention_inputs) {
        if (norm) launch_typed<T, kFz, kTwo, GemvIo::x_norm_attention>(args, device, stream);
        else launch_typed<T, kFz, kTwo, GemvIo::attention>(args, device, stream);
      } else if (norm) {
        launch_typed<T, kFz, kTwo, GemvIo::x_norm>(args, device, stream);
      } else if (args.residual_row_sq != nullptr) {
        launch_typed<T, kFz, kTwo, GemvIo::residual>(args, device, stream);
      } else {
        launch_typed<T, kFz, kTwo, GemvIo::plain>(args, device, stream);
      }
    };
    if (two_groups) by_io(std::true_type{});
    else by_io(std::false_type{});
  };
  if (bf16) {
    if (float_zero) by_groups(__nv_bfloat16{}, std::true_type{});
    else by_groups(__nv_bfloat16{}, std::false_type{});
  } else {
    if (float_zero) by_groups(half{}, std::true_type{});
    else by_groups(half{}, std::false_type{});
  }
}

}  // namespace lowbit::w4a16_detail
