// Decode (and, through the same kernel, causal prefill) attention directly on
// the paged TurboQuant cache. Three kernels per call:
//  1. rotate_queries: q' = q @ M once per query head (never a key
//     un-rotation), times softmax_scale * log2(e) so the softmax runs on exp2.
//  2. attend<KF, VF>: one CTA of 4 warps per (row, KV head, KV chunk).
//  3. merge_and_unrotate: the exact log-sum-exp merge of the chunks, then
//     out = o @ M^T once per output when V is stored rotated.
//
// Why the attend kernel looks the way it does (bandwidth is the budget: at
// batch 8 / 32k the tq4 cache is 277 MB, 92 us at 3 TB/s):
//  - CUDA-core dequantization is the trap published int4 kernels fall into:
//    5 query heads x (128 multiply-adds for the score + 128 for the value)
//    per cached token is ~3e9 FMAs at batch 8 / 32k, more time than the
//    memory. So both products run on tensor cores (mma.m16n8k16, fp16 inputs,
//    fp32 accumulation): the query heads sharing a KV head are the 16 rows of
//    A (GQA: a KV head's bytes are read once for all of them), 16 tokens are
//    the columns. Per token a lane only turns indices into fp16 operands.
//  - Index -> operand: one shared-memory load per PAIR of coordinates. A
//    256-entry table maps a byte (two 4-bit indices) to the half2 of their
//    centroids; tq3 (6 bits per pair) and tq2 (4 bits) use 64- and 16-entry
//    tables. Random indices would hit random banks (~3.5-way conflicts), so
//    the table is replicated 32 times, entry e of lane l at word e*32 + l:
//    every lane reads its own bank (32 KB for tq4).
//  - The k (reduction) order of an mma is free as long as A and B agree, so
//    a lane's K operand comes straight from one 16-byte load of its token's
//    row (tq4: coordinates 32c .. 32c+31 for lane%4 = c; the query fragment
//    is gathered with the same permutation). For V the reduction runs over
//    tokens: a lane needs the same coordinate of two tokens, so two tokens'
//    index words are merged with two shifts and two LOP3s into bytes that
//    index the same pair table. Output coordinates are permuted the same way
//    (dim = 16 * (lane/4) + tile) and put back in order at the end.
//  - Scales are per token: K's multiplies the score after the mma, V's is
//    folded into the fp16 probability (p * s_v), the row sum uses p alone.
//  - Each warp streams its own 16-token tiles (a tile never crosses a page:
//    pages are multiples of 16) through a 4-stage cp.async ring: ~6 KB in
//    flight per warp, no block-wide barriers in the loop. The 4 warps' online
//    softmax states are merged once at the end.
//  - Split-KV (flash-decoding) cuts each row into chunks so that there are
//    enough CTAs for every SM at batch 1; decode_split_tokens picks the chunk.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/kv/device_cache.h"

namespace lowbit::kv {
namespace {

constexpr int kD = kDeviceHeadDim;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 16;  // tokens per warp iteration: the n of two m16n8 score tiles, the k of one PV mma
constexpr float kLog2e = 1.4426950408889634f;

enum Fmt : int { kTq4 = 0, kTq3 = 1, kTq2 = 2, kFp16 = 3 };

__host__ __device__ constexpr int row_bytes(int f) { return f == kTq4 ? 64 : f == kTq3 ? 48 : f == kTq2 ? 32 : 256; }
__host__ __device__ constexpr int lut_entries(int f) { return f == kTq4 ? 256 : f == kTq3 ? 64 : f == kTq2 ? 16 : 0; }
__host__ __device__ constexpr bool quantized(int f) { return f != kFp16; }

struct AttnArgs {
  const std::byte* pool;
  int64_t slab_bytes;
  int64_t k_rows, k_scales, v_rows, v_scales;  // slab offsets
  int scale_bytes;                             // 2 (f16) or 4 (f32)
  int num_kv_heads, group, num_q_heads, page_size;
  const int32_t* tables;
  int64_t table_stride;
  const int32_t* lengths;
  int prefill_row;  // -1: decode (row r = sequence r, length lengths[r]); else prefill of that row
  int64_t first_pos;
  const float* q;  // [rows][num_q_heads][d], rotated and scaled
  int64_t split_tokens;
  int max_splits;
  float* part_out;  // [rows][num_q_heads][max_splits][d]
  float* part_lse;  // [rows][num_q_heads][max_splits], log2 units
  float k_centroids[16], v_centroids[16];
};

__device__ __forceinline__ void row_of(const AttnArgs& a, int r, int& table_row, int64_t& len) {
  if (a.prefill_row < 0) {
    table_row = r;
    len = a.lengths[r];
  } else {
    table_row = a.prefill_row;
    len = a.first_pos + r + 1;
  }
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t byte_of(uint32_t w, int k) { return (w >> (8 * k)) & 0xffu; }

// The score tile of 8 tokens: acc[4] += Q'[16 x 128] . K[token rows]^T, the
// lane's K operand decoded from its token's row `row` (see the file comment:
// lane%4 = c owns coordinates 32c .. 32c+31, k-step ks covers 32c + 4ks .. +3).
template <int KF>
__device__ __forceinline__ void score_tile(const uint8_t* row, int c, int lane, const uint32_t (&qa)[8][4],
                                           const uint32_t* lut, float (&acc)[4]) {
  if constexpr (KF == kTq4) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + 16 * c);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint32_t word = w[ks >> 1];
      const int sh = 16 * (ks & 1);
      const uint32_t b0 = lut[(((word >> sh) & 0xffu) << 5) | lane];
      const uint32_t b1 = lut[(((word >> (sh + 8)) & 0xffu) << 5) | lane];
      mma16816(acc, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
    }
  } else if constexpr (KF == kTq2) {
    const uint2 raw = *reinterpret_cast<const uint2*>(row + 8 * c);
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint32_t byte = byte_of(w[ks >> 2], ks & 3);
      const uint32_t b0 = lut[((byte & 15u) << 5) | lane];
      const uint32_t b1 = lut[((byte >> 4) << 5) | lane];
      mma16816(acc, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
    }
  } else if constexpr (KF == kTq3) {
    const uint2 raw = *reinterpret_cast<const uint2*>(row + 8 * c);
    const uint32_t hi = *reinterpret_cast<const uint32_t*>(row + 32 + 4 * c);
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint32_t lo = byte_of(w[ks >> 2], ks & 3);
      const uint32_t hn = (hi >> (4 * ks)) & 15u;
      const uint32_t i0 = (lo & 3u) | ((hn & 1u) << 2), i1 = ((lo >> 2) & 3u) | ((hn & 2u) << 1);
      const uint32_t i2 = ((lo >> 4) & 3u) | (hn & 4u), i3 = ((lo >> 6) & 3u) | ((hn >> 1) & 4u);
      const uint32_t b0 = lut[((i0 | (i1 << 3)) << 5) | lane];
      const uint32_t b1 = lut[((i2 | (i3 << 3)) << 5) | lane];
      mma16816(acc, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
    }
  } else {  // fp16: coordinates 32c + 4ks .. +3 are words 2ks, 2ks+1 of the lane's 64 bytes
    const uint4* p = reinterpret_cast<const uint4*>(row + 64 * c);
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = p[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) mma16816(acc, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], w[2 * ks], w[2 * ks + 1]);
  }
}

// O[16 x 128] += P'[16 x 16 tokens] . V[16 tokens x 128]. The lane's B operand
// for output tile nd is coordinate 16*g + nd (g = lane/4) of tokens 2c, 2c+1
// (b0) and 2c+8, 2c+9 (b1). `valid` masks tokens past the chunk's end: their
// fp16 rows may hold anything (stale slots), and 0 * NaN would poison O.
template <int VF>
__device__ __forceinline__ void value_tile(const uint8_t* rows, int c, int g, int lane, const uint32_t (&pa)[4],
                                           const uint32_t* lut, const bool (&valid)[4], float (&o)[16][4]) {
  const int tok[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
  constexpr int RB = row_bytes(VF);
  if constexpr (VF == kTq4) {
    uint32_t lo[2][2], hi[2][2];  // [pair][word]
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const uint2 A = *reinterpret_cast<const uint2*>(rows + tok[2 * p] * RB + 8 * g);
      const uint2 B = *reinterpret_cast<const uint2*>(rows + tok[2 * p + 1] * RB + 8 * g);
      const uint32_t aw[2] = {A.x, A.y}, bw[2] = {B.x, B.y};
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        lo[p][w] = (aw[w] & 0x0F0F0F0Fu) | ((bw[w] << 4) & 0xF0F0F0F0u);
        hi[p][w] = ((aw[w] >> 4) & 0x0F0F0F0Fu) | (bw[w] & 0xF0F0F0F0u);
      }
    }
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int hs = 0; hs < 2; ++hs) {
          const int nd = 8 * w + 2 * k + hs;
          const uint32_t e0 = byte_of(hs ? hi[0][w] : lo[0][w], k), e1 = byte_of(hs ? hi[1][w] : lo[1][w], k);
          mma16816(o[nd], pa[0], pa[1], pa[2], pa[3], lut[(e0 << 5) | lane], lut[(e1 << 5) | lane]);
        }
  } else if constexpr (VF == kTq2) {
    uint32_t x[2], y[2];
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const uint32_t A = *reinterpret_cast<const uint32_t*>(rows + tok[2 * p] * RB + 4 * g);
      const uint32_t B = *reinterpret_cast<const uint32_t*>(rows + tok[2 * p + 1] * RB + 4 * g);
      x[p] = (A & 0x33333333u) | ((B & 0x33333333u) << 2);
      y[p] = ((A >> 2) & 0x33333333u) | (B & 0xCCCCCCCCu);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int hs = 0; hs < 2; ++hs) {
        const int nd = 2 * k + hs;
        const uint32_t e0 = ((hs ? y[0] : x[0]) >> (4 * k)) & 15u, e1 = ((hs ? y[1] : x[1]) >> (4 * k)) & 15u;
        mma16816(o[nd], pa[0], pa[1], pa[2], pa[3], lut[(e0 << 5) | lane], lut[(e1 << 5) | lane]);
      }
  } else if constexpr (VF == kTq3) {
    uint32_t lw[4], hw[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      lw[t] = *reinterpret_cast<const uint32_t*>(rows + tok[t] * RB + 4 * g);
      hw[t] = *reinterpret_cast<const uint16_t*>(rows + tok[t] * RB + 32 + 2 * g);
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      uint32_t idx[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) idx[t] = ((lw[t] >> (2 * m)) & 3u) | (((hw[t] >> m) & 1u) << 2);
      mma16816(o[m], pa[0], pa[1], pa[2], pa[3], lut[((idx[0] | (idx[1] << 3)) << 5) | lane],
               lut[((idx[2] | (idx[3] << 3)) << 5) | lane]);
    }
  } else {  // fp16: coordinates 16g .. 16g+15 are 8 words of each token's row
    uint32_t w[4][8];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint4* p = reinterpret_cast<const uint4*>(rows + tok[t] * RB + 32 * g);
      const uint4 v0 = p[0], v1 = p[1];
      const uint32_t m = valid[t] ? 0xffffffffu : 0u;
      w[t][0] = v0.x & m, w[t][1] = v0.y & m, w[t][2] = v0.z & m, w[t][3] = v0.w & m;
      w[t][4] = v1.x & m, w[t][5] = v1.y & m, w[t][6] = v1.z & m, w[t][7] = v1.w & m;
    }
#pragma unroll
    for (int nd = 0; nd < 16; ++nd) {
      const uint32_t sel = (nd & 1) ? 0x7632u : 0x5410u;
      mma16816(o[nd], pa[0], pa[1], pa[2], pa[3], __byte_perm(w[0][nd >> 1], w[1][nd >> 1], sel),
               __byte_perm(w[2][nd >> 1], w[3][nd >> 1], sel));
    }
  }
}

__device__ __forceinline__ void fill_lut(uint32_t* lut, int f, const float* centroids) {
  const int entries = lut_entries(f);
  const int bits = f == kTq4 ? 4 : f == kTq3 ? 3 : 2;
  const int mask = (1 << bits) - 1;
  for (int i = threadIdx.x; i < entries * 32; i += blockDim.x) {
    const int e = i >> 5;
    lut[i] = pack_half2(centroids[e & mask], centroids[e >> bits]);
  }
}

template <int KF, int VF>
struct TileLayout {
  static constexpr int KR = row_bytes(KF), VR = row_bytes(VF);
  static constexpr int kStages = (KR + VR) * kTile >= 4096 ? 3 : 4;
};

template <int KF, int VF>
__global__ void __launch_bounds__(kThreads, 2) attend_kernel(AttnArgs a) {
  using L = TileLayout<KF, VF>;
  constexpr int KR = L::KR, VR = L::VR, S = L::kStages;
  extern __shared__ float4 smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_f4);
  uint32_t* lut_k = reinterpret_cast<uint32_t*>(smem);
  uint32_t* lut_v = (VF == KF) ? lut_k : lut_k + lut_entries(KF) * 32;
  uint8_t* stages = smem + 4 * 32 * (lut_entries(KF) + (VF == KF ? 0 : lut_entries(VF)));

  const int split = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
  int table_row;
  int64_t len;
  row_of(a, r, table_row, len);
  const int64_t t0 = split * a.split_tokens;
  if (t0 >= len) return;  // this row has fewer chunks; the merge reads only its own
  const int64_t t1 = min(len, t0 + a.split_tokens);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, c = lane & 3;
  const int sb = a.scale_bytes;
  const int k_sc = kTile * KR;
  const int v_rows = k_sc + (quantized(KF) ? kTile * sb : 0);
  const int v_sc = v_rows + kTile * VR;
  const int stage_bytes = v_sc + (quantized(VF) ? kTile * sb : 0);
  uint8_t* my_stages = stages + warp * S * stage_bytes;
  const int32_t* table = a.tables + table_row * a.table_stride;

  const int64_t tile_begin = t0 / kTile, tile_end = (t1 + kTile - 1) / kTile;
  const int64_t first = tile_begin + warp;
  const int n_my = first < tile_end ? static_cast<int>((tile_end - first + kWarps - 1) / kWarps) : 0;

  auto issue = [&](int i) {
    const int64_t tok = (first + int64_t{kWarps} * i) * kTile;
    const int32_t page = table[tok / a.page_size];
    const int slot = static_cast<int>(tok % a.page_size);
    const std::byte* slab = a.pool + (static_cast<int64_t>(page) * a.num_kv_heads + h) * a.slab_bytes;
    uint8_t* dst = my_stages + (i % S) * stage_bytes;
    auto copy = [&](const std::byte* src, uint8_t* d, int bytes) {
      for (int off = 16 * lane; off < bytes; off += 16 * 32) cp_async16(d + off, src + off);
    };
    copy(slab + a.k_rows + slot * KR, dst, kTile * KR);
    if (quantized(KF)) copy(slab + a.k_scales + slot * sb, dst + k_sc, kTile * sb);
    copy(slab + a.v_rows + slot * VR, dst + v_rows, kTile * VR);
    if (quantized(VF)) copy(slab + a.v_scales + slot * sb, dst + v_sc, kTile * sb);
  };
  // Loads first: the tables and the query fragments below overlap with them.
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < n_my) issue(i);
    cp_async_commit();
  }
  if (quantized(KF)) fill_lut(lut_k, KF, a.k_centroids);
  if (quantized(VF) && VF != KF) fill_lut(lut_v, VF, a.v_centroids);

  // Query fragments (A of the score mma): rows g and g + 8 are query heads
  // h*group + g (zero past the group), columns in the K operand's order.
  uint32_t qa[8][4];
  {
    const float* qbase = a.q + (static_cast<int64_t>(r) * a.num_q_heads + h * a.group) * kD;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
      if (g < a.group) x0 = *reinterpret_cast<const float4*>(qbase + g * kD + 32 * c + 4 * ks);
      if (g + 8 < a.group) x1 = *reinterpret_cast<const float4*>(qbase + (g + 8) * kD + 32 * c + 4 * ks);
      qa[ks][0] = pack_half2(x0.x, x0.y);
      qa[ks][1] = pack_half2(x1.x, x1.y);
      qa[ks][2] = pack_half2(x0.z, x0.w);
      qa[ks][3] = pack_half2(x1.z, x1.w);
    }
  }
  __syncthreads();  // tables filled

  float o[16][4];
#pragma unroll
  for (int nd = 0; nd < 16; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  for (int i = 0; i < n_my; ++i) {
    if (i + S - 1 < n_my) issue(i + S - 1);
    cp_async_commit();
    cp_async_wait<S - 1>();
    __syncwarp();
    const uint8_t* st = my_stages + (i % S) * stage_bytes;
    const int64_t tok0 = (first + int64_t{kWarps} * i) * kTile;

    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      score_tile<KF>(st + (g + 8 * nt) * KR, c, lane, qa, lut_k, s[nt]);
    }
    // Accumulator column 2c + e of tile nt is token 8 nt + 2c + e.
    bool valid[2][2];
    float vscale[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * nt + 2 * c + e;
        valid[nt][e] = tok0 + t < t1;
        float ks = 1.0f, vs = 1.0f;
        if constexpr (quantized(KF))
          ks = sb == 2 ? __half2float(reinterpret_cast<const __half*>(st + k_sc)[t])
                       : reinterpret_cast<const float*>(st + k_sc)[t];
        if constexpr (quantized(VF))
          vs = sb == 2 ? __half2float(reinterpret_cast<const __half*>(st + v_sc)[t])
                       : reinterpret_cast<const float*>(st + v_sc)[t];
        vscale[nt][e] = vs;
        s[nt][e] = valid[nt][e] ? s[nt][e] * ks : -INFINITY;
        s[nt][2 + e] = valid[nt][e] ? s[nt][2 + e] * ks : -INFINITY;
      }
    float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float alpha0 = exp2f(m0 - n0), alpha1 = exp2f(m1 - n1);
    m0 = n0, m1 = n1;
    float p[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      p[nt][0] = exp2f(s[nt][0] - n0);
      p[nt][1] = exp2f(s[nt][1] - n0);
      p[nt][2] = exp2f(s[nt][2] - n1);
      p[nt][3] = exp2f(s[nt][3] - n1);
    }
    l0 = l0 * alpha0 + (p[0][0] + p[0][1] + p[1][0] + p[1][1]);
    l1 = l1 * alpha1 + (p[0][2] + p[0][3] + p[1][2] + p[1][3]);
#pragma unroll
    for (int nd = 0; nd < 16; ++nd) {
      o[nd][0] *= alpha0, o[nd][1] *= alpha0;
      o[nd][2] *= alpha1, o[nd][3] *= alpha1;
    }
    // A of the PV mma: p * s_v as fp16 (0 for masked tokens, whose scale may be garbage).
    auto w = [&](int nt, int j) {
      const int e = j & 1;
      return valid[nt][e] ? p[nt][j] * vscale[nt][e] : 0.0f;
    };
    const uint32_t pa[4] = {pack_half2(w(0, 0), w(0, 1)), pack_half2(w(0, 2), w(0, 3)), pack_half2(w(1, 0), w(1, 1)),
                            pack_half2(w(1, 2), w(1, 3))};
    const bool vvalid[4] = {valid[0][0], valid[0][1], valid[1][0], valid[1][1]};
    value_tile<VF>(st + v_rows, c, g, lane, pa, lut_v, vvalid, o);
    __syncwarp();  // the stage is refilled by the next iteration's issue
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the 4 warps' states: [warp][16 rows][d] outputs, then m and l.
  float* mo = reinterpret_cast<float*>(stages);
  float* mm = mo + kWarps * 16 * kD;
  float* ml = mm + kWarps * 16;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (c == 0) {
    mm[warp * 16 + g] = m0, ml[warp * 16 + g] = l0;
    mm[warp * 16 + g + 8] = m1, ml[warp * 16 + g + 8] = l1;
  }
  // Accumulator column n of output tile nd is coordinate 16 n + nd; the lane
  // holds n = 2c, 2c + 1 for rows g and g + 8.
#pragma unroll
  for (int nd = 0; nd < 16; ++nd) {
    float* base = mo + warp * 16 * kD;
    base[g * kD + 32 * c + nd] = o[nd][0];
    base[g * kD + 32 * c + 16 + nd] = o[nd][1];
    base[(g + 8) * kD + 32 * c + nd] = o[nd][2];
    base[(g + 8) * kD + 32 * c + 16 + nd] = o[nd][3];
  }
  __syncthreads();
  const int j = threadIdx.x;
  for (int row = 0; row < a.group; ++row) {
    float M = -INFINITY;
    for (int w2 = 0; w2 < kWarps; ++w2) M = fmaxf(M, mm[w2 * 16 + row]);
    float total = 0.0f, acc = 0.0f;
    for (int w2 = 0; w2 < kWarps; ++w2) {
      const float mw = mm[w2 * 16 + row];
      if (mw == -INFINITY) continue;  // a warp without tiles
      const float f = exp2f(mw - M);
      total += f * ml[w2 * 16 + row];
      acc += f * mo[(w2 * 16 + row) * kD + j];
    }
    const int64_t out_row = (static_cast<int64_t>(r) * a.num_q_heads + h * a.group + row) * a.max_splits + split;
    a.part_out[out_row * kD + j] = acc / total;
    if (j == 0) a.part_lse[out_row] = M + log2f(total);
  }
}

// q' = (q @ M) * scale_log2 (or q * scale_log2 when K is fp16), one CTA per
// (row, KV head): M's columns are read coalesced, once for the whole group.
__global__ void __launch_bounds__(kD) rotate_queries_kernel(const float* q, const float* m, float* out,
                                                            int num_q_heads, int group, float scale_log2) {
  __shared__ float qs[kDeviceMaxGroup][kD];
  const int r = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
  const int64_t base = (static_cast<int64_t>(r) * num_q_heads + h * group) * kD;
  for (int g = 0; g < group; ++g) qs[g][j] = q[base + g * kD + j];
  __syncthreads();
  float acc[kDeviceMaxGroup];
#pragma unroll
  for (int g = 0; g < kDeviceMaxGroup; ++g) acc[g] = 0.0f;
  if (m == nullptr) {
    for (int g = 0; g < group; ++g) acc[g] = qs[g][j];
  } else {
    for (int i = 0; i < kD; ++i) {
      const float mij = m[i * kD + j];
#pragma unroll
      for (int g = 0; g < kDeviceMaxGroup; ++g)
        if (g < group) acc[g] = fmaf(qs[g][i], mij, acc[g]);
    }
  }
#pragma unroll
  for (int g = 0; g < kDeviceMaxGroup; ++g)
    if (g < group) out[base + g * kD + j] = acc[g] * scale_log2;
}

// out[row][qh] = sum_c 2^(lse_c - M) o_c / sum_c 2^(lse_c - M) over the row's
// chunks, then @ M^T when V is rotated. In place when part_out == out (one chunk).
__global__ void __launch_bounds__(kD) merge_kernel(AttnArgs a, const float* mt, float* out) {
  __shared__ float ys[kDeviceMaxGroup][kD];
  const int r = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
  int table_row;
  int64_t len;
  row_of(a, r, table_row, len);
  const int n_chunks = static_cast<int>((len + a.split_tokens - 1) / a.split_tokens);
  for (int g = 0; g < a.group; ++g) {
    const int64_t base = (static_cast<int64_t>(r) * a.num_q_heads + h * a.group + g) * a.max_splits;
    float M = -INFINITY;
    for (int s = 0; s < n_chunks; ++s) M = fmaxf(M, a.part_lse[base + s]);
    float total = 0.0f, acc = 0.0f;
    for (int s = 0; s < n_chunks; ++s) {
      const float w = exp2f(a.part_lse[base + s] - M);
      total += w;
      acc += w * a.part_out[(base + s) * kD + j];
    }
    ys[g][j] = acc / total;
  }
  __syncthreads();
  for (int g = 0; g < a.group; ++g) {
    float x = ys[g][j];
    if (mt != nullptr) {
      x = 0.0f;
      for (int i = 0; i < kD; ++i) x = fmaf(ys[g][i], mt[i * kD + j], x);
    }
    out[(static_cast<int64_t>(r) * a.num_q_heads + h * a.group + g) * kD + j] = x;
  }
}

int fmt_of(KvFormat f) {
  switch (f) {
    case KvFormat::tq4:
      return kTq4;
    case KvFormat::tq3:
      return kTq3;
    case KvFormat::tq2:
      return kTq2;
    case KvFormat::fp16:
      return kFp16;
  }
  return kFp16;
}

template <int KF, int VF>
void launch_attend(const AttnArgs& a, dim3 grid, cudaStream_t stream) {
  using L = TileLayout<KF, VF>;
  const int sb = a.scale_bytes;
  const int stage_bytes =
      kTile * (L::KR + L::VR) + (quantized(KF) ? kTile * sb : 0) + (quantized(VF) ? kTile * sb : 0);
  const int lut_bytes = 4 * 32 * (lut_entries(KF) + (VF == KF ? 0 : lut_entries(VF)));
  const int merge_bytes = 4 * (kWarps * 16 * kD + 2 * kWarps * 16);
  const int smem = lut_bytes + std::max(kWarps * L::kStages * stage_bytes, merge_bytes);
  static int configured = 0;
  if (configured < smem) {
    LOWBIT_CUDA_CHECK(
        cudaFuncSetAttribute(attend_kernel<KF, VF>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = smem;
  }
  attend_kernel<KF, VF><<<grid, kThreads, smem, stream>>>(a);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

template <int KF>
void dispatch_v(int vf, const AttnArgs& a, dim3 grid, cudaStream_t stream) {
  switch (vf) {
    case kTq4:
      return launch_attend<KF, kTq4>(a, grid, stream);
    case kTq3:
      return launch_attend<KF, kTq3>(a, grid, stream);
    case kTq2:
      return launch_attend<KF, kTq2>(a, grid, stream);
    default:
      return launch_attend<KF, kFp16>(a, grid, stream);
  }
}

void dispatch(int kf, int vf, const AttnArgs& a, dim3 grid, cudaStream_t stream) {
  switch (kf) {
    case kTq4:
      return dispatch_v<kTq4>(vf, a, grid, stream);
    case kTq3:
      return dispatch_v<kTq3>(vf, a, grid, stream);
    case kTq2:
      return dispatch_v<kTq2>(vf, a, grid, stream);
    default:
      return dispatch_v<kFp16>(vf, a, grid, stream);
  }
}

int sm_count() {
  int device = 0, sms = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

void run_attention(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int prefill_row,
                   int64_t first_pos, int rows, int64_t max_length, int num_q_heads, const float* q, float* out,
                   AttentionWorkspace& ws, const DeviceDecodeOptions& options, cudaStream_t stream) {
  const KvCacheConfig& cfg = cache.config();
  const int H = cfg.num_kv_heads;
  LOWBIT_CHECK_ARG(num_q_heads >= H && num_q_heads % H == 0 && num_q_heads / H <= kDeviceMaxGroup, "num_q_heads",
                   num_q_heads,
                   "a multiple of num_kv_heads = " + std::to_string(H) + " with at most 16 query heads per KV head");
  LOWBIT_CHECK_ARG(q != nullptr && out != nullptr, "q/out", "null", "device pointers");
  LOWBIT_CHECK_ARG(rows >= 1 && rows <= 65535, "rows", rows, "1 to 65535 query rows per call");
  LOWBIT_CHECK_ARG(options.softmax_scale >= 0.0f, "softmax_scale", options.softmax_scale, "0 (default) or positive");
  LOWBIT_CHECK_ARG(options.split_tokens >= 0 && options.split_tokens % kTile == 0, "split_tokens",
                   options.split_tokens, "0 (auto) or a positive multiple of 16");
  const int group = num_q_heads / H;
  const int64_t split = options.split_tokens > 0 ? options.split_tokens
                                                 : decode_split_tokens(rows, H, max_length, sm_count());
  const int max_splits = static_cast<int>((max_length + split - 1) / split);
  LOWBIT_CHECK_ARG(max_splits <= 65535, "split_tokens", split, "at most 65535 chunks per row");
  const float scale = options.softmax_scale > 0.0f ? options.softmax_scale : 1.0f / std::sqrt(float{kD});

  const size_t q_floats = static_cast<size_t>(rows) * num_q_heads * kD;
  float* q_rot = ws.q_rotated(q_floats);
  const bool k_rot = is_quantized(cfg.k_format), v_rot = is_quantized(cfg.v_format);
  rotate_queries_kernel<<<dim3(rows, H), kD, 0, stream>>>(q, k_rot ? cache.rotation(layer) : nullptr, q_rot,
                                                          num_q_heads, group, scale * kLog2e);
  LOWBIT_CUDA_CHECK_LAUNCH();

  AttnArgs a{};
  const PageLayout& l = cache.layout();
  a.pool = cache.pool(layer);
  a.slab_bytes = l.bytes;
  a.k_rows = l.k_rows, a.k_scales = l.k_scales, a.v_rows = l.v_rows, a.v_scales = l.v_scales;
  a.scale_bytes = static_cast<int>(scale_dtype_bytes(cfg.scale_dtype));
  a.num_kv_heads = H, a.group = group, a.num_q_heads = num_q_heads, a.page_size = cfg.page_size;
  a.tables = tables.tables.as<const int32_t>();
  a.table_stride = tables.stride;
  a.lengths = tables.lengths.as<const int32_t>();
  a.prefill_row = prefill_row;
  a.first_pos = first_pos;
  a.q = q_rot;
  a.split_tokens = split;
  a.max_splits = max_splits;
  // One chunk: the partial has the output's layout, so the merge kernel
  // un-rotates in place and the workspace needs no copy of the output.
  a.part_out = max_splits == 1 ? out : ws.partial_out(q_floats * static_cast<size_t>(max_splits));
  a.part_lse = ws.partial_lse(static_cast<size_t>(rows) * num_q_heads * max_splits);
  for (KvPart part : {KvPart::key, KvPart::value}) {
    const VectorQuantizer* vq = cache.quantizer(part);
    float* dst = part == KvPart::key ? a.k_centroids : a.v_centroids;
    if (vq == nullptr) continue;
    const auto& c = vq->codebook().centroids_f32;
    for (size_t i = 0; i < c.size(); ++i) dst[i] = c[i];
  }
  dispatch(fmt_of(cfg.k_format), fmt_of(cfg.v_format), a, dim3(max_splits, H, rows), stream);
  merge_kernel<<<dim3(rows, H), kD, 0, stream>>>(a, v_rot ? cache.rotation_t(layer) : nullptr, out);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t decode_split_tokens(int rows, int num_kv_heads, int64_t max_length, int sm_count) {
  const int64_t target_ctas = 4 * int64_t{std::max(sm_count, 1)};
  const int64_t per_row = std::max<int64_t>(1, (target_ctas + int64_t{rows} * num_kv_heads - 1) /
                                                   (int64_t{rows} * num_kv_heads));
  int64_t chunk = (std::max<int64_t>(max_length, 1) + per_row - 1) / per_row;
  chunk = std::max<int64_t>(chunk, 128);
  return (chunk + kTile - 1) / kTile * kTile;
}

void device_decode_attention(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int num_q_heads,
                             const float* q, float* out, AttentionWorkspace& workspace,
                             const DeviceDecodeOptions& options, cudaStream_t stream) {
  for (int r = 0; r < tables.rows; ++r)
    LOWBIT_CHECK_ARG(tables.host_lengths[static_cast<size_t>(r)] >= 1, "tables.lengths[" + std::to_string(r) + "]",
                     tables.host_lengths[static_cast<size_t>(r)],
                     "at least 1 (write the current token before decode attends to it)");
  run_attention(cache, layer, tables, -1, 0, tables.rows, tables.max_length, num_q_heads, q, out, workspace, options,
                stream);
}

void device_prefill_attention(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int row,
                              int64_t first_pos, int64_t n_tokens, int num_q_heads, const float* q, float* out,
                              AttentionWorkspace& workspace, const DeviceDecodeOptions& options,
                              cudaStream_t stream) {
  LOWBIT_CHECK_ARG(row >= 0 && row < tables.rows, "row", row, "0 to rows - 1 = " + std::to_string(tables.rows - 1));
  LOWBIT_CHECK_ARG(n_tokens >= 1 && n_tokens <= 65535, "n_tokens", n_tokens, "1 to 65535");
  const int64_t len = tables.host_lengths[static_cast<size_t>(row)];
  LOWBIT_CHECK_ARG(first_pos >= 0 && first_pos + n_tokens <= len, "first_pos", first_pos,
                   "first_pos + n_tokens within the row's length " + std::to_string(len) + " (write the block first)");
  run_attention(cache, layer, tables, row, first_pos, static_cast<int>(n_tokens), first_pos + n_tokens, num_q_heads,
                q, out, workspace, options, stream);
}

}  // namespace lowbit::kv
