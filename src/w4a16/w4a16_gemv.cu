// The decode W4A16 kernel (strategy `gemv`, sm_90a): y[M, N] = x[M, K] *
// dequant(W) for passes of up to 8 rows of x, as one continuous weight stream
// per CTA.
//
// Why it exists: at decode (M = 1 .. 8) the GEMM is a weight stream and
// nothing else; the wgmma kernel reaches 53-71% of the copy bandwidth there
// (Nsight Compute: latency-bound; each CTA fills a short pipeline for a short
// K range, and a grid of 1000+ CTAs runs in 2-3 partial waves). Here:
//   - The grid is persistent: one CTA per SM, and the flattened work
//     (512-column tiles x 64-row k-iterations, "units", tile-major) is cut
//     into equal contiguous ranges, one per CTA (stream-K). No CTA waits for a
//     later wave, and a CTA's pipeline runs without draining across tiles.
//   - A producer warp keeps kStages units in flight with the copy engine: each
//     unit is one 16 KB bulk copy of weights (the 8 blocks of a tile are
//     contiguous per k-iteration in the layout), its scale/zero pairs, and a
//     TMA load of x's rows for the 64 k of the unit. The consumer warps never
//     issue a global load in the main loop.
//   - Consumers use mma.sync (m16n8k16) with the weight codes as the A
//     operand (16 output columns x 16 rows of K: a lane's 16 bytes of the
//     layout are the A fragments of four mma) and the rows of x as its n = 8
//     columns, with deferred dequantization (below): no wait on an
//     asynchronous batch, so a warp hands its slot back as soon as it is done.
//   - A tile cut by a range boundary is finished by the last of its CTAs to
//     arrive (a counter per tile), which sums the others' fp32 partials in CTA
//     order: the result does not depend on timing (bitwise reproducible).
//   - Launched with programmatic dependent launch (lowbit/cuda/pdl.cuh): the
//     first units' weights are requested before waiting for the previous
//     kernel; x, y and the workspace only after.
// Measured on the H100 (docs/w4a16-gemm.md, "v6"): correct, as fast as wgmma
// on the widest layers and slower on the others (geomean 1.71x cuBLAS at
// M = 1 against wgmma's 2.2x), although its copies alone stream at 2.6 TB/s
// (bench_hbm_stream): `auto` does not choose it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/pdl.cuh"
#include "w4a16_async_copy.cuh"
#include "w4a16_device.cuh"
#include "w4a16_gemv.h"

namespace lowbit::w4a16_detail {
namespace {

// A tile is 512 columns = 8 blocks of the layout: at one k-iteration they
// are 16 KB of contiguous weights, one bulk copy (the cuBLAS FP16 kernel that
// reaches 90% of HBM bandwidth at M = 1 on the H100 moves 16 KB tiles through
// 12 stages; 4 KB copies, 2-3 CTAs per SM and 8-12 stages reached only
// 1.6-1.8 TB/s here).
constexpr int kBlocksPerTile = 8;
constexpr int kTileCols = kBlocksPerTile * 64;
constexpr int kConsumerWarps = 16;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
constexpr int kStages = 10;                // 10 x 16 KB of weights in flight per SM
constexpr int kMinCtasPerSm = 1;

// Rows of x one TMA load brings: min(M, 8), so the copy engine moves only
// real rows (a box past M would be zero-filled: 7 of 8 rows at M = 1). The
// rows of a stage past M are left stale, which only reaches output rows that
// are never stored (an mma's column n of D depends on column n of B alone).
// On the H100 this measured the same as full boxes.
__host__ __device__ constexpr int x_box_rows(int M) { return M < kGemvRowsPerPass ? M : kGemvRowsPerPass; }

struct Smem {
  static constexpr int kXBytes = kGemvRowsPerPass * 128;  // 8 rows x 64 halves, 128-byte swizzle
  static constexpr int kWBytes = kBlocksPerTile * 128 * 16;
  static constexpr int kSzBytes = 2 * kTileCols * 4;  // scale/zero of rows k0 and k0 + 32
  static constexpr int kStageBytes = kXBytes + kWBytes + kSzBytes;
  static_assert(kStageBytes % 1024 == 0, "x slices must stay 1024-byte aligned (the swizzle atom)");
  static constexpr int kBytes = kStages * kStageBytes + 1024;  // + slack to align the base
};

// The device helpers exist only where the kernel body does (an sm_80 pass
// would warn that they are never referenced).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps (0 is __syncthreads)
constexpr int kStripsPerWarp = kBlocksPerTile * 4 / kConsumerWarps;  // 16-column strips

// Units [begin(c), begin(c + 1)) belong to CTA c of `ctas`.
__device__ inline int64_t range_begin(int64_t c, int64_t units, int64_t ctas) { return c * units / ctas; }
// The CTA whose range holds unit u: the largest c with range_begin(c) <= u.
__device__ inline int owner_of(int64_t u, int64_t units, int64_t ctas) {
  return static_cast<int>(((u + 1) * ctas - 1) / units);
}

// The (tile, k-iteration) of a unit, stepped without dividing.
struct UnitCursor {
  int tile, it;
  __device__ UnitCursor(int64_t u, int iters) : tile(static_cast<int>(u / iters)), it(static_cast<int>(u % iters)) {}
  __device__ void next(int iters) {
    if (++it == iters) it = 0, ++tile;
  }
};

// A slot of the ring and the parity of its current use.
struct SlotCursor {
  int slot = 0;
  uint32_t phase = 0;
  __device__ void next() {
    if (++slot == kStages) slot = 0, phase ^= 1;
  }
};

__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kConsumerBarrier), "n"(kConsumers) : "memory");
}

#endif  // !__CUDA_ARCH__ || __CUDA_ARCH__ >= 900

template <typename T, bool kFloatZero>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    w4a16_gemv_kernel(const __grid_constant__ CUtensorMap x_map, const GemvArgs args, const int m0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages];  // per slot: bytes landed / consumers done reading
  __shared__ int last_cta;
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n_blocks = args.N_pad / 64, n_tiles = (n_blocks + kBlocksPerTile - 1) / kBlocksPerTile;
  const int64_t units = static_cast<int64_t>(n_tiles) * args.iters, ctas = gridDim.x;
  // CTA c takes range c. (Ordering the ranges so that CTAs running together
  // read the same k-iterations, split-K style, measured the same on the H100.)
  const int64_t cta = blockIdx.x;
  const int64_t u_begin = range_begin(cta, units, ctas), u_end = range_begin(cta + 1, units, ctas);
  const int n = static_cast<int>(u_end - u_begin);
  const bool one_group = args.group_shift < 0 || args.group_shift >= 6;  // rows k0 and k0+32 share scales
  const uint32_t x_bytes = x_box_rows(args.M) * 128;

  auto stage_x = [&](int s) { return smem + s * Smem::kStageBytes; };
  auto stage_w = [&](int s) { return reinterpret_cast<uint4*>(smem + s * Smem::kStageBytes + Smem::kXBytes); };
  auto stage_sz = [&](int s) {
    return reinterpret_cast<uint32_t*>(smem + s * Smem::kStageBytes + Smem::kXBytes + Smem::kWBytes);
  };

  if (tid == 0)
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);                // the producer's arrive + the stage's transaction bytes
      mbar_init(&empty[s], kConsumerWarps);  // one arrive per consumer warp and use
    }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // ---- Producer: one lane streams the CTA's units into the slot ring. ----
    if (lane != 0) return;
    // (tile, k-iteration) of the units are walked with a cursor: a 64-bit
    // division per unit costs more issue slots than the unit's copies.
    auto produce_weights = [&](int i, const UnitCursor& c, const SlotCursor& slot) {
      const int s = slot.slot;
      const int blocks = min(kBlocksPerTile, n_blocks - kBlocksPerTile * c.tile), parts = one_group ? 1 : 2;
      const uint32_t w_bytes = blocks * 128 * 16, sz_bytes = blocks * 64 * 4;
      if (i >= kStages) mbar_wait(&empty[s], slot.phase ^ 1);  // released by the use before this one
      mbar_arrive_expect_tx(&full[s], x_bytes + w_bytes + parts * sz_bytes);
      const int first_block = c.it * n_blocks + kBlocksPerTile * c.tile;
      bulk_load(stage_w(s), args.qweight + static_cast<int64_t>(first_block) * 128, w_bytes, &full[s]);
      for (int part = 0; part < parts; ++part) {
        const int k = c.it * 64 + 32 * part;
        const int group = args.group_shift < 0 ? 0 : k >> args.group_shift;
        bulk_load(stage_sz(s) + part * kTileCols,
                  args.scale_zero + static_cast<int64_t>(group) * args.N_pad + c.tile * kTileCols,
                  sz_bytes, &full[s]);
      }
    };
    auto produce_x = [&](const UnitCursor& c, const SlotCursor& slot) {
      tma_load_2d(stage_x(slot.slot), &x_map, c.it * 64, m0, &full[slot.slot]);
    };
    // Weights, which no kernel writes, go out before the wait for the
    // previous kernel (programmatic dependent launch); x only after it.
    const int first = min(n, kStages);
    UnitCursor c(u_begin, args.iters);
    SlotCursor slot;
    for (int i = 0; i < first; ++i, c.next(args.iters), slot.next()) produce_weights(i, c, slot);
    cuda::pdl_wait();
    cuda::pdl_launch_dependents();
    UnitCursor cx(u_begin, args.iters);
    SlotCursor slot_x;
    for (int i = 0; i < first; ++i, cx.next(args.iters), slot_x.next()) produce_x(cx, slot_x);
    for (int i = first; i < n; ++i, c.next(args.iters), slot.next()) {
      produce_weights(i, c, slot);
      produce_x(c, slot);
    }
    return;
  }

  // ---- Consumers: warp w computes the 16-column strips w + 16 m of the
  // tile (strip j: block j / 4 of the tile, its columns 16 (j % 4) .. +15),
  // independent mma chains. ----
  cuda::pdl_wait();  // y and the workspace may still be read by the previous kernel
  const int g = lane / 4, t = lane % 4;
  const int rows = min(kGemvRowsPerPass, args.M - m0);
  T* y = static_cast<T*>(args.y);
  // ldmatrix.x4 of x: lane l addresses row l % 8 of matrix l / 8; matrices
  // (k-step 2p, k 0-7), (2p, 8-15), (2p+1, 0-7), (2p+1, 8-15) are 16-byte
  // chunks 4p + l / 8 of the row, stored at chunk ^ row (the swizzle). Rows
  // past M are stale (x_box_rows): they only reach D columns never stored.
  const int x_row = lane % 8, x_chunk = lane / 8;
  auto strip_of = [&](int m) { return warp + kConsumerWarps * m; };
  auto col0_of = [&](int m) { return strip_of(m) * 16 + g; };  // column within the tile; col1 = col0 + 8

  // Deferred dequantization. The mma multiplies x by the codes as they come
  // out of one LOP3 (kCodeBias + q; fp16 codes in bits 4..7 of a byte give
  // kCodeBias + 16 q, and meet x / 16 so their products are kCodeBias / 16 x
  // + q x). What a scale group contributes to y is then, per column,
  //   s * (raw - kCodeBias * A) + off * S,   off = -s z (or m, float zero-point),
  // with raw the mma sum, S = sum of x and A = the x-side sum the biases met,
  // both per row of x and group, from one more mma per k-step with a 0/1
  // selector as its A operand. This "fold" runs once per group and strip in
  // fp32, instead of a subtraction and a multiply per pair of weights, which
  // halves the dequantization's instructions. (Measured on the H100 it did
  // not change the kernel's time: the consumers' latency, not their
  // instruction count, is what limits it; docs/w4a16-gemm.md, "v6".) Products
  // and sums are exact up to fp32 rounding (codes and x / 16 are exact 16-bit
  // values), so this is closer to the fp32 reference than rounding each
  // weight to 16 bits.
  constexpr bool kHalf = std::is_same_v<T, half>;
  constexpr float kBias = kCodeBias<T>;
  constexpr float kHiScale = kHalf ? 16.0f : 1.0f;  // S_hi = kHiScale * (what the selector mma sums)
  constexpr uint32_t kOne = kHalf ? 0x3C003C00u : 0x3F803F80u;
  // Selector A: row g sums k 2t.. (the lo rows of a k-step), row g + 8 the hi rows.
  const uint32_t selector[4] = {kOne, 0u, 0u, kOne};
  const bool two_groups = !one_group;  // group 32: k-steps 0-1 and 2-3 have their own scales
  // k-iterations per group minus one (group sizes are powers of two), or -1
  // per channel: a mask, since a division per unit showed in the profile.
  const int fold_mask = args.group_shift < 0 ? -1 : (args.group_shift <= 6 ? 0 : (1 << (args.group_shift - 6)) - 1);

  float raw[kStripsPerWarp][2][4] = {};  // [strip][k half: k-steps 0-1 / 2-3][D element] since the last fold
  float xsum[2][4] = {};                 // [k half]: d0, d1 = lo-row sums, d2, d3 = hi-row sums (x rows 2t, 2t+1)
  float out[kStripsPerWarp][4] = {};     // the tile's scaled sums so far

  // Folds k halves [h0, h1] of every active strip with the scales of `sz`.
  auto fold = [&](int h0, int h1, const uint32_t* sz, int tile_blocks) {
    float A[2], S[2];  // rows 2t, 2t + 1 of x
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lo = 0.0f, hi = 0.0f;
      for (int h = h0; h <= h1; ++h) lo += xsum[h][r], hi += xsum[h][2 + r];
      A[r] = lo + hi;
      S[r] = lo + kHiScale * hi;
    }
#pragma unroll
    for (int m = 0; m < kStripsPerWarp; ++m) {
      if (strip_of(m) / 4 >= tile_blocks) continue;  // warp-uniform; its scales were not copied
      float scale[2], offset[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) column_scale_offset<T, kFloatZero>(sz[col0_of(m) + 8 * c], scale[c], offset[c]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float r_sum = 0.0f;
        for (int h = h0; h <= h1; ++h) r_sum += raw[m][h][e];
        const int c = e / 2, r = e & 1;
        out[m][e] += scale[c] * (r_sum - kBias * A[r]) + offset[c] * S[r];
      }
      for (int h = h0; h <= h1; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) raw[m][h][e] = 0.0f;
    }
    for (int h = h0; h <= h1; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) xsum[h][e] = 0.0f;
  };

  const uint32_t full_bar = smem_address(&full[0]), empty_bar = smem_address(&empty[0]);
  UnitCursor cursor(u_begin, args.iters);
  SlotCursor slot;
  for (int i = 0; i < n; ++i, cursor.next(args.iters), slot.next()) {
    const int s = slot.slot;
    const int tile = cursor.tile, it = cursor.it;
    const int tile_blocks = min(kBlocksPerTile, n_blocks - kBlocksPerTile * tile);  // the last tile may be narrower
    const bool tile_ends = it == args.iters - 1 || i == n - 1;
    mbar_wait(full_bar + 8 * s, slot.phase);
    const unsigned char* xs = stage_x(s) + x_row * 128;
    uint32_t bx[4][2];  // x as the B fragment of k-step j: k 2t.. (lo), k 2t+8.. (hi)
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      uint32_t b[4];
      ldmatrix_x4(b, xs + (((4 * pair + x_chunk) ^ x_row) * 16));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        bx[2 * pair + h][0] = b[2 * h];
        bx[2 * pair + h][1] = b[2 * h + 1];
      }
    }
    if constexpr (kHalf) {
      const half2 k1_16 = __float2half2_rn(1.0f / 16.0f);
#pragma unroll
      for (int j = 0; j < 4; ++j) bx[j][1] = as_u32(__hmul2(from_u32<half2>(bx[j][1]), k1_16));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_16816<T>(xsum[j / 2], selector, bx[j]);
#pragma unroll
    for (int m = 0; m < kStripsPerWarp; ++m) {
      if (strip_of(m) / 4 >= tile_blocks) continue;  // warp-uniform
      const uint4 wq = stage_w(s)[strip_of(m) * 32 + lane];  // the layout's [block][strip][lane] order
      const uint32_t words[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t p[4];
        raw_word_pairs<T>(words[j], p);
        // A = codes: rows g / g+8 are columns c0 / c1, k 2t.. then 2t+8..
        const uint32_t a[4] = {p[0], p[2], p[1], p[3]};
        mma_16816<T>(raw[m][j / 2], a, bx[j]);
      }
    }
    const uint32_t* sz = stage_sz(s);
    if (two_groups) {
      fold(0, 0, sz, tile_blocks);
      fold(1, 1, sz + kTileCols, tile_blocks);
    } else if (tile_ends || (fold_mask >= 0 && ((it + 1) & fold_mask) == 0)) {
      fold(0, 1, sz, tile_blocks);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar + 8 * s);  // release semantics: this warp's reads of the slot are done

    if (!tile_ends) continue;
    // ---- The tile ends here (or the range does): store or hand over. ----
    const int64_t tile_begin = static_cast<int64_t>(tile) * args.iters, tile_end = tile_begin + args.iters;
    const int tile_col = tile * kTileCols;
    // D fragment of strip m: out[m][0], [1] = column col0, rows 2t, 2t+1 of
    // the pass; out[m][2], [3] = column col1, same rows.
    auto for_each_acc = [&](auto&& f) {
#pragma unroll
      for (int m = 0; m < kStripsPerWarp; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(2 * t + (e & 1), col0_of(m) + (e < 2 ? 0 : 8), out[m][e]);
    };
    if (tile_begin >= u_begin && tile_end <= u_end) {  // the whole tile is this CTA's
      for_each_acc([&](int r, int col, float v_out) {
        if (r < rows && tile_col + col < args.N)
          y[static_cast<int64_t>(m0 + r) * args.ldy + tile_col + col] = from_float<T>(v_out);
      });
    } else {
      // Partial slot of CTA c: 0 for the first tile of its range, 1 for its last.
      auto partial_of = [&](int64_t c, int tile_index) {
        const int slot_index = range_begin(c, units, ctas) / args.iters == tile_index ? 0 : 1;
        return args.partial + (c * 2 + slot_index) * (kGemvRowsPerPass * kTileCols);
      };
      float* mine = partial_of(cta, tile);
      for_each_acc([&](int r, int col, float v_out) { __stcg(mine + r * kTileCols + col, v_out); });
      __threadfence();  // this thread's partials are visible device-wide before the count
      consumer_sync();
      int* counter = args.counters + tile;
      const int first_cta = owner_of(tile_begin, units, ctas), last_cta_index = owner_of(tile_end - 1, units, ctas);
      if (tid == 0) last_cta = atomicAdd(counter, 1) == last_cta_index - first_cta;
      consumer_sync();
      if (last_cta) {
        __threadfence();
        // Float4s of the tile's rows, each summed over the tile's CTAs in
        // order (the same bits whichever CTA finishes last).
        for (int q = tid; q < rows * (kTileCols / 4); q += kConsumers) {
          const int r = q / (kTileCols / 4), col = (q % (kTileCols / 4)) * 4;
          float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
          for (int c = first_cta; c <= last_cta_index; ++c)
            add_to(sum, __ldcg(reinterpret_cast<const float4*>(partial_of(c, tile) + r * kTileCols + col)));
          store_quad(y + static_cast<int64_t>(m0 + r) * args.ldy, tile_col + col, args.N, sum);
        }
        if (tid == 0) *counter = 0;  // ready for the next call
      }
    }
#pragma unroll
    for (int m = 0; m < kStripsPerWarp; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[m][e] = 0.0f;
  }
#else
  (void)args;
  (void)m0;  // built without sm_90: gemv_supported() keeps this from being launched
#endif
}

template <typename T, bool kFloatZero>
void launch_typed(const GemvArgs& args, cudaStream_t stream) {
  auto kernel = w4a16_gemv_kernel<T, kFloatZero>;
  static bool configured = false;  // per instantiation; the attribute is per device function
  if (!configured) {
    LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::kBytes));
    configured = true;
  }
  const CUtensorMap map = encode_x_tensor_map(args, x_box_rows(args.M), std::is_same_v<T, __nv_bfloat16>);
  // Passes of 8 rows run one after the other on the stream; each finishes
  // its tiles before the next reuses the partials and counters.
  for (int m0 = 0; m0 < args.M; m0 += kGemvRowsPerPass) {
    cuda::launch_with_pdl(kernel, dim3(static_cast<unsigned>(args.split_k)), dim3(kThreads),
                          static_cast<size_t>(Smem::kBytes), stream, map, args, m0);
    LOWBIT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

int gemv_tiles(int N_pad) { return (N_pad / 64 + kBlocksPerTile - 1) / kBlocksPerTile; }

int64_t gemv_units(int N_pad, int iters) { return static_cast<int64_t>(gemv_tiles(N_pad)) * iters; }

size_t gemv_partial_floats(int ctas) { return static_cast<size_t>(ctas) * 2 * kGemvRowsPerPass * kTileCols; }

int gemv_ctas_per_sm(bool bf16) {
  static int cached[2] = {0, 0};
  int& slot = cached[bf16 ? 1 : 0];
  if (slot == 0) {
    int per_sm = 0;
    auto query = [&](auto kernel) {
      LOWBIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::kBytes));
      LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, Smem::kBytes));
    };
    if (bf16) query(w4a16_gemv_kernel<__nv_bfloat16, false>);
    else query(w4a16_gemv_kernel<half, false>);
    slot = std::max(1, per_sm);
  }
  return slot;
}

void launch_gemv(const GemvArgs& args, bool bf16, bool float_zero, cudaStream_t stream) {
  LOWBIT_REQUIRE(args.split_k >= 1 && args.split_k <= gemv_units(args.N_pad, args.iters), "gemv: ", args.split_k,
                 " CTAs for ", gemv_units(args.N_pad, args.iters), " units");
  if (bf16) {
    if (float_zero) launch_typed<__nv_bfloat16, true>(args, stream);
    else launch_typed<__nv_bfloat16, false>(args, stream);
  } else {
    if (float_zero) launch_typed<half, true>(args, stream);
    else launch_typed<half, false>(args, stream);
  }
}

}  // namespace lowbit::w4a16_detail
