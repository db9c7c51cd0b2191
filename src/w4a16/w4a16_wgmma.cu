// The sm_90a W4A16 kernel: y^T = dequant(W)^T x^T on wgmma, for the M where
// the mma.sync kernels of w4a16_gemm.cu run out of tensor-core throughput.
//
// Why this shape:
//   - wgmma takes only its A operand from registers, and the dequantized
//     weights exist only in registers (they never touch shared memory), so the
//     weights are A: the transposed problem y^T[N, M] = W^T[N, K] x^T[K, M],
//     with output columns as the wgmma M (64 per warpgroup) and the rows of x
//     as the wgmma N (16, 32, 64, 128 or 256 per CTA). One dequantized weight fragment
//     then serves up to 256 rows of x.
//   - The A fragment of m64nNk16 is, per warp, the A fragment of
//     mma.m16n8k16 over 16 rows; with weights as A its rows are output columns,
//     which is exactly what one lane's 16 bytes of the tiled layout hold (the
//     B operands of the mma.sync kernels, columns g and g+8 of the warp's 16):
//     the layout and the LOP3 dequantization are reused unchanged.
//   - x is B: rows of x are K-contiguous, i.e. wgmma's default K-major B. A
//     stage holds 64 rows of K = 128 bytes per row of x, stored with the
//     128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)) that the
//     shared-memory descriptor names, so the tensor cores read it without bank
//     conflicts. One thread fills a stage with the copy engine (for the
//     64-row two-CTA and the 256-row tiles, a thread of a producer warp of
//     its own: kHasProducer below): a TMA tile
//     load of x (the tensor map applies the swizzle and zero-fills columns past
//     K; see x_box_rows for rows past M) and 1-D bulk copies of the stage's 2-4 KB of weights
//     and scale/zero pairs, all completing on the stage's mbarrier. (The first
//     version had all 256 threads issue cp.async; the H100 profile showed ~900
//     issued instructions per warp and iteration at M = 1, which we attribute
//     mostly to that address arithmetic and the zero-filling of rows past M.)
//   - Two warpgroups (128 columns) share each x tile. Each waits for its own
//     wgmma batch before dequantizing the next iteration: the assembler
//     serializes every wgmma of a kernel in which registers of a wgmma operand
//     are written while another wgmma is in flight (ptxas C7513, seen with
//     double-buffered A registers and wait_group 1), which costs more than the
//     overlap gains. (Double-buffered A registers with one batch per
//     iteration, next iteration dequantized while this one's wgmma runs,
//     compiled without C7513 and still measured 3% slower at 64 rows and
//     10-16% slower at 128-1024 rows: docs/w4a16-gemm.md, v17.) The overlap
//     comes from the other warpgroup: stages are
//     handed over through mbarriers (full: the stage's bytes landed; empty:
//     both warpgroups' wgmma finished reading), not a CTA-wide
//     barrier per iteration, so the warpgroups drift apart by up to two
//     iterations and one dequantizes while the other's wgmma runs.
//   - Small grids (few column tiles at large K) split K over CTAs; the last
//     CTA of a tile sums the partials in a fixed order (deterministic).
//     Grids of less than one wave of 64+-row tiles may instead run
//     stream-K (WgmmaWork below): equal K ranges over the whole grid, so a
//     CTA may finish one tile and start the next in one pipeline.
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/launch_switches.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/w4a16/w4a16_wave_rule.h"
#include "w4a16_async_copy.cuh"
#include "w4a16_device.cuh"
#include "w4a16_wgmma.h"
#include "wgmma_ops.cuh"

namespace lowbit::w4a16_detail {
namespace {

constexpr int kThreads = 256;  // two warpgroups, 64 output columns each
// Five slots: three loads in flight ahead of the iteration being computed,
// and one more so that a warpgroup may run up to two iterations ahead of the
// other before it waits for a slot to be released.
constexpr int kStages = 5;
constexpr int kAhead = 3;
// The shared fix-up's bound on a CTA's wait for the other K splits of its
// tile (shared_fixup in the kernel): far above the spread of their finishing
// times in a grid that fits in one wave (a few us), short beside a hang.
[[maybe_unused]] constexpr uint64_t kFixupWaitNs = 20000;
// The shared fix-up's counter word: arrivals in the low bits, then one bit
// per arrival index for a CTA that gave up its wait (up to
// kWgmmaSharedFixupMaxSplits splits, w4a16_wgmma.h).
[[maybe_unused]] constexpr int kFixupGaveUpShift = 6;
[[maybe_unused]] constexpr int kFixupArrivalMask = (1 << kFixupGaveUpShift) - 1;
static_assert(kFixupGaveUpShift + kWgmmaSharedFixupMaxSplits <= 31 && kWgmmaSharedFixupMaxSplits <= kFixupArrivalMask,
              "the shared fix-up's counter holds its arrivals and give-up bits in one int");
static_assert(kAhead < kStages - 1,
              "a warpgroup must be able to run ahead of the other by one slot at least");

// Rows of x one TMA load brings for the row tile that starts at m0: the
// tile's rows, or the rows left before M (decode, and the last row tile of a
// larger M), so the copy engine moves only real rows. Rows of a stage past M
// are then left stale rather than zero-filled, which only reaches
// accumulators of output rows that are never stored (a wgmma's column n of D
// depends on column n of B alone). On the H100 this measured the same as
// full boxes at decode. The last row tile has a tensor map of its own
// (XTensorMaps) with that box: with the tile's full box, a last row tile of
// one real row in 256 (257 rows) ran sq8192 and Qwen3-14B's qkv 35% / 30%
// slower than one of 64 (320 rows) on an H200, on the same plan; with the
// box of its real rows as fast (docs/w4a16-gemm.md, v46).
template <int kMTile>
__host__ __device__ constexpr int x_box_rows(int M, int m0 = 0) {
  return M - m0 < kMTile ? M - m0 : kMTile;
}
// x's tensor maps: [0] for the full row tiles, [1] for the last row tile.
// Only the 128- and 256-row tiles use [1] (kLastRowBox): they are the ones
// `auto` runs with several row tiles, and the choice cost the three-CTA
// 64-row stream-K build a spill at its 80 registers.
struct XTensorMaps {
  CUtensorMap map[2];
};
template <int kMTile>
constexpr bool kLastRowBox = kMTile >= 128;

template <int kMTile>
struct Smem {
  static constexpr int kXBytes = kMTile * 128;  // kMTile rows of x x 64 halves, 128-byte swizzle
  static constexpr int kWBytes = 2 * 128 * 16;  // each thread's 16 bytes of weights
  static constexpr int kSzBytes = 2 * 128 * 4;  // scale/zero of rows k0 and k0 + 32, 128 columns
  static constexpr int kStageBytes = kXBytes + kWBytes + kSzBytes;
  static_assert(kStageBytes % 1024 == 0, "x tiles must stay 1024-byte aligned (the swizzle atom)");
  static constexpr int kBytes = kStages * kStageBytes + 1024;  // + slack to align the base
};

// The device helpers below exist only where the kernel body does (sm_90a
// device code; the host pass sees them too): an sm_80 pass would otherwise
// warn that they are never referenced.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor for a K-major tile with the 128-byte
// swizzle: start address >> 4 (bits 0-13), leading byte offset (unused for
// swizzled K-major; 1 by convention, bits 16-29), stride byte offset = 1024
// bytes between 8-row groups (bits 32-45), layout type 1 = 128B swizzle (bits 62-63).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Values the front end cannot recompute (it would otherwise rebuild them
// from %tid.x and the shared window's address inside the K loop).
__device__ __forceinline__ uint32_t opaque_thread_index() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
  return v;
}
__device__ __forceinline__ uint32_t opaque_u32(uint32_t v) {
  asm volatile("" : "+r"(v));
  return v;
}
// Stage reads by 32-bit shared address, ordered after the stage's mbarrier
// wait (both volatile, with the memory clobber).
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
// Keeps the compiler from moving accumulator reads/writes across the async
// wgmma boundary (it does not know the tensor cores own them meanwhile).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif  // !__CUDA_ARCH__ || __CUDA_ARCH_FEAT_SM90_ALL

// Which output tile, and which K split of it, a CTA computes. Without tail
// tiles the grid is (row tiles, column tiles, split_k), its (x, y) position
// read as a position in the tile order (wgmma_grouped_tile,
// w4a16_wave_rule.h). With them it is one-dimensional: first the tail tiles'
// tail_split CTAs each (the last tail_tiles positions of that order), then
// one CTA per whole tile. The tail goes first so that its splits start
// together and its fix-up overlaps the whole tiles. Its CTAs are in split-major order, as in the uniform grid:
// neighbouring column tiles' weights of one k-range are contiguous.
//
// With stream-K (args.stream_k_ctas = G > 0, G >= tiles; the kernels
// instantiated with kStreamK) the tiles x iters k-iterations of the grid,
// tile after tile (iteration tile * iters + k), are cut into G ranges of
// equal length (to one), [first, first + n), one per CTA (split = 0,
// n_splits = 1, and tile the tile of `first`): a range covers the end of one
// tile and the start of the next at most, and the pipeline runs through the
// boundary without draining.
struct WgmmaWork {
  int row_tile, col_tile, tile;  // tile = col_tile * row tiles + row_tile
  int split, n_splits;
  bool tail;
  int tail_index;  // tail tiles: 0 .. tail_tiles - 1
  int first, n;    // stream-K: the CTA's k-iterations, in the grid's order
};

// Stream-K: the first iteration of CTA b's range, and the CTA whose range
// holds iteration `it` (the largest b with stream_k_begin(b) <= it). (Only
// where the kernel body is, like the helpers above.)
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ int stream_k_begin(int b, int total, int ctas) {
  return static_cast<int>(static_cast<int64_t>(b) * total / ctas);
}
__device__ __forceinline__ int stream_k_cta_of(int it, int total, int ctas) {
  return static_cast<int>(((static_cast<int64_t>(it) + 1) * ctas - 1) / total);
}
#endif

template <int kMTile, bool kStreamK>
__device__ __forceinline__ WgmmaWork wgmma_work(const WgmmaArgs& args) {
  const int row_tiles = (args.M + kMTile - 1) / kMTile;
  WgmmaWork w{};
  if constexpr (kStreamK) {
    const int total = row_tiles * ((args.N_pad + 127) / 128) * args.iters;
    w.first = stream_k_begin(blockIdx.x, total, args.stream_k_ctas);
    w.n = stream_k_begin(blockIdx.x + 1, total, args.stream_k_ctas) - w.first;
    w.row_tile = (w.first / args.iters) % row_tiles;
    w.col_tile = (w.first / args.iters) / row_tiles;
    w.tile = w.first / args.iters;
    w.n_splits = 1;
    return w;
  }
  const int col_tiles = (args.N_pad + 127) / 128;
  if (args.tail_tiles == 0) {
    const WgmmaTileCoord at = wgmma_grouped_tile(blockIdx.y * row_tiles + blockIdx.x, row_tiles, col_tiles,
                                                 args.group_rows);
    w.row_tile = at.row;
    w.col_tile = at.col;
    w.split = blockIdx.z;
    w.n_splits = args.split_k;
  } else {
    const int body_tiles = row_tiles * col_tiles - args.tail_tiles;
    const int tail_ctas = args.tail_tiles * args.tail_split, b = blockIdx.x;
    int tile;
    if (b < tail_ctas) {
      w.tail = true;
      w.tail_index = b % args.tail_tiles;
      tile = body_tiles + w.tail_index;
      w.split = b / args.tail_tiles;
      w.n_splits = args.tail_split;
    } else {
      tile = b - tail_ctas;
      w.split = 0;
      w.n_splits = 1;
    }
    const WgmmaTileCoord at = wgmma_grouped_tile(tile, row_tiles, col_tiles, args.group_rows);
    w.row_tile = at.row;
    w.col_tile = at.col;
  }
  w.tile = w.col_tile * row_tiles + w.row_tile;
  return w;
}

// Residency wanted: small tiles (decode) need several CTAs per SM to keep
// enough weight bytes in flight; the 256-row tile holds 128 accumulators per
// thread and runs alone. The 64-row tile also exists for three CTAs per SM
// (kDense, 80 registers instead of 96-104, no spills): each warpgroup waits for
// its own wgmma batch before it dequantizes the next, so the SM's tensor
// cores are fed only while some other warpgroup has its batch ready, and six
// warpgroups per SM hide that chain better than four (Nsight Compute at 64
// rows, two CTAs: tensor pipe 38%, DRAM 38%, issue slots 47%, no limiter
// saturated; docs/w4a16-gemm.md, v16).
template <int kMTile, bool kDense>
constexpr int kMinCtasPerSm = kMTile == 256 ? 1 : (kMTile == kWgmmaDenseRows && kDense ? 3 : (kMTile >= 64 ? 2 : 4));

// kDense: the 64-row tile at three CTAs per SM (kMinCtasPerSm above).
// kStreamK: a separate instantiation (64+-row tiles only), so that the
// kernels of the other paths carry none of its code: the piece boundary in
// the K loop and its bookkeeping changed the 256-row kernel's code enough to
// cost 4-9% on grids that never take it (measured on the H100).
//
// A producer of its own (kHasProducer): the two-CTA 64-row tile and the
// 256-row tile issue every stage's copies from lane 0 of a 9th warp, resp.
// of a third warpgroup, instead of from thread 0 of the first consumer
// warpgroup. There, that thread's copies and its waits for a released stage
// (both warpgroups done with iteration j - 2) sat in warpgroup 0's serial
// chain (wait for the stage, dequantize, wgmma, wait for the wgmma), and the
// chain is what bounds these tiles (docs/w4a16-gemm.md, v16). Measured on
// the H100, each build against the same code without it in one run (v17):
// 64 rows, two CTAs per SM +4-11% on all nine shapes (geomean 1.63 -> 1.72x
// cuBLAS); 256-row tiles +3.7% at 512 rows (the stream-K grids of the
// 5120-column layers +15%), +1% at 256 and 1024, Qwen3-14B qkv -5%. The
// 256-row tile needs 210 registers per consumer thread; a 9th warp would
// cap every thread at 168 (three warps on one scheduler's 16K registers),
// so the producer is a warpgroup that hands its registers to the consumers
// (setmaxnreg: 40 for it, 232 for them, 16128 of a scheduler's 16384). Not
// for the three-CTA 64-row build (it would drop from 80 to 72 registers) or
// the 16/32/128-row tiles (four, four and two CTAs per SM: 56, 56 and 96
// registers instead of 64, 64 and 114-127).
template <int kMTile, bool kDense>
constexpr bool kHasProducer = !kDense && (kMTile == 64 || kMTile == 256);
template <int kMTile, bool kDense>
constexpr int kCtaThreads = kThreads + (!kHasProducer<kMTile, kDense> ? 0 : kMTile == 256 ? 128 : 32);

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The shared fix-up (WgmmaArgs::shared_fixup, W4A16Plan::shared_fixup):
// the count CTAs of a K-split tile sum its slots together, each one part of
// the tile's float4s, where otherwise the last CTA to arrive sums every slot
// alone while the others exit. That sum is bound by one SM's L2 round trips:
// 4 x 128 KB slots of the 256-row tile's tail took ~6 us on the critical
// path of qwen3-o at 1024 rows (docs/w4a16-gemm.md, v45).
//
// Parts follow the arrival order on the tile's counter, so that no CTA
// spends a round trip on claiming one: the CTA that arrives v-th sums part
// count - 1 - v, the last one part 0 without waiting. A wait is bounded
// (kFixupWaitNs): a CTA that gives up sets its bit (kFixupGaveUpShift + v)
// with a compare-and-swap against a value of fewer than count arrivals, so
// it can only give up before the last arrival, and the last CTA, whose add
// returns every such bit, sums those parts too. No grid can therefore
// deadlock on CTAs that are not resident (the plan takes this path only
// where all of them fit in one wave: there the bound is not reached). Each
// part is summed split 0, 1, ... from 0.0f, add_partials' order: the same
// bits as the last CTA's sum. The last CTA to leave (departures) zeroes both
// counters for the next call; a CTA counts its departure once it has read
// the counter for the last time, before its sum, so that the add's round
// trip overlaps the sum instead of following it (v48: a claim loop with a
// round trip per part and one after the sum lost 2-5% on 128-row grids of
// two to four splits).
//
// Built into the kernels of wgmma_shared_fixup_built's tiles only: in the
// 16-, 32- and dense 64-row kernels (thread 0 produces inside the K loop, at
// their 56-80 register caps) this code lengthened the k-loop by 10-27 SASS
// instructions per k-iteration (tools/sass/kernel_loops.py); the 256-row and
// two-CTA 64-row loops did not change, the 128-row loop grew by 4. A 64-bit
// division here (a call to a routine) had lengthened even those.
template <typename T, int kMTile, bool kProducer>
__device__ __forceinline__ void wgmma_shared_fixup(const float4* tile_slots, int count, int* arrivals, T* y,
                                                int64_t ldy, int M, int N, int N_pad, int col_tile, int m0,
                                                int* parts) {
  // Only values that the caller has in registers after its K loop anyway, or
  // reads from the kernel's parameters there: with the tile's column index or
  // its tile count passed in, the compiler kept them live through the loop.
  const int n_blocks = N_pad / 64;
  int* departures = arrivals + (M + kMTile - 1) / kMTile * ((N_pad + 127) / 128);
  constexpr int64_t kSlotFloat4s = int64_t{kMTile / 8} * kThreads;  // kAcc / 4 quads per thread
  // Quads per thread and splits per round of loads: 16 loads in flight for
  // the 256-row tile, 8 for the others, as add_partials keeps.
  constexpr int kItems = kMTile == 256 ? 4 : (kMTile >= 64 ? 2 : 1);
  constexpr int kRound = kMTile >= 64 ? 4 : 8;
  const int tid = static_cast<int>(threadIdx.x);
  auto consumer_sync = [] {
    if constexpr (kProducer) asm volatile("bar.sync 1, 256;" ::: "memory");
    else __syncthreads();
  };
  // The outputs of float4 idx of a slot: quad idx / kThreads of thread
  // idx % kThreads, whose accumulator 4q + e is output row m0 + 8q + 2t (+1
  // for odd e), column (its warpgroup's block) * 64 + warp * 16 + g (+8 for
  // e >= 2), as in the kernel's for_each_output.
  auto store_quad = [&](int idx, const float4& v) {
    const int th = idx % kThreads, q = idx / kThreads;
    const int block = col_tile * 2 + th / 128;
    if (block >= n_blocks) return;  // that warpgroup had no column block
    const int lane = th % 32, col = block * 64 + (th % 128) / 32 * 16 + lane / 4;
    const int row = m0 + 8 * q + 2 * (lane % 4);
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row + (i & 1), c = col + (i >= 2 ? 8 : 0);
      if (r < M && c < N) y[static_cast<int64_t>(r) * ldy + c] = from_float<T>(e[i]);
    }
  };
  auto sum_part = [&](int p) {
    // 32-bit: a 64-bit division is a call to a routine, and a call in the
    // kernel changes the register allocation of its K loop.
    const int begin = p * static_cast<int>(kSlotFloat4s) / count;
    const int end = (p + 1) * static_cast<int>(kSlotFloat4s) / count;
    for (int i0 = begin + tid; i0 < end; i0 += kThreads * kItems) {
      float4 sum[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) sum[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int sp0 = 0; sp0 < count; sp0 += kRound) {
        float4 a[kRound][kItems];
#pragma unroll
        for (int r = 0; r < kRound; ++r)
#pragma unroll
          for (int k = 0; k < kItems; ++k) {
            const int idx = i0 + k * kThreads;
            a[r][k] = sp0 + r < count && idx < end ? __ldcg(tile_slots + (sp0 + r) * kSlotFloat4s + idx)
                                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
#pragma unroll
        for (int r = 0; r < kRound; ++r)
          if (sp0 + r < count)
#pragma unroll
            for (int k = 0; k < kItems; ++k) add_to(sum[k], a[r][k]);
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k)
        if (i0 + k * kThreads < end) store_quad(i0 + k * kThreads, sum[k]);
    }
  };
  if (tid == 0) {
    const int seen = atomic_add_acq_rel_gpu(arrivals, 1);
    const int v = seen & kFixupArrivalMask;
    int mine = 0;  // bit p: this CTA sums part p
    if (v == count - 1) {
      mine = 1;
      for (int gave_up = seen >> kFixupGaveUpShift; gave_up != 0; gave_up &= gave_up - 1)
        mine |= 1 << (count - 1 - (__ffs(gave_up) - 1));
    } else {
      const uint64_t start = global_timer_ns();
      for (;;) {
        const int now = load_acquire_gpu(arrivals);
        if ((now & kFixupArrivalMask) >= count) {
          mine = 1 << (count - 1 - v);
          break;
        }
        if (global_timer_ns() - start > kFixupWaitNs &&
            atomicCAS(arrivals, now, now | (1 << (kFixupGaveUpShift + v))) == now)
          break;  // gave up before the last arrival, which now sums this part
        __nanosleep(32);
      }
    }
    *parts = mine;
  }
  consumer_sync();
  // Thread 0's last read of the counter is done: its departure's round trip
  // runs beside the sum (a release: the reads come before it).
  const int departed = tid == 0 ? atomic_add_release_gpu(departures, 1) : 0;
  for (int mine = *parts; mine != 0; mine &= mine - 1) sum_part(__ffs(mine) - 1);
  if (tid == 0 && departed == count - 1) {
    fence_acq_rel_gpu();  // after every other CTA's reads of the counter
    *arrivals = 0;        // ready for the next call
    *departures = 0;
  }
}
#endif  // !__CUDA_ARCH__ || __CUDA_ARCH_FEAT_SM90_ALL

// kScaleAfter (the 16-row tile, integer zero points, one scale group per
// k-iteration or per channel: wgmma_scale_after_applies):
// the A operands are the exact q - z (one LOP3 and one HSUB2/HFMA2 per
// register pair, no multiply by s), the wgmma instructions accumulate into
// `raw`, which restarts at each scale group (scale-d = 0 on the group's
// first wgmma), and after a group's last k-iteration acc += s * raw, one
// FFMA per accumulator. At 5-16 rows the wgmma work per k-iteration is
// small and the dequantization is most of a warpgroup's serial chain (wait
// for the stage, dequantize, wgmma, wait for it): this takes the 16 HMUL2 per
// thread and k-iteration out of it for 8 FFMA per group (docs/w4a16-gemm.md,
// v40: +1-8% at 5-32 rows on an H200, by lease). The 32-row tile had it too
// until v41's shorter k-loop, after which it ran 4-7% faster without it
// (its 16 more `raw` registers at 64 made ptxas rebuild addresses in the loop).
// The weights are then not rounded to 16 bits before the products, as in
// the gemv kernel.
//
// kOneGroup: one scale group per k-iteration (groups of 64+ rows, or per
// channel; wgmma_one_scale_group), known at compile time. A stage then holds
// one scale/zero copy, not two, and each thread reads and prepares the
// scales of its two columns once per k-iteration. With that known only at
// run time, the kernels carried the second group's loads and register
// copies in every k-iteration, and the CTA's producing thread a loop over
// the copies: the 64-row loop 122 -> 101 SASS instructions per warp, the
// loops with thread 0 producing (16, 32, 128 rows, dense 64) ~310 -> ~170
// (tools/sass/kernel_loops.py). With the opaque addresses of the K loop
// below: +6-9% at 8-128 rows on an H200 (docs/w4a16-gemm.md, v41). Group 32
// (GGUF's Q4_0 / Q4_1) keeps the instances with two groups per k-iteration.
template <typename T, int kMTile, bool kFloatZero, bool kStreamK, bool kDense, bool kOneGroup,
          bool kScaleAfter = false>
__global__ void __launch_bounds__(kCtaThreads<kMTile, kDense>, kMinCtasPerSm<kMTile, kDense>)
    w4a16_wgmma_kernel(const __grid_constant__ XTensorMaps x_maps, const WgmmaArgs args) {
  static_assert(!kStreamK || kMTile >= kWgmmaMinTailRows, "stream-K runs tiles of 64 rows and more");
  static_assert(!kDense || kMTile == kWgmmaDenseRows, "only the 64-row tile has a three-CTA build");
  static_assert(!kScaleAfter || (kMTile <= kScaleAfterMaxRows && !kFloatZero && !kStreamK && kOneGroup),
                "the scale after the wgmma: 16-row tiles with integer zero points and one group per "
                "k-iteration only");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Smem<kMTile>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kAcc = kMTile / 2;
  extern __shared__ unsigned char smem_raw[];
  __shared__ int last_cta;
  __shared__ uint64_t full[kStages], empty[kStages];  // per slot: loads landed / wgmma done reading
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);

  // The thread index through an opaque read: from threadIdx.x the front end
  // re-read %tid.x (and the shared window's address, below) inside the K
  // loop at every k-iteration, an S2R on the path to the stage's first
  // shared-memory load (the same trap as in the decode attention,
  // docs/kv-cache.md, v37).
  const int tid = static_cast<int>(opaque_thread_index());
  const int wg = tid / 128, lt = tid % 128, warp = lt / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const WgmmaWork work = wgmma_work<kMTile, kStreamK>(args);
  const int row_tiles = (args.M + kMTile - 1) / kMTile;
  const int n_blocks = args.N_pad / 64;
  const int split = work.split, n_splits = work.n_splits;
  // The CTA's k-iterations: n from it_begin in its tile; with stream-K the
  // first first_piece of them, and the rest from k = 0 of the next tiles
  // (a range longer than a tile, where the grid has fewer CTAs than tiles,
  // holds whole tiles between its first and its last piece).
  int it_begin, n, first_piece;
  if constexpr (kStreamK) {
    it_begin = work.first - work.tile * args.iters;
    n = work.n;
    first_piece = min(n, args.iters - it_begin);
  } else {
    it_begin = static_cast<int>(static_cast<int64_t>(split) * args.iters / n_splits);
    const int it_end = static_cast<int>(static_cast<int64_t>(split + 1) * args.iters / n_splits);
    n = it_end - it_begin;
    first_piece = n;
  }
  // The output tile being computed: its first row, and this warpgroup's
  // 64-column block, which the last column tile may not have (uniform per
  // warpgroup).
  int m0 = work.row_tile * kMTile, nb = work.col_tile * 2 + wg;
  bool active = nb < n_blocks;

  auto stage_x = [&](int s) { return smem + s * S::kStageBytes; };
  auto stage_w = [&](int s) { return reinterpret_cast<uint4*>(smem + s * S::kStageBytes + S::kXBytes); };
  auto stage_sz = [&](int s) {
    return reinterpret_cast<uint32_t*>(smem + s * S::kStageBytes + S::kXBytes + S::kWBytes);
  };

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  // kScaleAfter: the current scale group's sums, sum (q - z) x; acc holds
  // the scaled sums of the groups before it.
  float raw[kScaleAfter ? kAcc : 1];
#pragma unroll
  for (int i = 0; i < (kScaleAfter ? kAcc : 1); ++i) raw[i] = 0.0f;
  // k-iterations per scale group - 1 (groups of 64, 128, 256 rows: 0, 1, 3),
  // or all bits for per channel: a group ends after k-iteration `it` when
  // (it + 1) & group_iters_mask == 0, and the CTA's range ends one anyway.
  const int group_iters_mask = args.group_shift < 0 ? 0x7fffffff : (1 << max(0, args.group_shift - 6)) - 1;
  bool group_start = true;

  if (tid == 0)
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);          // the producer's arrive + the stage's transaction bytes
      mbar_init(&empty[s], kThreads);  // every thread arrives once per use (after its wgmma)
    }
  __syncthreads();
  // Thread 0 fills stage i (local iteration) into slot i % kStages once the
  // use of that slot by iteration i - kStages has been released by both
  // warpgroups. Weights of the tile's (one or two) column blocks are
  // contiguous, and so are a group's scale/zero pairs of those columns.
  // Local iteration i < first_piece is k-iteration it_begin + i of the
  // CTA's tile; with stream-K, iteration i >= first_piece is k-iteration
  // (i - first_piece) % iters of the tile (i - first_piece) / iters after it.
  struct StageSource {
    int k_it, col_tile, m0;
    uint32_t w_bytes, sz_bytes;
  };
  const int tile_blocks = min(2, n_blocks - work.col_tile * 2);
  const uint32_t w_bytes = tile_blocks * 128 * 16, sz_bytes = tile_blocks * 64 * 4;
  auto stage_source = [&](int i) {
    if (!kStreamK || i < first_piece)
      return StageSource{it_begin + i, work.col_tile, work.row_tile * kMTile, w_bytes, sz_bytes};
    const int rel = i - first_piece, whole = rel / args.iters;
    const int tile = work.tile + 1 + whole, col_tile = tile / row_tiles, blocks = min(2, n_blocks - col_tile * 2);
    return StageSource{rel - whole * args.iters, col_tile, tile % row_tiles * kMTile,
                       static_cast<uint32_t>(blocks * 128 * 16), static_cast<uint32_t>(blocks * 64 * 4)};
  };
  // Rows k0 and k0 + 32 share their scales unless the group is 32 rows: one
  // scale copy then, not two. At decode a stage is only 4 KB of weights, and
  // the copy engine's cost per copy shows (bench_hbm_stream: 4 KB stages with
  // two small extra copies each stream at ~60% of copy bandwidth, without
  // them at ~80%).
  constexpr int sz_parts = kOneGroup ? 1 : 2;
  // The weights and scales of stage i (and the stage's whole byte count);
  // x separately, since only x depends on the kernels before this one.
  auto produce_weights = [&](int i) {
    const StageSource src = stage_source(i);
    const int s = i % kStages, it = src.k_it, k0 = it * 64;
    if (i >= kStages) mbar_wait(&empty[s], ((i / kStages) + 1) & 1);
    mbar_arrive_expect_tx(&full[s], x_box_rows<kMTile>(args.M, kLastRowBox<kMTile> ? src.m0 : 0) * 128 + src.w_bytes +
                                        sz_parts * src.sz_bytes);
    bulk_load(stage_w(s), args.qweight + (static_cast<int64_t>(it) * n_blocks + src.col_tile * 2) * 128,
              src.w_bytes, &full[s]);
    // The groups of rows k0 and k0 + 32 (the same one but for groups of 32).
    const uint32_t* sz_src = args.scale_zero + src.col_tile * 128;
    const int group0 = args.group_shift < 0 ? 0 : k0 >> args.group_shift;
    bulk_load(stage_sz(s), sz_src + static_cast<int64_t>(group0) * args.N_pad, src.sz_bytes, &full[s]);
    if constexpr (!kOneGroup)
      bulk_load(stage_sz(s) + 128, sz_src + static_cast<int64_t>(group0 + 1) * args.N_pad, src.sz_bytes,
                &full[s]);
  };
  auto produce_x = [&](int i) {
    const StageSource src = stage_source(i);
    const bool last = kLastRowBox<kMTile> && src.m0 + kMTile >= args.M;
    tma_load_2d(stage_x(i % kStages), &x_maps.map[last ? 1 : 0], src.k_it * 64, src.m0, &full[i % kStages]);
  };
  auto produce = [&](int i) {
    produce_weights(i);
    produce_x(i);
  };
  // Programmatic dependent launch (lowbit/cuda/pdl.cuh): the first stages'
  // weights, which no kernel writes, are requested before waiting for the
  // previous kernel; x, y and the split-K workspace only after it. At decode
  // this hides the pipeline's fill latency behind the previous kernel's tail.
  constexpr bool kProducer = kHasProducer<kMTile, kDense>;
  if constexpr (kProducer) {
    if constexpr (kMTile == 256) {  // the producer warpgroup hands its registers to the consumers
      if (tid >= kThreads) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
      else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    }
    if (tid >= kThreads) {
      if (tid == kThreads)
        for (int i = 0; i < kAhead && i < n; ++i) produce_weights(i);
      cuda::pdl_wait();
      cuda::pdl_launch_dependents();
      if (tid == kThreads) {
        for (int i = 0; i < kAhead && i < n; ++i) produce_x(i);
        for (int i = kAhead; i < n; ++i) produce(i);
      }
      return;
    }
  }
  // From here on only the 256 consumer threads run: with a producer, their
  // barriers are named barrier 1 (the producer has returned).
  auto consumer_sync = [] {
    if constexpr (kProducer) asm volatile("bar.sync 1, 256;" ::: "memory");
    else __syncthreads();
  };
  if (!kProducer && tid == 0)
    for (int i = 0; i < kAhead && i < n; ++i) produce_weights(i);
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  if (!kProducer && tid == 0)
    for (int i = 0; i < kAhead && i < n; ++i) produce_x(i);
  const int col0 = warp * 16 + g, col1 = col0 + 8;  // this lane's columns within the 64-column block
  // Accumulator i*4 + e: W^T row g (+8 for e >= 2) = output column, x row
  // 8i + 2t (+1 for odd e) = output row.
  T* y = static_cast<T*>(args.y);
  auto for_each_output = [&](auto&& f) {
    if (!active) return;
    const int block_col = nb * 64;
#pragma unroll
    for (int i = 0; i < kAcc / 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + 8 * i + 2 * t + (e & 1);
        const int col = block_col + (e >= 2 ? col1 : col0);
        if (row < args.M) f(row, col, acc[4 * i + e]);
      }
  };
  auto store_y = [&] {
    for_each_output([&](int row, int col, float v) {
      if (col < args.N) y[static_cast<int64_t>(row) * args.ldy + col] = from_float<T>(v);
    });
  };
  // K splits, tail tiles and stream-K store a tile's partials in the
  // accumulators' own order ([slot][quad][thread] float4), so that the CTA
  // that sums them reads each slot with kAcc / 4 independent 16-byte loads
  // per thread: the fix-up is then bound by L2 bandwidth (~128 KB per slot
  // for the 256-row tile), not by a chain of round trips, and its cost is
  // what the plan's split choice weighs against the shorter K range.
  constexpr int kQuads = kAcc / 4;
  constexpr int64_t kSlotFloat4s = int64_t{kQuads} * kThreads;
  auto store_partial = [&](float4* slot) {
#pragma unroll
    for (int q = 0; q < kQuads; ++q)
      __stcg(slot + q * kThreads, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
  };
  // acc += slots first, first + 1, ..., first + count - 1, in that order
  // (the same bits whichever CTA sums), kChunk quads of kRound slots per
  // round of loads: 16 in flight per thread beside the 256-row tile's 128
  // accumulators (210 registers of its 255), 8 for the other tiles, within
  // their 64-128 registers. The 16- and 32-row tiles' decode grids split K
  // up to 16 ways, so they take two quads of four splits per round (the
  // 32-row tile spilled at its 64 registers with four quads of two).
  auto add_partials = [&](const float4* first, int count) {
    constexpr int kChunk = kMTile == 256 ? 8 : (kMTile <= 32 ? 2 : 4);
    constexpr int kRound = kMTile <= 32 ? 4 : 2;
#pragma unroll
    for (int q0 = 0; q0 < kQuads; q0 += kChunk) {
      int sp = 0;
      for (; sp + kRound <= count; sp += kRound) {
        float4 a[kRound][kChunk];
#pragma unroll
        for (int r = 0; r < kRound; ++r)
#pragma unroll
          for (int q = 0; q < kChunk; ++q) a[r][q] = __ldcg(first + (sp + r) * kSlotFloat4s + (q0 + q) * kThreads);
#pragma unroll
        for (int q = 0; q < kChunk; ++q)
#pragma unroll
          for (int r = 0; r < kRound; ++r) add_quad(acc, 4 * (q0 + q), a[r][q]);
      }
      // The splits left over (at most kRound - 1), one at a time. At two
      // per round an `if`: a loop there took the two-CTA 64-row instance
      // from 80 to 91 registers.
      if constexpr (kRound == 2) {
        if (sp < count) {
#pragma unroll
          for (int q = 0; q < kChunk; ++q)
            add_quad(acc, 4 * (q0 + q), __ldcg(first + sp * kSlotFloat4s + (q0 + q) * kThreads));
        }
      } else {
        for (; sp < count; ++sp) {
#pragma unroll
          for (int q = 0; q < kChunk; ++q)
            add_quad(acc, 4 * (q0 + q), __ldcg(first + sp * kSlotFloat4s + (q0 + q) * kThreads));
        }
      }
    }
  };
  // Stream-K: the end of a piece of `tile`, its k-iterations [k_begin,
  // k_begin + len). A whole tile is stored. Any other piece but the first
  // (k_begin > 0) is at the start of its CTA's range: it stores its partial
  // in the CTA's slot and counts itself on the tile's flag, without waiting
  // for anything. The first piece ends its CTA's range, so by the time it is
  // done the later pieces (the starts of the next CTAs' ranges) are
  // normally long stored: its CTA waits for their count, adds their slots
  // in CTA order (a fixed order: the same bits every call) to its own
  // accumulators and stores the tile. No CTA that waits holds up a piece it
  // waits for, so the grid cannot deadlock even when not all of it is
  // resident.
  auto publish_stream_k_partial = [&](int tile) {
    store_partial(reinterpret_cast<float4*>(args.partial) + blockIdx.x * kSlotFloat4s + tid);
    consumer_sync();  // every thread's partials are stored before thread 0's release
    if (tid == 0) red_add_release_gpu(args.counters + tile, 1);
  };
  auto finish_stream_k_piece = [&](int tile, int k_begin, int len) {
    if (k_begin == 0 && len == args.iters) {
      store_y();
      return;
    }
    if (k_begin > 0) {
      publish_stream_k_partial(tile);
      return;
    }
    float4* slots = reinterpret_cast<float4*>(args.partial) + tid;
    int* flag = args.counters + tile;
    const int total = row_tiles * ((args.N_pad + 127) / 128) * args.iters;
    const int others =
        stream_k_cta_of((tile + 1) * args.iters - 1, total, args.stream_k_ctas) - static_cast<int>(blockIdx.x);
    if (tid == 0)
      while (load_acquire_gpu(flag) < others) __nanosleep(100);
    consumer_sync();
    add_partials(slots + (blockIdx.x + 1) * kSlotFloat4s, others);
    store_y();
    if (tid == 0) *flag = 0;  // ready for the next call
  };
  // The K loop's shared-memory addresses, each computed once and kept
  // opaque: this thread's weights and its columns' scale/zero pairs in stage
  // 0, the barriers, and x's descriptor for stage 0 (a stage's descriptor is
  // that plus the stage's offset / 16: the 14-bit address field cannot carry
  // below 256 KB). Before, the front end rebuilt them from the shared
  // window's address at every k-iteration (S2R SR_CgaCtaId, LEA, masks and
  // shifts per wgmma descriptor), and the stage and its phase came from a
  // division by kStages: together ~30 of the 64-row loop's ~150
  // instructions per warp, where the four wgmma of a k-iteration take 128
  // tensor-core cycles (docs/w4a16-gemm.md, v41).
  const uint32_t smem_base = opaque_u32(smem_address(smem));
  const uint32_t full_bar = opaque_u32(smem_address(&full[0]));
  const uint32_t empty_bar = opaque_u32(smem_address(&empty[0]));
  const uint32_t w_lane = opaque_u32(smem_base + S::kXBytes + 16u * static_cast<uint32_t>(tid));
  const uint32_t sz_lane =
      opaque_u32(smem_base + S::kXBytes + S::kWBytes + 4u * static_cast<uint32_t>(wg * 64 + col0));
  const uint64_t x_desc0 = sw128_desc(smem_base);
  int s = 0;            // this k-iteration's slot, j % kStages
  uint32_t phase = 0;   // and the parity of its use, (j / kStages) & 1
  // Stream-K: the piece being computed, its tile, its first k-iteration in
  // that tile, and the local iteration after its last.
  int piece_tile = work.tile, piece_k = it_begin, piece_end = first_piece;

  // One k-iteration (64 rows of K): dequantize this warp's 16 x 64 slice of
  // W^T into the A fragments of four k16 steps, then four wgmma.
  for (int j = 0; j < n; ++j) {
    const uint32_t stage_off = static_cast<uint32_t>(s) * S::kStageBytes;
    mbar_wait(full_bar + 8 * s, phase);  // TMA writes and wgmma reads are both async proxy: no fence
    // An inactive warpgroup (past the last column block) computes on stale
    // shared memory and stores nothing: branching around wgmma would make the
    // compiler serialize every wgmma of the kernel (it cannot prove the branch
    // uniform per warpgroup).
    const uint4 wq = ld_shared_v4(w_lane + stage_off);
    // kScaleAfter: sz0, sz1 are read before the stage is released.
    const uint32_t sz0 = ld_shared_u32(sz_lane + stage_off), sz1 = ld_shared_u32(sz_lane + stage_off + 32);
    const ColumnDequant<T> lo0 = column_dequant<T, kFloatZero>(sz0);
    const ColumnDequant<T> lo1 = column_dequant<T, kFloatZero>(sz1);
    ColumnDequant<T> hi0 = lo0, hi1 = lo1;  // rows k0 + 32 .. k0 + 63
    if constexpr (!kOneGroup) {
      hi0 = column_dequant<T, kFloatZero>(ld_shared_u32(sz_lane + stage_off + 128 * 4));
      hi1 = column_dequant<T, kFloatZero>(ld_shared_u32(sz_lane + stage_off + 128 * 4 + 32));
    }
    uint32_t b[4][2][2], a[4][4];
    if constexpr (kScaleAfter) {
      const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        typename Vec2<T>::type p[4];
        word_pairs(words[i], lo0, lo1, p);  // exact q - z
        b[i][0][0] = as_u32(p[0]), b[i][0][1] = as_u32(p[1]);
        b[i][1][0] = as_u32(p[2]), b[i][1][1] = as_u32(p[3]);
      }
    } else {
      dequant_word<T, kFloatZero>(wq.x, lo0, lo1, b[0][0], b[0][1]);
      dequant_word<T, kFloatZero>(wq.y, lo0, lo1, b[1][0], b[1][1]);
      dequant_word<T, kFloatZero>(wq.z, hi0, hi1, b[2][0], b[2][1]);
      dequant_word<T, kFloatZero>(wq.w, hi0, hi1, b[3][0], b[3][1]);
    }
    // mma B fragment (k 2t..2t+1 / 2t+8..2t+9 of column g) = wgmma A fragment
    // (row g / g+8 = column col0 / col1, k 2t.. / 2t+8..): a0 (g, k lo),
    // a1 (g+8, k lo), a2 (g, k hi), a3 (g+8, k hi).
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      a[ks][0] = b[ks][0][0];
      a[ks][1] = b[ks][1][0];
      a[ks][2] = b[ks][0][1];
      a[ks][3] = b[ks][1][1];
    }
    // All A registers are final before the wgmma batch starts: otherwise the
    // compiler may sink parts of the dequantization between the wgmma
    // instructions, and the assembler then serializes them.
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[ks][r])::"memory");
    wgmma_fence();
    const uint64_t x_desc = x_desc0 + (stage_off >> 4);  // k16 step ks: + 32 bytes = + 2
    if constexpr (kScaleAfter) {
      fence_accumulators(raw);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        Wgmma<kMTile, kBf16>::run(raw, a[ks], x_desc + 2 * ks, ks > 0 || !group_start ? 1 : 0);
    } else {
      fence_accumulators(acc);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) Wgmma<kMTile, kBf16>::run(acc, a[ks], x_desc + 2 * ks);
    }
    wgmma_commit();
    // The next loads go out while the tensor cores work.
    if (!kProducer && tid == 0 && j + kAhead < n) produce(j + kAhead);
    wgmma_wait<0>();
    if constexpr (kScaleAfter) {
      fence_accumulators(raw);
      mbar_arrive(empty_bar + 8 * s);
      group_start = j + 1 == n || ((it_begin + j + 1) & group_iters_mask) == 0;
      if (group_start) {  // the group's last k-iteration: acc += s * raw
        float s0, s1, unused;
        column_scale_offset<T, false>(sz0, s0, unused);
        column_scale_offset<T, false>(sz1, s1, unused);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = fmaf((i & 2) != 0 ? s1 : s0, raw[i], acc[i]);
      }
    } else {
      fence_accumulators(acc);
      mbar_arrive(empty_bar + 8 * s);
    }
    if (++s == kStages) s = 0, phase ^= 1;
    if constexpr (kStreamK)
      if (j + 1 == piece_end && piece_end < n) {
        // Stream-K: a piece that ends before the range does ends its tile.
        // The range's first piece is a partial unless it began at k = 0;
        // any later one began at k = 0, so it is a whole tile (a range
        // longer than a tile), stored as it is.
        if (piece_k > 0) publish_stream_k_partial(piece_tile);
        else store_y();
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
        ++piece_tile;
        piece_k = 0;
        piece_end = min(n, piece_end + args.iters);
        m0 = (piece_tile % row_tiles) * kMTile;
        nb = piece_tile / row_tiles * 2 + wg;
        active = nb < n_blocks;
      }
  }

  if constexpr (kStreamK) {
    // The range's last piece, from local iteration piece_begin: the whole
    // range, or k = 0 of a tile after the first.
    const int piece_begin = piece_tile == work.tile ? 0 : first_piece + (piece_tile - work.tile - 1) * args.iters;
    finish_stream_k_piece(piece_tile, piece_k, n - piece_begin);
    return;
  }

  if (n_splits == 1) {
    store_y();
    return;
  }
  int* counter = args.counters + work.tile;
  // Every K split stores its partials as a whole tile in the accumulators'
  // order, in slots [tile][split] (tail tiles: [tail index][split]): one
  // coalesced 16-byte store per thread and quad, no fence per thread, and
  // the last CTA sums them with add_partials' loads in flight. Uniform
  // splits stored row-major partials before ([split][M][N_pad]: a 4-byte
  // store per accumulator, 8 columns x 4 rows per warp instruction, then a
  // fence per thread), summed a few splits per L2 round trip: at 64 rows
  // that epilogue held ~12% of the warps' stall samples of sq16384 (split
  // 3; docs/w4a16-gemm.md, v42). The sum's order is the same (split 0, 1,
  // ...), and so are the bits. A slot holds the tile's rows past M too, so
  // the explicit wgmma strategy at 1-2 rows moves up to 8-16x the bytes it
  // needs (auto runs the gemv kernel there).
  const int slot_tile = work.tail ? work.tail_index : work.tile;
  float4* slots =
      reinterpret_cast<float4*>(args.partial) + static_cast<int64_t>(slot_tile) * n_splits * kSlotFloat4s + tid;
  store_partial(slots + split * kSlotFloat4s);
  consumer_sync();  // every thread's partials are stored before thread 0's release
  if constexpr (wgmma_shared_fixup_built(kMTile, kDense))
    if (args.shared_fixup) {
        wgmma_shared_fixup<T, kMTile, kProducer>(slots - tid, n_splits, counter, static_cast<T*>(args.y), args.ldy,
                                               args.M, args.N, args.N_pad, (nb - wg) / 2, m0, &last_cta);
      return;
    }
  if (tid == 0) last_cta = atomic_add_acq_rel_gpu(counter, 1) == n_splits - 1;
  consumer_sync();
  if (!last_cta) return;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  add_partials(slots, n_splits);
  store_y();
  if (tid == 0) *counter = 0;  // ready for the next call
#else
  (void)args;  // built without sm_90a: wgmma_supported() keeps this from being launched
#endif
}

__global__ void wgmma_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

template <typename T, int kMTile, bool kFloatZero, bool kOneGroup, bool kStreamK = false, bool kDense = false,
          bool kScaleAfter = false>
void launch_typed(const WgmmaArgs& args, cudaStream_t stream) {
  auto kernel = w4a16_wgmma_kernel<T, kMTile, kFloatZero, kStreamK, kDense, kOneGroup, kScaleAfter>;
  cuda::ensure_dynamic_smem(kernel, Smem<kMTile>::kBytes);
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const unsigned row_tiles = static_cast<unsigned>((args.M + kMTile - 1) / kMTile);
  const int last_m0 = static_cast<int>(row_tiles - 1) * kMTile;
  XTensorMaps maps;
  maps.map[0] = encode_x_tensor_map(args, x_box_rows<kMTile>(args.M), bf16);
  maps.map[1] = !kLastRowBox<kMTile> || x_box_rows<kMTile>(args.M, last_m0) == x_box_rows<kMTile>(args.M)
                    ? maps.map[0]
                    : encode_x_tensor_map(args, x_box_rows<kMTile>(args.M, last_m0), bf16);
  const unsigned col_tiles = static_cast<unsigned>((args.N_pad + 127) / 128);
  const dim3 grid = args.stream_k_ctas > 0 ? dim3(static_cast<unsigned>(args.stream_k_ctas))
                    : args.tail_tiles == 0
                        ? dim3(row_tiles, col_tiles, static_cast<unsigned>(args.split_k))
                        : dim3(row_tiles * col_tiles - static_cast<unsigned>(args.tail_tiles) +
                               static_cast<unsigned>(args.tail_tiles * args.tail_split));
  cuda::launch_with_pdl_in_clusters(kernel, 0, cuda::L2StreamSpan{args.qweight, args.weight_stream_bytes}, grid,
                                    dim3(kCtaThreads<kMTile, kDense>), static_cast<size_t>(Smem<kMTile>::kBytes),
                                    stream, maps, args);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <typename T, bool kFloatZero, bool kOneGroup>
void launch_rows(const WgmmaArgs& args, int rows_per_tile, bool dense, cudaStream_t stream) {
  constexpr bool kG = kOneGroup;
  switch (rows_per_tile) {
    case 16:
      if constexpr (!kFloatZero && kOneGroup)
        if (wgmma_scale_after_applies(16, false, args.group_shift))
          return launch_typed<T, 16, false, true, false, false, true>(args, stream);
      return launch_typed<T, 16, kFloatZero, kG>(args, stream);
    case 32:
      return launch_typed<T, 32, kFloatZero, kG>(args, stream);
    case 64:
      if (dense)
        return args.stream_k_ctas > 0 ? launch_typed<T, 64, kFloatZero, kG, true, true>(args, stream)
                                      : launch_typed<T, 64, kFloatZero, kG, false, true>(args, stream);
      return args.stream_k_ctas > 0 ? launch_typed<T, 64, kFloatZero, kG, true>(args, stream)
                                    : launch_typed<T, 64, kFloatZero, kG>(args, stream);
    case 128:
      return args.stream_k_ctas > 0 ? launch_typed<T, 128, kFloatZero, kG, true>(args, stream)
                                    : launch_typed<T, 128, kFloatZero, kG>(args, stream);
    default:
      return args.stream_k_ctas > 0 ? launch_typed<T, 256, kFloatZero, kG, true>(args, stream)
                                    : launch_typed<T, 256, kFloatZero, kG>(args, stream);
  }
}

template <typename T, bool kFloatZero>
void launch_groups(const WgmmaArgs& args, int rows_per_tile, bool dense, cudaStream_t stream) {
  if (wgmma_one_scale_group(args.group_shift))
    return launch_rows<T, kFloatZero, true>(args, rows_per_tile, dense, stream);
  launch_rows<T, kFloatZero, false>(args, rows_per_tile, dense, stream);
}

}  // namespace

namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    LOWBIT_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || fn == nullptr)
      fail(ErrorKind::unsupported, "W4A16: the CUDA driver has no cuTensorMapEncodeTiled");
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  return encode;
}

}  // namespace

CUtensorMap encode_x_tensor_map(const TiledGemmArgs& a, int rows, bool bf16) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.K), static_cast<cuuint64_t>(a.M)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.ldx) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            2, const_cast<void*>(a.x), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail(ErrorKind::invalid_argument, "W4A16: cannot describe x [", a.M, ", ", a.K,
         "] with row stride ", a.ldx, " to the copy engine (CUresult ", static_cast<int>(r),
         "): rows must be 16-byte aligned");
  return map;
}

bool wgmma_scale_after_applies(int rows_per_tile, bool float_zero, int group_shift) {
  static const bool off = cuda::switched_off_by_env("LOWBIT_WGMMA_SCALE_AFTER");
  return !off && rows_per_tile <= kScaleAfterMaxRows && !float_zero && wgmma_one_scale_group(group_shift);
}

bool wgmma_one_scale_group(int group_shift) { return group_shift < 0 || group_shift >= 6; }

bool wgmma_supported(int device) {
  // Atomic slots: host threads may probe at once (and store the same answer).
  static std::atomic<int> cached[64];  // 0 unknown, 1 no, 2 yes
  if (device < 0 || device >= 64) return false;
  if (const int known = cached[device].load(std::memory_order_relaxed); known != 0) return known == 2;
  cuda::DeviceGuard guard(device);
  int cc_major = 0;
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));
  bool yes = false;
  if (cc_major == 9) {  // sm_90a code runs only on compute capability 9.0
    int* flag = nullptr;
    LOWBIT_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    LOWBIT_CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
    wgmma_probe_kernel<<<1, 1>>>(flag);
    LOWBIT_CUDA_CHECK_LAUNCH();
    int host = 0;
    LOWBIT_CUDA_CHECK(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost));
    LOWBIT_CUDA_CHECK(cudaFree(flag));
    yes = host == 1;
  }
  cached[device].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
}

namespace {

int query_ctas_per_sm(int rows_per_tile, bool bf16, bool dense) {
  int per_sm = 0;
  // Each kernel with the block size it is launched with (kCtaThreads: the
  // producer warp or warpgroup included).
  auto query = [&](auto rows, auto is_dense) {
    constexpr int kRows = decltype(rows)::value;
    constexpr bool kIsDense = decltype(is_dense)::value;
    auto kernel = bf16 ? w4a16_wgmma_kernel<__nv_bfloat16, kRows, false, false, kIsDense, true>
                       : w4a16_wgmma_kernel<half, kRows, false, false, kIsDense, true>;
    cuda::ensure_dynamic_smem(kernel, Smem<kRows>::kBytes);
    LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kCtaThreads<kRows, kIsDense>,
                                                                    Smem<kRows>::kBytes));
  };
  using std::integral_constant;
  switch (rows_per_tile) {
    case 16:
      query(integral_constant<int, 16>{}, std::false_type{});
      break;
    case 32:
      query(integral_constant<int, 32>{}, std::false_type{});
      break;
    case 64:
      dense ? query(integral_constant<int, 64>{}, std::true_type{})
            : query(integral_constant<int, 64>{}, std::false_type{});
      break;
    case 128:
      query(integral_constant<int, 128>{}, std::false_type{});
      break;
    default:
      query(integral_constant<int, 256>{}, std::false_type{});
  }
  return std::max(1, per_sm);
}

}  // namespace

// Cached per device and kernel: w4a16_plan asks on every call (twice for
// the 64-row tile), and the attribute call plus the occupancy query cost
// microseconds of host time that the smallest layers' calls would show.
int wgmma_ctas_per_sm(int rows_per_tile, bool bf16, bool dense) {
  constexpr int kDevices = 64;
  static std::atomic<int> cached[kDevices][5][2][2];  // 0: not asked yet
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  const int rows_index =
      rows_per_tile <= 16 ? 0 : (rows_per_tile <= 32 ? 1 : (rows_per_tile <= 64 ? 2 : (rows_per_tile <= 128 ? 3 : 4)));
  if (device < 0 || device >= kDevices) return query_ctas_per_sm(rows_per_tile, bf16, dense);
  std::atomic<int>& slot = cached[device][rows_index][bf16 ? 1 : 0][dense ? 1 : 0];
  int per_sm = slot.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    per_sm = query_ctas_per_sm(rows_per_tile, bf16, dense);
    slot.store(per_sm, std::memory_order_relaxed);
  }
  return per_sm;
}

void launch_wgmma(const WgmmaArgs& args, int rows_per_tile, bool dense, bool bf16, bool float_zero,
                  cudaStream_t stream) {
  if (dense && rows_per_tile != kWgmmaDenseRows)
    fail(ErrorKind::internal, "W4A16 wgmma: only tiles of ", kWgmmaDenseRows, " rows have a three-CTA build (rows ",
         rows_per_tile, ")");
  if (args.tail_tiles > 0 && (rows_per_tile < kWgmmaMinTailRows || args.split_k != 1 || args.tail_split < 2))
    fail(ErrorKind::internal, "W4A16 wgmma: tail tiles need tiles of ", kWgmmaMinTailRows,
         "+ rows, split_k 1 and a tail split >= 2 (rows ", rows_per_tile, ", split_k ", args.split_k,
         ", tail split ", args.tail_split, ")");
  const int64_t tiles = (int64_t{args.M} + rows_per_tile - 1) / rows_per_tile * ((args.N_pad + 127) / 128);
  if (args.stream_k_ctas > 0 &&
      (rows_per_tile < kWgmmaMinTailRows || args.split_k != 1 || args.tail_tiles != 0 ||
       args.stream_k_ctas > tiles * args.iters))
    fail(ErrorKind::internal, "W4A16 wgmma: stream-K needs tiles of ", kWgmmaMinTailRows,
         "+ rows, split_k 1, no tail tiles and at most one CTA per k-iteration (rows ",
         rows_per_tile, ", split_k ", args.split_k, ", tail tiles ", args.tail_tiles, ", CTAs ",
         args.stream_k_ctas, ", tiles ", tiles, ", k-iterations per tile ", args.iters, ")");
  if (bf16) {
    if (float_zero)
      launch_groups<__nv_bfloat16, true>(args, rows_per_tile, dense, stream);
    else
      launch_groups<__nv_bfloat16, false>(args, rows_per_tile, dense, stream);
  } else {
    if (float_zero)
      launch_groups<half, true>(args, rows_per_tile, dense, stream);
    else
      launch_groups<half, false>(args, rows_per_tile, dense, stream);
  }
}

}  // namespace lowbit::w4a16_detail
