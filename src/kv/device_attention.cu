// Decode attention directly on the paged TurboQuant cache, and the entry
// points of both decode and causal prefill (whose tiled kernel is in
// prefill_attention.cu; with DeviceDecodeOptions::prefill_tiled = false a
// prefill runs this decode kernel, one row per query token, as it did before
// that kernel existed). Up to three kernels per call, chained with
// programmatic dependent launch (with a Hadamard rotation and rows of at
// most 8 chunks on sm_90, the second alone):
//  1. rotate_queries (quantized K only): q' = q @ M once per query head
//     (never a key un-rotation), times softmax_scale * log2(e) so the softmax
//     runs on exp2; for fp16 K the attention kernel applies that scale. With
//     a Hadamard rotation the attention CTAs rotate their group's queries
//     themselves (no kernel), and a caller may pass them rotated already
//     (DeviceDecodeOptions::queries_rotated).
//  2. attend<KF, VF, wide>: one CTA per (row, KV head, KV chunk), of 8 or 16
//     warps for packed K and V (TileLayout), 4 when either is fp16. At a
//     decode step it may also store each row's newest K/V first
//     (DeviceDecodeOptions::append_k: no append kernel before it).
//  3. merge: the exact log-sum-exp merge of the chunks (merge_heads, one
//     warp per query head, un-rotating a Hadamard-rotated V by its signs; or
//     merge_haar, out = o @ M^T once per output for a Haar-rotated V). Rows
//     of at most 8 chunks (sm_90, V not Haar-rotated) need no merge kernel:
//     the CTAs of a (row, KV head) run as a cluster and merge through
//     distributed shared memory with the same arithmetic (merge_in_cluster).
//
// Every kernel is a template on the head dimension D (64 or 128); a lane's
// share of a row, the k-steps and the m-tiles scale with it. The numbers
// below are for d = 128, the dimension it was tuned on.
//
// Why the attend kernel looks the way it does (bandwidth is the budget: at
// batch 8 / 32k the tq4 cache is 277 MB, 92 us at 3 TB/s):
//  - CUDA-core dequantization is the trap published int4 kernels fall into:
//    5 query heads x (128 multiply-adds for the score + 128 for the value)
//    per cached token is ~3e9 FMAs at batch 8 / 32k, more time than the
//    memory. So both products run on tensor cores (mma.m16n8k16, fp16 inputs,
//    fp32 accumulation). K (scores) and V^T (outputs) are the A operand, 16
//    tokens or 16 coordinates per row block; the <= 8 query heads sharing a
//    KV head are the n columns (GQA: a KV head's bytes are read once for all
//    of them, and no mma row is padding). Per token a lane only turns indices
//    into fp16 operands.
//  - Index -> operand: one shared-memory load per PAIR of coordinates. A
//    256-entry table maps a byte (two 4-bit indices) to the half2 of their
//    centroids; tq3 (6 bits per pair) and tq2 (4 bits) use 64- and 16-entry
//    tables. Random indices would hit random banks (~3.5-way conflicts), so
//    the table is replicated 32 times, entry e of lane l at word e*32 + l
//    (e*64 + l in the 16-warp layout, see warps_per_cta):
//    every lane reads its own bank (32 KB for tq4, shared by 8 warps).
//  - The k (reduction) order of an mma is free as long as A and B agree, so
//    a lane's K operand comes straight from one 16-byte load of its token's
//    row (tq4: coordinates 32c .. 32c+31 for lane%4 = c; the query fragment
//    is gathered with the same permutation). For V the reduction runs over
//    tokens: a lane needs the same coordinate of two tokens, so two tokens'
//    index words are merged with two shifts and two LOP3s into bytes that
//    index the same pair table. Output coordinates are permuted the same way
//    (16 * (lane/4) + 2 * tile (+1)) and put back in order at the end. The
//    score tile (tokens x heads) becomes the PV operand (heads x tokens) with
//    movmatrix.
//  - Scales are per token: K's multiplies the score after the mma, V's is
//    folded into the fp16 probability (p * s_v), the row sum uses p alone.
//  - Each warp streams its own 16-token tiles (a tile never crosses a page:
//    pages are multiples of 16) through a 3-stage cp.async ring, no
//    block-wide barriers in the loop. The warps' online softmax states are
//    merged once at the end. 128 registers, 16 warps per SM (2 CTAs of 8 or
//    one of 16).
//  - Split-KV (flash-decoding) cuts each row into chunks; decode_split_tokens
//    picks the count that fills the SMs in whole waves.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <utility>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device_attribute.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/kv/device_cache.h"
#include "lowbit/kv/append_warp.cuh"
#include "lowbit/kv/hadamard_warp.cuh"
#include "lowbit/kv/window_warp.cuh"
#include "attention_mma.cuh"
#include "prefill_attention.h"

namespace lowbit::kv {
namespace {

using namespace attention_mma;

float softmax_scale_of(const KvCacheConfig& cfg, const DeviceDecodeOptions& options) {
  return options.softmax_scale > 0.0f ? options.softmax_scale : 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
}

struct AttnArgs {
  const std::byte* pool;
  int64_t pool_bytes;  // DeviceDecodeOptions::l2_streaming: the layer's pool, else 0 (host side only)
  int64_t slab_bytes;
  int64_t k_rows, k_scales, v_rows, v_scales;  // slab offsets
  int scale_bytes;                             // 2 (f16) or 4 (f32)
  int num_kv_heads, group, num_q_heads, page_size;
  const int32_t* tables;
  int64_t table_stride;
  const int32_t* lengths;
  int prefill_row;  // -1: decode (row r = sequence r, length lengths[r]); else prefill of that row
  int64_t first_pos;
  const float* q;  // [rows][num_q_heads][d]: rotated and scaled when queries_rotated, else as given
  bool queries_rotated;  // q is rotated and scaled (quantized K): by the kernel just before, or by the caller
  // The kernel just before this one wrote each row's newest token (the
  // caller's kernel made q and appended the K/V, DeviceDecodeOptions::
  // queries_rotated): the chunk holding it is read only after the wait.
  // (Without such a contract nothing of the cache is read before the wait:
  // see issue_early.)
  bool newest_token_fresh;
  // Hadamard rotation, queries not rotated by the caller: each CTA rotates
  // its group's queries itself (signs and scale below) into shared memory at
  // q_stage_offset, instead of a rotation kernel before it.
  const float* q_signs;
  float q_rotate_scale;
  int q_stage_offset;
  float q_scale;         // applied to q here: 1, or softmax_scale * log2(e) when not rotated
  int64_t split_tokens;
  int max_splits;
  float* part_out;  // [rows][num_q_heads][max_splits][d]
  float* part_lse;  // [rows][num_q_heads][max_splits], log2 units
  float k_centroids[16], v_centroids[16];
  // DeviceDecodeOptions::cluster_merge: the CTAs of one (row, KV head) are a
  // cluster (one CTA per chunk), each leaves its chunk's result in its
  // shared memory at cluster_result_offset, and the cluster merges them
  // (merge_in_cluster) into out / out16, un-rotating by v_signs: no merge
  // kernel, no partials in global memory.
  bool cluster_merge;
  int cluster_result_offset;
  float* out;
  __half* out16;
  const float* v_signs;
  // DeviceDecodeOptions::append_k / append_v (null: the newest tokens are
  // in the cache already), where they go, and the shared memory where the
  // two appending warps keep their indices (D bytes each).
  const float* append_k;
  const float* append_v;
  KvAppendTarget append;
  int append_scratch_offset;
  // DeviceDecodeOptions::window (0: none): the code chunks cover positions
  // 0 .. len - window - 1 of a row (code_length), and the chunk after its
  // last code chunk is the window's, written by window_attend_kernel from
  // the rings (win_k, win_v: the layer's, [slots][num_kv_heads][capacity][d]
  // fp16) of the row's slot win_slots[table row]. With win_store_k/v it
  // first stores each row's newest K/V into them, rotated by win_rot_k/v.
  int window;
  int64_t window_capacity;
  __half* win_k;
  __half* win_v;
  const int32_t* win_slots;
  const float* win_store_k;
  const float* win_store_v;
  WindowRotation win_rot_k, win_rot_v;
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

// The positions of a row of length len that its code chunks cover, 0 ..
// code_length - 1: all of them, or those older than the window.
__device__ __forceinline__ int64_t code_length(const AttnArgs& a, int64_t len) {
  return a.window > 0 ? max(len - a.window, int64_t{0}) : len;
}

// The chunks the merge combines for a row of length len: its code chunks,
// then the window's (always at least one token: the query's own).
__device__ __forceinline__ int chunks_of_row(const AttnArgs& a, int64_t len) {
  // 32-bit (lengths and chunk lengths < 2^31, the host checks): the 64-bit
  // division was a call to a software routine on the merges' path.
  const uint32_t code = static_cast<uint32_t>(code_length(a, len)), split = static_cast<uint32_t>(a.split_tokens);
  return static_cast<int>((code + split - 1u) / split) + (a.window > 0 ? 1 : 0);
}

__device__ __forceinline__ uint32_t byte_of(uint32_t w, int k) { return (w >> (8 * k)) & 0xffu; }

// kItems consecutive 32-bit values (uint32_t words or floats; 1, 2 or 4) from
// an address aligned to 4 kItems bytes, as one load: a lane's share of a
// packed row is 16 bytes at d = 128 and 8 at d = 64, and the merges read a
// lane's 4 or 2 coordinates of a partial output at once.
template <int kItems, typename T>
__device__ __forceinline__ void load_consecutive(const T* p, T (&v)[kItems]) {
  static_assert(std::is_same_v<T, uint32_t> || std::is_same_v<T, float>, "uint32_t words or floats");
  static_assert(kItems == 1 || kItems == 2 || kItems == 4, "1, 2 or 4 values");
  constexpr bool kWords = std::is_same_v<T, uint32_t>;
  if constexpr (kItems == 4) {
    using Vec = std::conditional_t<kWords, uint4, float4>;
    const Vec x = *reinterpret_cast<const Vec*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else if constexpr (kItems == 2) {
    using Vec = std::conditional_t<kWords, uint2, float2>;
    const Vec x = *reinterpret_cast<const Vec*>(p);
    v[0] = x.x, v[1] = x.y;
  } else {
    v[0] = *p;
  }
}

// N consecutive index words of a packed row (load_consecutive).
template <int N>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[N]) {
  load_consecutive<N>(reinterpret_cast<const uint32_t*>(p), w);
}

// kBytes (1, 2 or 4) bytes from an address aligned to kBytes, zero-extended.
template <int kBytes>
__device__ __forceinline__ uint32_t load_bytes(const uint8_t* p) {
  if constexpr (kBytes == 4) return *reinterpret_cast<const uint32_t*>(p);
  else if constexpr (kBytes == 2) return *reinterpret_cast<const uint16_t*>(p);
  else return *p;
}

// Entry e of a lane's table: one PRMT (byte extract), one LEA, one LDS per
// pair of coordinates. `lane_table` is the 32-bit shared address of entry 0
// of this lane's copy; entries are 128 bytes apart. Written as asm because
// from C++ the compiler re-associates the address as ((e*32) | lane) * 4 +
// base: four instructions, two of them IMADs on the FMA pipe, which the
// profile showed as the limiter (math-pipe throttle).
__device__ __forceinline__ uint32_t table_entry(uint32_t lane_table, uint32_t word, int byte) {
  const uint32_t e = __byte_perm(word, 0u, 0x4440u | static_cast<uint32_t>(byte));
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(lane_table + (e << 7)));
  return v;
}

// The same with 256-byte entry rows (the 16-warp variants' 64 KB tables):
// one PRMT builds the whole offset, byte `byte` of the word times 256 plus
// the lane's word (lane4 = lane * 4 in its low byte), and the LDS adds the
// table's base: two instructions per pair instead of three.
__device__ __forceinline__ uint32_t table_entry_wide(uint32_t table, uint32_t lane4, uint32_t word, int byte) {
  const uint32_t off = __byte_perm(word, lane4, 0x5504u | (static_cast<uint32_t>(byte) << 4));
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(table + off));
  return v;
}

// A lane's lookup of byte `byte` of `word` in a table of kRowWords-word rows:
// `table` is the shared address of entry 0 of the lane's copy (32-word rows)
// or of the table (64-word rows).
template <int kRowWords>
__device__ __forceinline__ uint32_t lookup(uint32_t table, uint32_t lane4, uint32_t word, int byte) {
  if constexpr (kRowWords == 64) return table_entry_wide(table, lane4, word, byte);
  else return table_entry(table, word, byte);
}

// The score tile, transposed: acc[4] += K[16 tokens x D] . Q'^T[D x 8
// heads] (K is the A operand, so the 16 rows of the mma are 16 tokens and
// none is wasted on padding; the <= 8 query heads of the group are the n).
// The lane's A operand is decoded from row0 (a0, a2: token tile_row(g)) and
// row1 (a1, a3: that + 8); lane%4 = c owns coordinates (D/4)c .. (D/4)c + D/4 - 1 and
// k-step ks (D/16 of them) covers (D/4)c + 4ks .. +3 (the query fragment is
// gathered in the same order).
template <int KF, int kRowWords, int D>
__device__ __forceinline__ void score_tile(const uint8_t* row0, const uint8_t* row1, int c, const uint32_t* lut,
                                           uint32_t table, uint32_t lane4, const uint32_t (&qb)[D / 16][2],
                                           float (&acc)[4]) {
  constexpr int kSteps = D / 16;
  if constexpr (KF == kTq4) {
    constexpr int W = D / 32;  // the lane's D/4 indices: D/8 bytes
    uint32_t w0[W], w1[W];
    load_words<W>(row0 + 4 * W * c, w0);
    load_words<W>(row1 + 4 * W * c, w1);
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const int b = 2 * (ks & 1);
      mma16816(acc, lookup<kRowWords>(table, lane4, w0[ks >> 1], b), lookup<kRowWords>(table, lane4, w1[ks >> 1], b),
               lookup<kRowWords>(table, lane4, w0[ks >> 1], b + 1), lookup<kRowWords>(table, lane4, w1[ks >> 1], b + 1),
               qb[ks][0], qb[ks][1]);
    }
  } else if constexpr (KF == kTq2) {
    constexpr int W = D / 64;  // D/4 2-bit indices: D/16 bytes
    uint32_t w0[W], w1[W];
    load_words<W>(row0 + 4 * W * c, w0);
    load_words<W>(row1 + 4 * W * c, w1);
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const uint32_t b0 = byte_of(w0[ks >> 2], ks & 3), b1 = byte_of(w1[ks >> 2], ks & 3);
      mma16816(acc, lut[(b0 & 15u) * kRowWords], lut[(b1 & 15u) * kRowWords], lut[(b0 >> 4) * kRowWords],
               lut[(b1 >> 4) * kRowWords], qb[ks][0], qb[ks][1]);
    }
  } else if constexpr (KF == kTq3) {
    constexpr int W = D / 64;  // the low 2-bit plane as tq2, then the high-bit plane (D/8 bytes)
    uint32_t w0[W], w1[W];
    load_words<W>(row0 + 4 * W * c, w0);
    load_words<W>(row1 + 4 * W * c, w1);
    const uint32_t h0 = load_bytes<D / 32>(row0 + D / 4 + (D / 32) * c);
    const uint32_t h1 = load_bytes<D / 32>(row1 + D / 4 + (D / 32) * c);
    // Pair (coordinate u, u + 1) of a k-step as the 6-bit entry idx_u | idx_(u+1) << 3.
    auto entries = [](uint32_t lo, uint32_t hn, uint32_t& e01, uint32_t& e23) {
      const uint32_t i0 = (lo & 3u) | ((hn & 1u) << 2), i1 = ((lo >> 2) & 3u) | ((hn & 2u) << 1);
      const uint32_t i2 = ((lo >> 4) & 3u) | (hn & 4u), i3 = ((lo >> 6) & 3u) | ((hn >> 1) & 4u);
      e01 = i0 | (i1 << 3);
      e23 = i2 | (i3 << 3);
    };
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      uint32_t a01, a23, b01, b23;
      entries(byte_of(w0[ks >> 2], ks & 3), (h0 >> (4 * ks)) & 15u, a01, a23);
      entries(byte_of(w1[ks >> 2], ks & 3), (h1 >> (4 * ks)) & 15u, b01, b23);
      mma16816(acc, lut[a01 * kRowWords], lut[b01 * kRowWords], lut[a23 * kRowWords], lut[b23 * kRowWords], qb[ks][0],
               qb[ks][1]);
    }
  } else {  // fp16: coordinates (D/4)c + 4ks .. +3 are words 2ks, 2ks+1 of the lane's D/2 bytes
    const uint4* p0 = reinterpret_cast<const uint4*>(row0 + (D / 2) * c);
    const uint4* p1 = reinterpret_cast<const uint4*>(row1 + (D / 2) * c);
#pragma unroll
    for (int i = 0; i < D / 32; ++i) {
      const uint4 x = p0[i], y = p1[i];
      mma16816(acc, x.x, y.x, x.y, y.y, qb[2 * i][0], qb[2 * i][1]);
      mma16816(acc, x.z, y.z, x.w, y.w, qb[2 * i + 1][0], qb[2 * i + 1][1]);
    }
  }
}

// (x & mask) | (y & ~mask) as one LOP3: from C++ the compiler spent a third
// instruction per merged V index word (an AND, then the OR with its own AND).
__device__ __forceinline__ uint32_t select_bits(uint32_t mask, uint32_t x, uint32_t y) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xE2;\n" : "=r"(r) : "r"(x), "r"(mask), "r"(y));
  return r;
}

// The token of row i of a staged 16-token tile that is row i of the score
// mma (K as its A operand) and so k = i of the PV mma: pairs (2q, 2q + 1)
// swapped for odd q. A lane's PV operand then reads tokens rho(2c), rho(2c + 1),
// rho(2c + 8), rho(2c + 9), and the four lanes c of one 8-byte V load (tq4,
// d = 128: rows of 64 bytes, a bank group of 16 words per row) read rows of
// both parities: two shared-memory wavefronts per half warp instead of four
// (Nsight Compute, v33: those loads were 21% of the kernel's wavefronts as
// bank-conflict excess). The score rows' 16-byte K loads keep one row of each
// parity per quarter warp (rho(2q) and rho(2q + 1)): still conflict-free.
__device__ __forceinline__ int tile_row(int i) { return i ^ ((i >> 1) & 1); }
// rho of k = 2c, 2c + 1, 2c + 8, 2c + 9: the tokens of PV operand lane c.
__device__ __forceinline__ void tile_row_tokens(int c, int (&tok)[4]) {
  const int t = 2 * c + (c & 1);
  tok[0] = t, tok[1] = t ^ 1, tok[2] = t + 8, tok[3] = (t ^ 1) + 8;
}

// Where a tq4 V row (d = 128: 64 bytes, four 16-byte chunks) of a staged
// tile keeps its bytes: the two 32-byte halves swapped for tokens with bit 2
// set (byte j at j ^ 32). The 8-byte V index loads (value_tile) are served
// per half warp: lanes c = 0..3 of one half read rows rho(2c) (0, 3, 4, 7, or
// 1, 2, 5, 6 and the same + 8) at bytes 8g, g < 4 or g >= 4. tile_row already
// puts rows of both parities (bank halves) into each load; rows r and r + 4
// still shared their banks: two wavefronts per half warp where one does
// (Nsight Compute on fb10dae: 10% of the kernel's shared wavefronts were
// such excess). With the halves swapped, the four rows of a half warp cover
// the 32 banks once. The copy into the stage applies it per lane (a lane's
// two 16-byte pieces of V are one row's chunk and the row 8 below's, rows
// with the same bit 2, so one source offset per lane), the append that
// writes the newest token into a staged tile too; K rows keep the plain
// layout.
template <int VF, int D>
__host__ __device__ constexpr bool swizzled_v_rows() {
  return VF == kTq4 && D == 128;
}
template <int VF, int D>
__device__ __forceinline__ int stage_v_byte_xor(int token) {
  return swizzled_v_rows<VF, D>() ? (token & 4) << 3 : 0;
}
// The piece of a tile's V rows (16 bytes; piece l is row l / 4, chunk l % 4)
// that goes into stage slot l: chunk ^ 2 for rows with bit 2 set.
template <int VF, int D>
__device__ __forceinline__ int stage_v_piece_lane(int lane) {
  return swizzled_v_rows<VF, D>() ? lane ^ ((lane >> 3) & 2) : lane;
}

// O^T[D x 8 heads] += V^T[D x 16 tokens] . P'^T[16 tokens x 8 heads]:
// V^T is the A operand, D/16 m-tiles of 16 coordinates. The lane's A operand
// of m-tile mt is coordinate (D/8)g + 2mt (a0: k = 2c, 2c+1; a2: k = 2c+8,
// 2c+9, i.e. the tokens tile_row_tokens gives) and (D/8)g + 2mt + 1 (a1, a3): two tokens' index words are merged with
// shifts and LOP3s into bytes that index the same pair table as K. `valid`
// masks tokens past the chunk's end: their fp16 rows may hold anything
// (stale slots), and 0 * NaN would poison O.
template <int VF, int kRowWords, int D>
__device__ __forceinline__ void value_tile(const uint8_t* rows, int c, int g, const uint32_t* lut, uint32_t table,
                                           uint32_t lane4, const uint32_t (&pb)[2], const bool (&valid)[4],
                                           float (&o)[D / 16][4]) {
  int tok[4];
  tile_row_tokens(c, tok);
  constexpr int RB = row_bytes(VF, D), kMTiles = D / 16;
  if constexpr (VF == kTq4) {
    constexpr int W = D / 64;  // words of a token's D/8 coordinates (D/16 bytes)
    uint32_t lo[2][W], hi[2][W];  // [token pair][word]: byte k of lo/hi holds coordinate (D/8)g + 8w + 2k (+1)
    // The lane's bytes in each of its four rows: the four tokens rho(2c),
    // rho(2c + 1), rho(2c + 8), rho(2c + 9) have the same bit 2 (that of 2c),
    // so one offset serves them all (stage_v_byte_xor).
    const int byte0 = (4 * W * g) ^ stage_v_byte_xor<VF, D>(tok[0]);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      uint32_t aw[W], bw[W];
      load_words<W>(rows + tok[2 * p] * RB + byte0, aw);
      load_words<W>(rows + tok[2 * p + 1] * RB + byte0, bw);
#pragma unroll
      for (int w = 0; w < W; ++w) {
        lo[p][w] = select_bits(0x0F0F0F0Fu, aw[w], bw[w] << 4);
        hi[p][w] = select_bits(0x0F0F0F0Fu, aw[w] >> 4, bw[w]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int w = mt >> 2, k = mt & 3;
      mma16816(o[mt], lookup<kRowWords>(table, lane4, lo[0][w], k), lookup<kRowWords>(table, lane4, hi[0][w], k),
               lookup<kRowWords>(table, lane4, lo[1][w], k), lookup<kRowWords>(table, lane4, hi[1][w], k), pb[0], pb[1]);
    }
  } else if constexpr (VF == kTq2) {
    uint32_t x[2], y[2];  // nibble k: coordinate (D/8)g + 2k (x) and (D/8)g + 2k + 1 (y) of both tokens
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const uint32_t A = load_bytes<D / 32>(rows + tok[2 * p] * RB + (D / 32) * g);
      const uint32_t B = load_bytes<D / 32>(rows + tok[2 * p + 1] * RB + (D / 32) * g);
      x[p] = (A & 0x33333333u) | ((B & 0x33333333u) << 2);
      y[p] = ((A >> 2) & 0x33333333u) | (B & 0xCCCCCCCCu);
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      mma16816(o[mt], lut[((x[0] >> (4 * mt)) & 15u) * kRowWords], lut[((y[0] >> (4 * mt)) & 15u) * kRowWords],
               lut[((x[1] >> (4 * mt)) & 15u) * kRowWords], lut[((y[1] >> (4 * mt)) & 15u) * kRowWords], pb[0], pb[1]);
  } else if constexpr (VF == kTq3) {
    uint32_t lw[4], hw[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      lw[t] = load_bytes<D / 32>(rows + tok[t] * RB + (D / 32) * g);
      hw[t] = load_bytes<D / 64>(rows + tok[t] * RB + D / 4 + (D / 64) * g);
    }
    auto entry = [&](int t0, int m) {  // tokens t0, t0 + 1 at coordinate (D/8)g + m
      const uint32_t i0 = ((lw[t0] >> (2 * m)) & 3u) | (((hw[t0] >> m) & 1u) << 2);
      const uint32_t i1 = ((lw[t0 + 1] >> (2 * m)) & 3u) | (((hw[t0 + 1] >> m) & 1u) << 2);
      return (i0 | (i1 << 3)) * kRowWords;
    };
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      mma16816(o[mt], lut[entry(0, 2 * mt)], lut[entry(0, 2 * mt + 1)], lut[entry(2, 2 * mt)],
               lut[entry(2, 2 * mt + 1)], pb[0], pb[1]);
  } else {  // fp16: coordinates (D/8)g .. +D/8-1 are D/16 words of each token's row; word mt = coordinates 2mt, 2mt+1
    uint32_t w[4][kMTiles];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint4* p = reinterpret_cast<const uint4*>(rows + tok[t] * RB + (D / 4) * g);
      const uint32_t m = valid[t] ? 0xffffffffu : 0u;
#pragma unroll
      for (int i = 0; i < kMTiles / 4; ++i) {
        const uint4 v = p[i];
        w[t][4 * i] = v.x & m, w[t][4 * i + 1] = v.y & m, w[t][4 * i + 2] = v.z & m, w[t][4 * i + 3] = v.w & m;
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      mma16816(o[mt], __byte_perm(w[0][mt], w[1][mt], 0x5410u), __byte_perm(w[0][mt], w[1][mt], 0x7632u),
               __byte_perm(w[2][mt], w[3][mt], 0x5410u), __byte_perm(w[2][mt], w[3][mt], 0x7632u), pb[0], pb[1]);
  }
}

// The 8 x 8 fp16 transpose of a fragment across the warp (ldmatrix's layout):
// the score accumulator holds (row g, heads 2c, 2c+1); the PV mma wants
// (k = rows 2c, 2c+1, head g).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// fp16 tiles are 4-8 KB: 4 warps, 2 CTAs per SM fit. Packed tiles are ~2 KB,
// in one of two layouts:
//  - narrow: 8 warps, 2 CTAs per SM, sharing one copy of the tables in
//    128-byte rows (32 KB for tq4);
//  - wide: 16 warps, one CTA per SM, the tables in 256-byte rows (64 KB for
//    tq4, half of it unused) so that a lookup's address is one PRMT
//    (table_entry_wide): 420 instructions per tq4 tile instead of 502. It
//    pays on long streams (batch 8 / 32k 127 -> 123 us, batch 1 / 32k 38 ->
//    36 us) and costs on short ones (batch 1 / 4k 20.8 -> 23.7 us: twice the
//    table to fill, 16 warps to merge), so plan_decode picks it by the work.
__host__ __device__ constexpr bool packed_pair(int kf, int vf, int d) {
  return (row_bytes(kf, d) + row_bytes(vf, d)) * kTile < 4096;
}
__host__ __device__ constexpr int warps_per_cta(int kf, int vf, bool wide, int d) {
  return !packed_pair(kf, vf, d) ? 4 : wide ? 16 : 8;
}

template <int KF, int VF, bool kWide, int D>
struct TileLayout {
  static constexpr int KR = row_bytes(KF, D), VR = row_bytes(VF, D);
  static constexpr int kWarps = warps_per_cta(KF, VF, kWide, D);
  static constexpr int kCtasPerSm = kWarps == 16 ? 1 : 2;
  static constexpr int kRowWords = kWarps == 16 ? 64 : 32;  // words per table entry row
  // Ring stages per warp. A fourth for the packed layouts (v33: 6.5 KB of
  // K/V in flight per warp instead of 4.3) and the score mma split into two
  // dependent chains of 4 measured no faster on an H200 (batch 8 / 32k
  // 96.8-97.2 us against 96.9-97.1, batch 1 / 32k 25.3-25.8 against 24.7-24.9).
  static constexpr int kStages = 3;
  // A stage: K rows, V rows, then room for 16 fp32 scales of each quantized
  // part (f16 scales use half of it): fixed offsets whatever the scale width.
  static constexpr int kKScaleOffset = kTile * (KR + VR);
  static constexpr int kVScaleOffset = kKScaleOffset + (quantized(KF) ? kTile * 4 : 0);
  static constexpr int kStageBytes = kVScaleOffset + (quantized(VF) ? kTile * 4 : 0);
};

// One 16-byte cp.async from src + kSrcOffset to the shared address
// dst + kDstOffset, both offsets immediates of the instruction: the pieces
// of a tile then share one 64-bit source address per lane.
template <int kDstOffset, int kSrcOffset>
__device__ __forceinline__ void cp_async16_at(uint32_t dst, const std::byte* src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%3], 16;\n" ::"r"(dst), "l"(src), "n"(kDstOffset),
               "n"(kSrcOffset));
}

// A warp copies kBytes (a multiple of 16) to the shared address
// lane_dst - 16 lane + kDstOffset in 16-byte pieces, lane l taking pieces
// l, l + 32, ...: lane_dst and lane_src are the lane's first piece. A fixed
// count per lane, so the copies unroll into straight-line cp.async.
template <int kPieces, int kDstOffset, int... I>
__device__ __forceinline__ void copy_piece_rounds(uint32_t lane_dst, const std::byte* lane_src, int lane,
                                                  std::integer_sequence<int, I...>) {
  ((kPieces % 32 == 0 || 32 * I + lane < kPieces ? cp_async16_at<kDstOffset + 512 * I, 512 * I>(lane_dst, lane_src)
                                                  : void()),
   ...);
}
template <int kBytes, int kDstOffset>
__device__ __forceinline__ void copy_pieces(uint32_t lane_dst, const std::byte* lane_src, int lane) {
  static_assert(kBytes % 16 == 0, "16-byte pieces");
  constexpr int kPieces = kBytes / 16;
  copy_piece_rounds<kPieces, kDstOffset>(lane_dst, lane_src, lane,
                                         std::make_integer_sequence<int, (kPieces + 31) / 32>{});
}

// The warps' merge at the end of attend_kernel: each warp leaves its
// accumulators in shared memory as rows of one head, and every thread then
// sums one output coordinate over the warps. A lane holds coordinates
// (D/8)g + 2mt (+1) of heads 2c and 2c+1, so with plain rows of D floats the
// 32 lanes of a store hit 2 banks (D = 128; 4 at D = 64): 16-way conflicts
// on 32 stores per lane, which made this merge 5-6 us of a 16-warp CTA
// (per-CTA timer stamps, batch 1 and 8 at 32k; 3 us with 8 warps), longer
// than a batch-1 / 1k call's whole K/V stream. Stored as float2 pairs with
// 2 floats of padding after every 32 coordinates and rows of kMergeRow
// floats, the stores of a half-warp cover distinct banks (D = 128; 2-way at
// D = 64) and the readers' 32 consecutive coordinates of one head still
// cover 32 banks.
__host__ __device__ constexpr int merge_slot(int coordinate) { return coordinate + 2 * (coordinate >> 5); }
template <int D>
constexpr int kMergeRow = D + 2 * (D / 32) + 2;

// The chunks' exact log-sum-exp merge (the CPU reference's formula, in log2
// units): out[row][qh] = sum_c 2^(lse_c - M) o_c / sum_c 2^(lse_c - M).
// One pass over the chunks in order 0, 1, ... with a running maximum: a
// block of kMergeUnroll chunks costs one round trip for both its
// log-sum-exps and its partial outputs (independent loads). The first
// version walked the chunks one L2 round trip per chunk and thread (~19 us
// for 32 chunks at batch 1); the second took the maxima in a pass of its
// own, with the log-sum-exps through shared memory: three more dependent
// round trips and four barriers before the first sum.
constexpr int kMergeUnroll = 16;

// Merges the partials of kItems coordinates of one query head into
// merged[k]: load_block(s0, lse, v) fetches the log-sum-exps and the
// coordinates' partial outputs of chunks s0 .. s0 + kUnroll - 1, those
// past the row's last chunk (n_chunks) as copies of that chunk, replaced here
// by -inf and 0. The same operations in the same order for every caller, so
// both merge kernels and merge_in_cluster give the same bits (the chunks
// past the last add zeros).
template <int kItems, int kUnroll = kMergeUnroll, typename LoadBlock>
__device__ __forceinline__ void merge_chunks(int n_chunks, LoadBlock&& load_block, float (&merged)[kItems]) {
  float running_max = -INFINITY, total = 0.0f, acc[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) acc[k] = 0.0f;
  for (int s0 = 0; s0 < n_chunks; s0 += kUnroll) {
    float lse[kUnroll], v[kUnroll][kItems];
    load_block(s0, lse, v);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool in = s0 + u < n_chunks;
      lse[u] = in ? lse[u] : -INFINITY;
#pragma unroll
      for (int k = 0; k < kItems; ++k) v[u][k] = in ? v[u][k] : 0.0f;
    }
    float block_max = running_max;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) block_max = fmaxf(block_max, lse[u]);
    // Every chunk has a token, so its log-sum-exp is finite: block_max is
    // too, and the first block's rescale is 2^-inf = 0.
    const float rescale = exp2f(running_max - block_max);
    total *= rescale;
#pragma unroll
    for (int k = 0; k < kItems; ++k) acc[k] *= rescale;
    running_max = block_max;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float w = exp2f(lse[u] - block_max);  // 0 past the last chunk
      total += w;
#pragma unroll
      for (int k = 0; k < kItems; ++k) acc[k] = fmaf(w, v[u][k], acc[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) merged[k] = acc[k] / total;
}

// At most this many chunks per row are merged inside a cluster (the
// portable cluster size); longer rows take the merge kernel.
constexpr int kMaxClusterChunks = 8;

// DeviceDecodeOptions::cluster_merge, after every CTA of the cluster left its
// chunk's result in its shared memory (`results`: [kDeviceMaxGroup][D], then
// the log-sum-exps [kDeviceMaxGroup]): the merge kernel's arithmetic, with
// the partials read through distributed shared memory instead of global
// memory. Each query head of the group is merged by one warp of one CTA
// (head = rank + ranks * warp), which then un-rotates it by the signs and
// stores it, so the bits are the merge kernel's. Every CTA of the cluster
// calls this, those whose chunk is past their row's end too: they take
// part in both cluster barriers and may own a head.
template <int D>
__device__ void merge_in_cluster(const AttnArgs& a, int r, int h, int64_t len, float* results, int warps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every chunk's result is in its CTA's shared memory
  const int ranks = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_chunks = chunks_of_row(a, len);
  float* lse_of = results + kDeviceMaxGroup * D;
  float lane_signs[D / 32];
  if (a.v_signs != nullptr) load_lane_signs<D>(a.v_signs, lane_signs);
  // The second barrier keeps every CTA alive while another reads its shared
  // memory. A cluster barrier's arrive with release semantics is a
  // MEMBAR.ALL.GPU first (SASS), which waits for the CTA's outstanding global
  // stores: after the output stores it took 1057 cycles at batch 8 / 32k (v36
  // cycle stamps). A warp arrives once its last remote read has returned,
  // before its stores, and waits at exit.
  bool arrived = false;
  for (int head = rank + ranks * warp; head < a.group; head += ranks * warps) {
    // Every rank's log-sum-exp and outputs in one round trip: ranks past
    // the row's last chunk read that chunk again (merge_chunks masks them).
    // Loaded one chunk after another (a loop that stopped at the last
    // chunk), this took 1.3-1.5 us of a batch-1 / 1k call (timer stamps).
    float v[D / 32];
    merge_chunks<D / 32, kMaxClusterChunks>(
        n_chunks,
        [&](int, float (&lse)[kMaxClusterChunks], float (&x)[kMaxClusterChunks][D / 32]) {
#pragma unroll
          for (int u = 0; u < kMaxClusterChunks; ++u) {
            // Only the row's chunks are read (merge_chunks masks the rest):
            // with two chunks, 40 loads per lane through distributed shared
            // memory were 10 of the row's and 30 copies.
            const bool in = u < n_chunks;
            const int from = min(u, n_chunks - 1);
            lse[u] = in ? *cluster.map_shared_rank(lse_of + head, from) : -INFINITY;
            const float* remote = cluster.map_shared_rank(results + head * D, from);
#pragma unroll
            for (int k = 0; k < D / 32; ++k) x[u][k] = in ? remote[lane + 32 * k] : 0.0f;
          }
        },
        v);
    if (head + ranks * warps >= a.group) {  // the warp's last head (warp-uniform)
      asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
      arrived = true;
    }
    if (a.v_signs != nullptr) hadamard_unrotate_warp<D>(v, lane_signs);
    const int64_t out_base = (static_cast<int64_t>(r) * a.num_q_heads + h * a.group + head) * D;
#pragma unroll
    for (int k = 0; k < D / 32; ++k) {
      if (a.out16 != nullptr) a.out16[out_base + lane + 32 * k] = __float2half_rn(v[k]);
      else a.out[out_base + lane + 32 * k] = v[k];
    }
  }
  if (!arrived) asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // no CTA exits while another reads its shared memory
#endif
}

template <int KF, int VF, bool kWide, int D>
__global__ void __launch_bounds__(TileLayout<KF, VF, kWide, D>::kWarps * 32, TileLayout<KF, VF, kWide, D>::kCtasPerSm)
    attend_kernel(AttnArgs a) {
  using L = TileLayout<KF, VF, kWide, D>;
  constexpr int KR = L::KR, VR = L::VR, S = L::kStages, kWarps = L::kWarps, kThreads = 32 * kWarps;
  extern __shared__ float4 smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_f4);
  // The thread index through an opaque read: from threadIdx.x, the compiler
  // rebuilt lane- and warp-derived addresses inside the K/V loop at every
  // tile (v36: a change in the kernel's tail moved the tq4 loop from 374 to
  // 400 SASS instructions that way). Behind a volatile asm the index is a
  // value it cannot re-read, so it keeps what it derives from it: the tq4
  // wide loop 371 -> 363 instructions, our FP16 kernel's 345 -> 327, the
  // tq4 8-warp loop 464 -> 427 (tools/sass/kernel_loops.py).
  uint32_t tid_x;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid_x));
  const int warp = static_cast<int>(tid_x / 32), lane = static_cast<int>(tid_x % 32);
  // Each lane reads its own copy of the tables: entry e at word
  // e * kRowWords + lane.
  constexpr int kRowWords = L::kRowWords;
  const uint32_t* lut_k = reinterpret_cast<const uint32_t*>(smem) + lane;
  const uint32_t* lut_v = (VF == KF) ? lut_k : lut_k + lut_entries(KF) * kRowWords;
  uint8_t* stages = smem + 4 * kRowWords * (lut_entries(KF) + (VF == KF ? 0 : lut_entries(VF)));
  // The tq4 lookups' addresses: the lane's copy (128-byte rows), or the table
  // and the lane's word offset (256-byte rows, table_entry_wide).
  const uint32_t lane4 = 4u * static_cast<uint32_t>(lane);
  const uint32_t table_k = static_cast<uint32_t>(__cvta_generic_to_shared(kRowWords == 64 ? lut_k - lane : lut_k));
  const uint32_t table_v = static_cast<uint32_t>(__cvta_generic_to_shared(kRowWords == 64 ? lut_v - lane : lut_v));

  const int split = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
  int table_row;
  int64_t len;
  row_of(a, r, table_row, len);
  // 32-bit token arithmetic (lengths < 2^31): 64-bit divisions are software
  // routines of ~100 instructions, which the per-tile page lookup paid.
  const int t0 = split * static_cast<int>(a.split_tokens);
  // The prologue keeps the DRAM round trips of a standalone call side by
  // side (v35). Until then the row's length was waited for before the wait
  // for the previous kernel, the first page-table entry was requested only
  // once the length was known, and the queries only after the wait: per-CTA
  // timer stamps put the loop's start at 6.4-9.0 us after the call's start
  // at batch 1 and 8 / 32k, now at 4.9-5.4 us (calls at 4k tokens: 2-3%
  // faster; at 32k the stream is the same and so is the time within 1%).
  //
  // The warp's first tile, its page and that page's number, requested
  // before the length is consumed: clamped to the row's table, so a chunk
  // or warp without tiles reads an entry of its own row and leaves it unused.
  const int tiles_per_page = a.page_size / kTile;
  const int first = t0 / kTile + warp;
  const int first_page = first / tiles_per_page;
  const int row_entry0 = table_row * static_cast<int>(a.table_stride);
  int issue_page = a.tables[row_entry0 + min(first_page, static_cast<int>(a.table_stride) - 1)];
  // Queries rotated in this CTA and no append (issue_early below is then
  // false: nothing of the cache is read before the wait): the wait comes
  // first, and the queries are requested right after it, while the length
  // and the page number are still on their way. Only the instances with
  // quantized K carry the in-CTA rotation's code (kRotates): code present
  // in a kernel changes its register allocation even where it does not run
  // (docs/w4a16-gemm.md, the gemv kernel's instances).
  constexpr bool kRotates = quantized(KF);
  const bool rotate_here = kRotates && a.q_signs != nullptr;
  float lane_signs[D / 32];
  if constexpr (kRotates)
    if (rotate_here) load_lane_signs<D>(a.q_signs, lane_signs);  // constant: before any wait
  const bool wait_at_entry = rotate_here && a.append_k == nullptr;
  constexpr int kHeadsPerWarp = (kDeviceMaxGroup + kWarps - 1) / kWarps;
  float q_head[kHeadsPerWarp][D / 32];
  auto load_queries_to_rotate = [&] {
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      const int w = warp + kWarps * i;
      if (w >= a.group) break;
      const float* src = a.q + ((static_cast<int64_t>(r) * a.num_q_heads + h * a.group) + w) * D;
#pragma unroll
      for (int u = 0; u < D / 32; ++u) q_head[i][u] = src[lane + 32 * u];
    }
  };
  uint32_t* lut_fill = reinterpret_cast<uint32_t*>(smem);
  auto fill_tables = [&] {
    if (quantized(KF)) fill_lut<kRowWords>(lut_fill, KF, a.k_centroids);
    if (quantized(VF) && VF != KF) fill_lut<kRowWords>(lut_fill + lut_entries(KF) * kRowWords, VF, a.v_centroids);
  };
  if (wait_at_entry) {  // the tables are filled while the queries are on their way
    cuda::pdl_wait();
    load_queries_to_rotate();
    fill_tables();
  }
  const int64_t code_len = code_length(a, len);
  if (t0 >= code_len) {  // this row has fewer chunks; the merge reads only its own
    if (a.cluster_merge) {
      cuda::pdl_launch_dependents();
      cuda::pdl_wait();  // before its stores of the output
      merge_in_cluster<D>(a, r, h, len, reinterpret_cast<float*>(stages + a.cluster_result_offset), kWarps);
    } else if (a.window > 0) {
      // With a window every row may be shorter than it (the first tokens of
      // a sequence): then every CTA exits here, and the grid must still
      // complete after the window kernel before it, whose chunk the merge
      // kernel after this grid reads.
      cuda::pdl_wait();
    }
    return;
  }
  const int t1 = static_cast<int>(min(code_len, int64_t{t0} + a.split_tokens));

  const int g = lane >> 2, c = lane & 3;
  const int sb = a.scale_bytes;
  uint8_t* my_stages = stages + warp * S * L::kStageBytes;

  const int tile_begin = t0 / kTile, tile_end = (t1 + kTile - 1) / kTile;
  const int n_my = first < tile_end ? (tile_end - first + kWarps - 1) / kWarps : 0;

  // The staging side of the ring. Its first version spent ~150 of the loop's
  // ~650 instructions per tile here: a division for the page, a modulo for
  // the stage, and copy loops the compiler could not unroll (their trip
  // count depended on the lane and on the runtime scale width). Then the
  // page and slot advanced by kWarps tiles without dividing, the next page
  // number was loaded one issue ahead (its latency no longer stalls the
  // copies), and every copy was a fixed number of 16-byte pieces per lane;
  // still ~108 of the tq4 wide loop's ~420 SASS instructions were this
  // staging (v33): the 64-bit products page * stride and row * table
  // stride, and a 64-bit address per piece, rebuilt on every issue. Now a
  // page's slabs of all KV heads span less than 2^31 bytes (the host
  // checks), so a tile's source is one IMAD.WIDE per page plus 32-bit
  // offsets, the pieces of a tile share one 64-bit address per lane (the
  // piece offsets are immediates of cp.async), the page table is indexed
  // from its start, and the destination is a 32-bit shared address.
  const uint32_t slab_bytes = static_cast<uint32_t>(a.slab_bytes);
  const uint32_t page_stride = static_cast<uint32_t>(a.num_kv_heads) * slab_bytes;
  const uint32_t head_lane = static_cast<uint32_t>(h) * slab_bytes + 16u * lane;  // + the tile's offset in the slab
  // V's pieces: lane l fetches the piece that belongs in its stage slot l
  // (stage_v_piece_lane: the same slot permutation, an involution).
  const uint32_t head_lane_v = static_cast<uint32_t>(h) * slab_bytes + static_cast<uint32_t>(a.v_rows) +
                               16u * static_cast<uint32_t>(stage_v_piece_lane<VF, D>(lane));
  int issue_entry = row_entry0 + first_page;  // into a.tables
  int issue_tile_in_page = first - first_page * tiles_per_page;
  int issue_stage = 0, issued = 0;
  const uint32_t lane_stages = static_cast<uint32_t>(__cvta_generic_to_shared(my_stages)) + 16u * lane;
  // The scales (kTile * sb = 32 or 64 bytes of each quantized part): lanes
  // 0-3 copy K's, lanes 8-11 V's, one predicated copy per lane with its
  // offsets in registers (two copies, each with its own predicate and
  // offsets from the constant bank, were ~14 instructions per issue).
  const bool k_scale_lane = quantized(KF) && 16 * lane < kTile * sb;
  const bool scale_lane = k_scale_lane || (quantized(VF) && lane >= 8 && 16 * (lane - 8) < kTile * sb);
  const uint32_t scale_src = k_scale_lane ? head_lane + static_cast<uint32_t>(a.k_scales)
                                          : head_lane + static_cast<uint32_t>(a.v_scales) - 128u;
  const uint32_t scale_dst = k_scale_lane ? L::kKScaleOffset : L::kVScaleOffset - 128u;
  auto issue = [&]() {
    const std::byte* page = a.pool + static_cast<uint64_t>(static_cast<uint32_t>(issue_page)) * page_stride;
    const uint32_t slot = static_cast<uint32_t>(issue_tile_in_page) * kTile;
    const uint32_t dst = lane_stages + static_cast<uint32_t>(issue_stage) * L::kStageBytes;
    copy_pieces<kTile * KR, 0>(dst, page + (head_lane + static_cast<uint32_t>(a.k_rows) + slot * KR), lane);
    copy_pieces<kTile * VR, kTile * KR>(dst, page + (head_lane_v + slot * VR), lane);
    if (scale_lane) cp_async16_at<0, 0>(dst + scale_dst, page + (scale_src + slot * sb));
    issue_stage = issue_stage == S - 1 ? 0 : issue_stage + 1;
    ++issued;
    issue_tile_in_page += kWarps;
    while (issue_tile_in_page >= tiles_per_page) issue_tile_in_page -= tiles_per_page, ++issue_entry;
    if (issued < n_my) issue_page = a.tables[issue_entry];
  };
  // The first tiles of the ring are requested before the wait for the
  // previous kernel when the pages they read are complete already:
  //  - the queries come rotated from the rotation kernel (Haar), which
  //    waited for whatever kernel wrote the K/V before it triggered this one;
  //  - or from the caller, who may have appended each row's newest token
  //    just before (DeviceDecodeOptions::queries_rotated): then every chunk
  //    but the row's last;
  //  - or this call appends the newest tokens itself (append_k): every page
  //    is complete but for the newest token's slot, which its CTA overwrites
  //    in the ring below.
  // Otherwise nothing of the cache is read before the wait: fp16 K (no
  // rotation kernel) and queries rotated in this CTA (Hadamard, no rotation
  // kernel either). The kernel before may then be any writer still running
  // (they let their dependents launch at their start): a device_write_tokens
  // of a prefill block, or of a whole prompt before a decode call. Up to v21
  // the 8-warp layout requested its first tiles early with Hadamard queries
  // too, and read slots such a write had not stored yet (test
  // KvDevice.AttentionReadsTheCacheOnlyAfterTheKernelBeforeItCompletes); the
  // early tiles had saved 0.4-0.8 us of a standalone call at 1k-4k tokens.
  const bool appends_newest = a.append_k != nullptr && t1 == len;
  const bool issue_early =
      a.append_k != nullptr || (a.queries_rotated && !rotate_here && !(a.newest_token_fresh && t1 == len));
  // With append_k, the CTA holding the row's newest token stores it: warp 0
  // its K, warp 1 its V, with the append kernel's bytes. What that needs
  // besides the vector (codebook, signs, the row's page) is loaded before
  // the wait; the vector, made by the kernel before this one, after it.
  KvAppendPlan plan{};
  if (appends_newest && warp < 2) {
    plan = append_plan_begin<D>(a.append, warp, r, h);
    append_plan_slot(a.append, plan);
  }
  if (issue_early) {
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
      if (i < n_my) issue();
      cp_async_commit();
    }
  }
  if (!wait_at_entry) {
    fill_tables();
    cuda::pdl_wait();
  }
  if (appends_newest) {
    float x[D / 32];
    float scale = 0.0f;
    uint8_t* scratch = smem + a.append_scratch_offset + warp * D;
    if (warp < 2) {
      const float* src = (warp == 0 ? a.append_k : a.append_v) + (static_cast<int64_t>(r) * a.num_kv_heads + h) * D;
#pragma unroll
      for (int u = 0; u < D / 32; ++u) x[u] = src[lane + 32 * u];
      append_vector_warp<D>(a.append, plan, x, scratch, &scale);
    }
    // The newest token's tile may be in the ring already, requested before
    // the wait with the slot's old bytes: once every warp's first tiles have
    // landed, the warp that quantized the token writes it into that stage
    // too. (A tile requested later reads the cache after the barrier.) The
    // DRAM round trip of this CTA's first tiles then overlaps the wait and
    // the quantization, instead of following them.
    cp_async_wait<0>();
    __syncthreads();
    if (warp < 2) {
      const int newest = static_cast<int>(len - 1), rel = newest / kTile - tile_begin;
      const int owner = rel % kWarps, i = rel / kWarps, slot = newest % kTile;
      if (i < S - 1) {
        uint8_t* st = stages + (owner * S + i) * L::kStageBytes;
        const bool key = warp == 0;
        store_vector_warp<D>(a.append, plan, x, scratch, scale, st + (key ? slot * KR : kTile * KR + slot * VR),
                             reinterpret_cast<std::byte*>(st + (key ? L::kKScaleOffset : L::kVScaleOffset) + slot * sb),
                             key ? 0 : stage_v_byte_xor<VF, D>(slot));
      }
    }
    __syncthreads();
  }
  // The queries are requested before the tiles that are not in flight yet:
  // behind them (8.6 MB of first tiles over a batch-1 / 32k grid), the query
  // loads took ~5 us from the wait to the loop's start (timer stamps).
  // Column g of the score mma's B fragment is query head h*group + g (zero
  // past the group), rows in the K operand's coordinate order; with the
  // rotation here, warp w rotates heads w, w + kWarps, ... first.
  const float* qrow = a.q + ((static_cast<int64_t>(r) * a.num_q_heads + h * a.group) + g) * D;
  float4 q_frag[D / 16];
  if (rotate_here) {
    if (!wait_at_entry) load_queries_to_rotate();
  } else {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      q_frag[ks] = g < a.group ? *reinterpret_cast<const float4*>(qrow + (D / 4) * c + 4 * ks)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (!issue_early) {
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
      if (i < n_my) issue();
      cp_async_commit();
    }
  }

  uint32_t qb[D / 16][2];
  if (rotate_here) {
    // The group's queries rotated here, one warp per head (hadamard_warp.cuh,
    // the rotation kernel's arithmetic): with the d signs instead of a 64 KB
    // matrix, this costs less than the launch of a kernel before this one.
    float* staged = reinterpret_cast<float*>(smem + a.q_stage_offset);
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      const int w = warp + kWarps * i;
      if (w >= a.group) break;
      hadamard_rotate_warp<D>(q_head[i], lane_signs, a.q_rotate_scale);
#pragma unroll
      for (int u = 0; u < D / 32; ++u) staged[w * D + lane + 32 * u] = q_head[i][u];
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      q_frag[ks] = g < a.group ? *reinterpret_cast<const float4*>(staged + g * D + (D / 4) * c + 4 * ks)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    qb[ks][0] = pack_half2(q_frag[ks].x * a.q_scale, q_frag[ks].y * a.q_scale);
    qb[ks][1] = pack_half2(q_frag[ks].z * a.q_scale, q_frag[ks].w * a.q_scale);
  }
  __syncthreads();  // tables filled

  // O^T accumulators: m-tile mt, c0/c1 = heads 2c, 2c+1 at coordinate
  // (D/8)g + 2mt, c2/c3 = the same heads at (D/8)g + 2mt + 1.
  constexpr int kMTiles = D / 16;
  float o[kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // heads 2c, 2c+1

  // The tokens of the lane's score rows (rg, rg + 8) and of its PV operand
  // (tile_row_tokens).
  const int rg = tile_row(g);
  int vt[4];
  tile_row_tokens(c, vt);
  int stage = 0;
  for (int i = 0; i < n_my; ++i) {
    if (i + S - 1 < n_my) issue();
    cp_async_commit();
    cp_async_wait<S - 1>();
    __syncwarp();
    const uint8_t* st = my_stages + stage * L::kStageBytes;
    stage = stage == S - 1 ? 0 : stage + 1;
    const int tok0 = (first + kWarps * i) * kTile;

    // s[0], s[1]: token rg, heads 2c, 2c+1; s[2], s[3]: token rg + 8.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    score_tile<KF, kRowWords, D>(st + rg * KR, st + (rg + 8) * KR, c, lut_k, table_k, lane4, qb, s);
    const bool valid0 = tok0 + rg < t1, valid1 = tok0 + rg + 8 < t1;
    float ks0 = 1.0f, ks1 = 1.0f, vs0 = 1.0f, vs1 = 1.0f;
    if constexpr (quantized(KF)) {
      ks0 = sb == 2 ? __half2float(reinterpret_cast<const __half*>(st + L::kKScaleOffset)[rg])
                    : reinterpret_cast<const float*>(st + L::kKScaleOffset)[rg];
      ks1 = sb == 2 ? __half2float(reinterpret_cast<const __half*>(st + L::kKScaleOffset)[rg + 8])
                    : reinterpret_cast<const float*>(st + L::kKScaleOffset)[rg + 8];
    }
    if constexpr (quantized(VF)) {
      vs0 = sb == 2 ? __half2float(reinterpret_cast<const __half*>(st + L::kVScaleOffset)[rg])
                    : reinterpret_cast<const float*>(st + L::kVScaleOffset)[rg];
      vs1 = sb == 2 ? __half2float(reinterpret_cast<const __half*>(st + L::kVScaleOffset)[rg + 8])
                    : reinterpret_cast<const float*>(st + L::kVScaleOffset)[rg + 8];
    }
    s[0] = valid0 ? s[0] * ks0 : -INFINITY;
    s[1] = valid0 ? s[1] * ks0 : -INFINITY;
    s[2] = valid1 ? s[2] * ks1 : -INFINITY;
    s[3] = valid1 ? s[3] * ks1 : -INFINITY;
    // The running max of each head moves only when some score of the tile
    // exceeds it, which after the first tiles is rare (~ln(tiles) of a
    // warp's tiles on random data). Only then the max over the 16 tokens of
    // each head (the 8 lanes with the same c: three dependent shuffle rounds,
    // v33's Nsight Compute profile put ~6% of the warps' stall samples on
    // them at batch 8 / 32k), the correction alpha and the rescale of O.
    // Otherwise the new max is the old one and alpha is 1: the same bits as
    // taking the max every tile.
    float alpha0 = 1.0f, alpha1 = 1.0f;
    if (__any_sync(0xffffffffu, fmaxf(s[0], s[2]) > m0 || fmaxf(s[1], s[3]) > m1)) {
      float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
      const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
      alpha0 = fast_exp2(m0 - n0), alpha1 = fast_exp2(m1 - n1);
      m0 = n0, m1 = n1;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        o[mt][0] *= alpha0, o[mt][1] *= alpha1;
        o[mt][2] *= alpha0, o[mt][3] *= alpha1;
      }
    }
    const float p0 = fast_exp2(s[0] - m0), p1 = fast_exp2(s[1] - m1), p2 = fast_exp2(s[2] - m0),
                p3 = fast_exp2(s[3] - m1);
    l0 = l0 * alpha0 + (p0 + p2);
    l1 = l1 * alpha1 + (p1 + p3);
    // B of the PV mma: p * s_v as fp16 (0 for masked tokens, whose scale may
    // be garbage), transposed to (rows 2c, 2c+1 | 2c+8, 2c+9; head g).
    const uint32_t pb[2] = {transpose8x8(pack_half2(valid0 ? p0 * vs0 : 0.0f, valid0 ? p1 * vs0 : 0.0f)),
                            transpose8x8(pack_half2(valid1 ? p2 * vs1 : 0.0f, valid1 ? p3 * vs1 : 0.0f))};
    const bool vvalid[4] = {tok0 + vt[0] < t1, tok0 + vt[1] < t1, tok0 + vt[2] < t1, tok0 + vt[3] < t1};
    value_tile<VF, kRowWords, D>(st + kTile * KR, c, g, lut_v, table_v, lane4, pb, vvalid, o);
    __syncwarp();  // the stage is refilled by the next iteration's issue
  }
  cp_async_wait<0>();
  // The next kernel may launch; it waits for this grid to finish. With the
  // merge kernel next, right away. With the merge in a cluster, at exit
  // (no call): the o GEMM that follows in a decode step then no longer
  // requests its first weights while this grid merges (the cluster merge's
  // loads from the other CTAs took 2.8 us there, per-CTA timer stamps), and
  // Qwen3-14B's batch 1 / 3 / 4 steps ran 0.7-1.3% faster, batch 2 within
  // its spread (docs/engine.md, v29).
  if (!a.cluster_merge) cuda::pdl_launch_dependents();
  __syncthreads();

  // Merge the warps' states: [warp][8 heads][kMergeRow<D>] outputs (the
  // padded layout of merge_slot), then m and l.
  float* mo = reinterpret_cast<float*>(stages);
  float* mm = mo + kWarps * 8 * kMergeRow<D>;
  float* ml = mm + kWarps * 8;
#pragma unroll
  for (int off = 4; off < 32; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  if (g == 0) {
    mm[warp * 8 + 2 * c] = m0, ml[warp * 8 + 2 * c] = l0;
    mm[warp * 8 + 2 * c + 1] = m1, ml[warp * 8 + 2 * c + 1] = l1;
  }
  float* base = mo + warp * 8 * kMergeRow<D>;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const int x = merge_slot((D / 8) * g + 2 * mt);  // even: x + 1 is coordinate + 1
    *reinterpret_cast<float2*>(base + (2 * c) * kMergeRow<D> + x) = make_float2(o[mt][0], o[mt][2]);
    *reinterpret_cast<float2*>(base + (2 * c + 1) * kMergeRow<D> + x) = make_float2(o[mt][1], o[mt][3]);
  }
  __syncthreads();
  // Per head: the maximum of the warps' running maxima, each warp's weight
  // exp2(m_w - M) in place of m_w (-1 for a warp without tiles), the total
  // in place of warp 0's l, and the chunk's log-sum-exp. Every output element
  // then needs only its warps' weighted sum: computed per element, the
  // maximum and the weights made this merge 1.4-1.9 us of a batch-1 step's
  // attention (per-CTA timer stamps). The order of each sum is fixed, so
  // every path that merges a layout's chunks gets the same bits.
  const int64_t row_head0 = static_cast<int64_t>(r) * a.num_q_heads + h * a.group;
  // A second opaque read for the tail: with the loop's lane and warp used
  // here, the tq4 wide loop took 392 instructions instead of 363.
  uint32_t tail_tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tail_tid));
  auto store_lse = [&](int head, float lse) {
    if (a.cluster_merge)
      reinterpret_cast<float*>(stages + a.cluster_result_offset)[kDeviceMaxGroup * D + head] = lse;
    else
      a.part_lse[(row_head0 + head) * a.max_splits + split] = lse;
  };
  if constexpr (kWarps >= 8) {
    // One warp per head, lane w holding warp w's state, reduced by a
    // butterfly over the kWarps lanes. One thread per head walking 16 warps
    // took ~1650 cycles with the states' stores and barrier (v36 cycle
    // stamps). The 4-warp layouts keep that walk: their 5 heads would take
    // two rounds of butterflies (our FP16 kernel 0.5 us slower at batch 1 /
    // 4k).
    for (int head = static_cast<int>(tail_tid / 32); head < a.group; head += kWarps) {
      const int lane = static_cast<int>(tail_tid % 32);
      const float mw = lane < kWarps ? mm[lane * 8 + head] : -INFINITY;
      float M = mw;
#pragma unroll
      for (int off = kWarps / 2; off > 0; off /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
      const bool has_tiles = mw != -INFINITY;
      const float f = has_tiles ? exp2f(mw - M) : 0.0f;
      float total = has_tiles ? f * ml[lane * 8 + head] : 0.0f;
#pragma unroll
      for (int off = kWarps / 2; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
      if (lane < kWarps) mm[lane * 8 + head] = has_tiles ? f : -1.0f;
      if (lane == 0) {
        ml[head] = total;
        store_lse(head, M + log2f(total));
      }
    }
  } else if (tail_tid < static_cast<uint32_t>(a.group)) {
    const int head = static_cast<int>(tail_tid);
    float M = -INFINITY;
    for (int w2 = 0; w2 < kWarps; ++w2) M = fmaxf(M, mm[w2 * 8 + head]);
    float total = 0.0f;
    for (int w2 = 0; w2 < kWarps; ++w2) {
      const float mw = mm[w2 * 8 + head];
      if (mw == -INFINITY) {  // a warp without tiles
        mm[w2 * 8 + head] = -1.0f;
        continue;
      }
      const float f = exp2f(mw - M);
      total += f * ml[w2 * 8 + head];
      mm[w2 * 8 + head] = f;
    }
    ml[head] = total;
    store_lse(head, M + log2f(total));
  }
  __syncthreads();
  // Two adjacent coordinates per thread (merge_slot keeps an even
  // coordinate's pair adjacent): the group's 640 outputs at d = 128 in one
  // round of the CTA's 512 threads instead of two. Each element's sum over
  // the warps is in the same order as one element per thread: the same bits.
  for (int t = static_cast<int>(tail_tid); t < a.group * (D / 2); t += kThreads) {
    const int head = t / (D / 2), j = 2 * (t % (D / 2));
    float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int w2 = 0; w2 < kWarps; ++w2) {
      const float f = mm[w2 * 8 + head];
      if (f < 0.0f) continue;  // a warp without tiles
      const float2 o2 = *reinterpret_cast<const float2*>(mo + (w2 * 8 + head) * kMergeRow<D> + merge_slot(j));
      acc.x += f * o2.x;
      acc.y += f * o2.y;
    }
    const float total = ml[head];
    const float2 out = make_float2(acc.x / total, acc.y / total);
    if (a.cluster_merge)
      *reinterpret_cast<float2*>(reinterpret_cast<float*>(stages + a.cluster_result_offset) + head * D + j) = out;
    else
      *reinterpret_cast<float2*>(a.part_out + ((row_head0 + head) * a.max_splits + split) * D + j) = out;
  }
  if (a.cluster_merge)
    merge_in_cluster<D>(a, r, h, len, reinterpret_cast<float*>(stages + a.cluster_result_offset), kWarps);
}

// The dense D x D products of the two small kernels (q @ M, o @ M^T) are
// split over 4 x D threads: thread (part, j) sums the D/4 terms i in
// [(D/4) part, (D/4)(part + 1)) for column j with its matrix entries loaded
// at once. With one thread per column doing all D terms, the loads of M
// (cold after the K/V stream has gone through L2) were 128 dependent round
// trips at d = 128: ~90 us at batch 1.
template <int D>
constexpr int kRotThreads = 4 * D;

// This thread's D/4 entries of mat (rows (D/4) part .., column j): loaded
// apart from small_matmul so the kernels can issue them (the matrix is
// constant) before waiting for the previous kernel.
template <int D>
__device__ __forceinline__ void load_matrix_slice(const float* mat, float (&m)[D / 4]) {
  const int j = threadIdx.x % D, part = threadIdx.x / D;
#pragma unroll
  for (int i = 0; i < D / 4; ++i) m[i] = mat[((D / 4) * part + i) * D + j];
}

// out[g][j] = sum_i in[g][i] * mat[i][j] for g < group, through red (4
// partial sums); m is this thread's load_matrix_slice of mat.
template <int D>
__device__ __forceinline__ void small_matmul(const float (*in)[D], const float (&m)[D / 4], int group,
                                             float (*red)[kDeviceMaxGroup][D]) {
  const int j = threadIdx.x % D, part = threadIdx.x / D;
  for (int g = 0; g < group; ++g) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 4; ++i) acc = fmaf(in[g][(D / 4) * part + i], m[i], acc);
    red[part][g][j] = acc;
  }
}

// q' = (q @ M) * scale_log2 for quantized K, one CTA per
// (row, KV head): M is read once for the whole group.
template <int D>
__global__ void __launch_bounds__(kRotThreads<D>) rotate_queries_kernel(const float* q, const float* m, float* out,
                                                                        int num_q_heads, int group, float scale_log2) {
  // The rotation is constant: its loads go out before waiting.
  float mslice[D / 4];
  load_matrix_slice<D>(m, mslice);
  // Launched with PDL itself: q is the previous kernel's output. The K/V
  // pages the attention kernel prefetches before its own wait were written by
  // the append kernel before that one, complete once this wait returns.
  cuda::pdl_wait();
  // The attention kernel may start now: it prefetches K/V and builds its
  // tables, then waits for this grid's writes before reading the queries.
  cuda::pdl_launch_dependents();
  __shared__ float qs[kDeviceMaxGroup][D];
  __shared__ float red[4][kDeviceMaxGroup][D];
  const int r = blockIdx.x, h = blockIdx.y;
  const int64_t base = (static_cast<int64_t>(r) * num_q_heads + h * group) * D;
  for (int t = threadIdx.x; t < group * D; t += kRotThreads<D>) qs[t / D][t % D] = q[base + t];
  __syncthreads();
  small_matmul<D>(qs, mslice, group, red);
  __syncthreads();
  for (int t = threadIdx.x; t < group * D; t += kRotThreads<D>) {
    const int g = t / D, j = t % D;
    out[base + t] = ((red[0][g][j] + red[1][g][j]) + (red[2][g][j] + red[3][g][j])) * scale_log2;
  }
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}

// The merge when V needs no dense un-rotation (V unrotated, or rotated by a
// Hadamard transform: kHadamard, by its signs): one warp per query head.
// Each block of kMergeUnroll chunks comes into the warp's shared memory by
// cp.async, one round trip for all its loads: per-CTA timer stamps of a
// batch-1 / 32k call had the kernel before this one (one CTA per (row, KV
// head), global loads that ptxas interleaved with the sums waiting for
// them) at ~3 us from its wait to its sums. Lane l merges coordinates
// (D/32) l + k, then takes l + 32u, the layout of hadamard_unrotate_warp.
// In place when part_out == out (one chunk): every load of a warp's head
// precedes its stores. part_out is 16-byte aligned (run_attention).
constexpr int kMergeWarps = 4;
template <int D, bool kHadamard>
__global__ void __launch_bounds__(32 * kMergeWarps) merge_heads_kernel(AttnArgs a, const float* signs, float* out,
                                                                        __half* out16) {
  float lane_signs[D / 32];  // constant: requested before waiting
  if constexpr (kHadamard) load_lane_signs<D>(signs, lane_signs);
  // The row's length too: the caller's, which attend_kernel also reads
  // before its wait. Read after the wait, it was one more round trip ahead
  // of the partials' copies.
  const int r = blockIdx.x;
  int table_row;
  int64_t len;
  row_of(a, r, table_row, len);
  const int n_chunks = chunks_of_row(a, len);  // before the wait too: a division
  cuda::pdl_wait();
  // The next kernel (the engine's o projection, a W4A16 GEMM) is launched
  // now and requests its first weights while this one merges: without the
  // trigger it started only when this grid had ended, with its pipeline empty.
  cuda::pdl_launch_dependents();
  __shared__ __align__(16) float staged_out[kMergeWarps][kMergeUnroll][D];
  __shared__ float staged_lse[kMergeWarps][kMergeUnroll];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int qh = blockIdx.y * kMergeWarps + warp;
  if (qh >= a.num_q_heads) return;
  const int64_t head = static_cast<int64_t>(r) * a.num_q_heads + qh;
  constexpr int kVec = D / 32;
  float (*so)[D] = staged_out[warp];
  float* sl = staged_lse[warp];
  auto load_block = [&](int s0, float (&lse)[kMergeUnroll], float (&v)[kMergeUnroll][kVec]) {
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int64_t chunk = head * a.max_splits + min(s0 + u, n_chunks - 1);
      if (4 * lane < D) cp_async16(&so[u][4 * lane], a.part_out + chunk * D + 4 * lane);
      if (lane == u) cp_async4(&sl[u], a.part_lse + chunk);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      lse[u] = sl[u];
      load_consecutive<kVec>(&so[u][kVec * lane], v[u]);
    }
    __syncwarp();  // read before the next block's copies land
  };
  float merged[kVec];
  merge_chunks<kVec>(n_chunks, load_block, merged);
#pragma unroll
  for (int k = 0; k < kVec; ++k) so[0][kVec * lane + k] = merged[k];
  __syncwarp();
  float v[D / 32];
#pragma unroll
  for (int u = 0; u < D / 32; ++u) v[u] = so[0][lane + 32 * u];
  if constexpr (kHadamard) hadamard_unrotate_warp<D>(v, lane_signs);
#pragma unroll
  for (int k = 0; k < D / 32; ++k) {
    if (out16 != nullptr) out16[head * D + lane + 32 * k] = __float2half_rn(v[k]);
    else out[head * D + lane + 32 * k] = v[k];
  }
}

// The merge then out = o @ M^T for a Haar-rotated V (mt), one CTA per (row,
// KV head): M^T is read once for the whole group. In place when part_out ==
// out (one chunk).
template <int D>
__global__ void __launch_bounds__(kRotThreads<D>) merge_haar_kernel(AttnArgs a, const float* mt, float* out,
                                                                    __half* out16) {
  float mslice[D / 4];  // the constant un-rotation, requested before waiting
  load_matrix_slice<D>(mt, mslice);
  const int r = blockIdx.x, h = blockIdx.y;
  int table_row;
  int64_t len;
  row_of(a, r, table_row, len);  // before the wait, as in merge_heads_kernel
  const int n_chunks = chunks_of_row(a, len);
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();  // as in merge_heads_kernel
  __shared__ float ys[kDeviceMaxGroup][D];
  __shared__ float red[4][kDeviceMaxGroup][D];
  constexpr int kItems = kDeviceMaxGroup * D / kRotThreads<D>;
  const int64_t head0 = static_cast<int64_t>(r) * a.num_q_heads + h * a.group;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int t = threadIdx.x + k * kRotThreads<D>;
    if (t >= a.group * D) break;
    const int64_t row0 = (head0 + t / D) * a.max_splits;
    float merged[1];
    merge_chunks<1>(
        n_chunks,
        [&](int s0, float (&lse)[kMergeUnroll], float (&v)[kMergeUnroll][1]) {
#pragma unroll
          for (int u = 0; u < kMergeUnroll; ++u) {
            const int64_t chunk = row0 + min(s0 + u, n_chunks - 1);
            lse[u] = a.part_lse[chunk];
            v[u][0] = a.part_out[chunk * D + t % D];
          }
        },
        merged);
    ys[t / D][t % D] = merged[0];
  }
  __syncthreads();
  small_matmul<D>(ys, mslice, a.group, red);
  __syncthreads();
  for (int t = threadIdx.x; t < a.group * D; t += kRotThreads<D>) {
    const int g = t / D, j = t % D;
    const float y = (red[0][g][j] + red[1][g][j]) + (red[2][g][j] + red[3][g][j]);
    if (out16 != nullptr) out16[head0 * D + t] = __float2half_rn(y);
    else out[head0 * D + t] = y;
  }
}

// DeviceDecodeOptions::window: the positions code_length .. len - 1 of each
// row, read from the fp16 rings, as the row's last chunk for the merge
// kernel. One CTA per (row, KV head): one warp per query head of the group
// (at least two: warps 0 and 1 store a decode step's newest K and V copies),
// and with append_k two more that quantize the newest K and V into the
// cache's pages meanwhile (the code chunks never read that position in this
// call, so nothing waits for those stores but the next step).
// Its own kernel, not a few more CTAs of attend_kernel: that kernel's
// registers and instruction count were tuned to its code loop, and code
// present in it costs the loop even where it does not run (docs/kv-cache.md,
// v21 and v26). It runs before the code chunks, so the whole of it is on a
// decode step's critical path: its loads are issued early (the queries
// before the newest copies are stored, each pass's K and V rows together).
// The window is short (tens to hundreds of positions), so this is CUDA-core
// arithmetic in fp32 on the fp16 copies: per pass of 32 positions, each
// lane scores one position against the query in shared memory, the warp
// takes the pass's maximum and sum, and each lane then sums its D/32 output
// coordinates over the pass's values. The query is the one the code chunks
// score (rotated and scaled the same way), kept in fp32.
constexpr int kWindowPass = 32;
__host__ __device__ constexpr int window_head_warps(int group) { return group > 2 ? group : 2; }
template <int D>
__global__ void __launch_bounds__(32 * (kDeviceMaxGroup + 2)) window_attend_kernel(AttnArgs a) {
  __shared__ __align__(16) float q_stage[kDeviceMaxGroup][D];
  __shared__ float p_stage[kDeviceMaxGroup][kWindowPass];
  __shared__ float store_stage[2][D];
  __shared__ uint8_t append_scratch[2][D];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int r = blockIdx.x, h = blockIdx.y;
  const int head_warps = window_head_warps(a.group);
  const int64_t kv_row = (static_cast<int64_t>(r) * a.num_kv_heads + h) * D;
  if (warp >= head_warps) {  // append_k: warp head_warps quantizes K, the next one V
    const int part = warp - head_warps;
    KvAppendPlan plan = append_plan_begin<D>(a.append, part, r, h);
    append_plan_slot(a.append, plan);
    cuda::pdl_wait();  // the newest K/V come from an earlier kernel
    const float* src = (part == 0 ? a.append_k : a.append_v) + kv_row;
    float x[D / 32];
#pragma unroll
    for (int u = 0; u < D / 32; ++u) x[u] = src[lane + 32 * u];
    append_vector_warp<D>(a.append, plan, x, append_scratch[part]);
    return;
  }
  float lane_signs[D / 32];  // constant: before the wait
  if (a.q_signs != nullptr) load_lane_signs<D>(a.q_signs, lane_signs);
  cuda::pdl_wait();  // the queries, the newest K/V and the rings come from earlier kernels
  cuda::pdl_launch_dependents();
  int table_row;
  int64_t len;
  row_of(a, r, table_row, len);
  const int64_t head = static_cast<int64_t>(r) * a.num_q_heads + h * a.group + warp;
  float q[D / 32];
  if (warp < a.group) {
#pragma unroll
    for (int u = 0; u < D / 32; ++u) q[u] = a.q[head * D + lane + 32 * u];
  }
  const int cap = static_cast<int>(a.window_capacity);
  const int64_t ring = (static_cast<int64_t>(a.win_slots[table_row]) * a.num_kv_heads + h) * cap;
  const __half* ring_k = a.win_k + ring * D;
  const __half* ring_v = a.win_v + ring * D;
  if (a.win_store_k != nullptr) {  // a decode step: the row's newest K/V first
    if (warp < 2) {
      const float* src = (warp == 0 ? a.win_store_k : a.win_store_v) + kv_row;
      float x[D / 32];
#pragma unroll
      for (int u = 0; u < D / 32; ++u) x[u] = src[lane + 32 * u];
      __half* dst = (warp == 0 ? a.win_k : a.win_v) + (ring + static_cast<int>((len - 1) % cap)) * D;
      store_window_vector_warp<D>(x, warp == 0 ? a.win_rot_k : a.win_rot_v, store_stage[warp], dst);
    }
    // The head warps only (the appending warps do not wait for this): the
    // stores are visible to their reads below.
    asm volatile("bar.sync 1, %0;\n" ::"r"(32 * head_warps) : "memory");
  }
  if (warp >= a.group) return;
  if (a.q_signs != nullptr) hadamard_rotate_warp<D>(q, lane_signs, a.q_rotate_scale);
#pragma unroll
  for (int u = 0; u < D / 32; ++u) q_stage[warp][lane + 32 * u] = q[u] * a.q_scale;
  __syncwarp();
  const float4* qv = reinterpret_cast<const float4*>(q_stage[warp]);
  // Lane l sums output coordinates (D/32) l .. (D/32) l + D/32 - 1: one load
  // of D/16 bytes per V row.
  constexpr int kPer = D / 32;
  float m = -INFINITY, l = 0.0f, o[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) o[u] = 0.0f;
  const int last = static_cast<int>(len);
  for (int t0 = static_cast<int>(code_length(a, len)); t0 < last; t0 += kWindowPass) {
    // The pass's loads, all issued before the first sum: lane j's K row, and
    // the lane's coordinates of every V row (a loop with one dependent load
    // per row made this kernel ~20 us of a Qwen3-14B layer's decode step).
    // Positions past the window's end read its last row again; they get
    // score -inf and p = 0.
    const int count = min(kWindowPass, last - t0);
    uint4 krow[D / 8];
    const uint4* kr = reinterpret_cast<const uint4*>(ring_k + static_cast<int64_t>((t0 + min(lane, count - 1)) % cap) * D);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) krow[i] = kr[i];
    uint32_t raw[kWindowPass][kPer / 2];
#pragma unroll
    for (int j = 0; j < kWindowPass; ++j) {
      const __half* vr = ring_v + static_cast<int64_t>((t0 + min(j, count - 1)) % cap) * D + kPer * lane;
      load_consecutive<kPer / 2>(reinterpret_cast<const uint32_t*>(vr), raw[j]);
    }
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const float4 qa = qv[2 * i], qb = qv[2 * i + 1];
      const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&krow[i].x));
      const float2 k1 = __half22float2(*reinterpret_cast<const __half2*>(&krow[i].y));
      const float2 k2 = __half22float2(*reinterpret_cast<const __half2*>(&krow[i].z));
      const float2 k3 = __half22float2(*reinterpret_cast<const __half2*>(&krow[i].w));
      acc = fmaf(qa.x, k0.x, acc), acc = fmaf(qa.y, k0.y, acc), acc = fmaf(qa.z, k1.x, acc);
      acc = fmaf(qa.w, k1.y, acc), acc = fmaf(qb.x, k2.x, acc), acc = fmaf(qb.y, k2.y, acc);
      acc = fmaf(qb.z, k3.x, acc), acc = fmaf(qb.w, k3.y, acc);
    }
    const float s = lane < count ? acc : -INFINITY;
    float mx = s;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float n = fmaxf(m, mx);  // finite: lane 0's position is in the window
    const float alpha = exp2f(m - n);
    const float p = lane < count ? exp2f(s - n) : 0.0f;
    float sum = p;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    l = l * alpha + sum;
    m = n;
    p_stage[warp][lane] = p;
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kPer; ++u) o[u] *= alpha;
#pragma unroll
    for (int j = 0; j < kWindowPass; ++j) {
      const float pj = p_stage[warp][j];
#pragma unroll
      for (int w = 0; w < kPer / 2; ++w) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&raw[j][w]));
        o[2 * w] = fmaf(pj, v.x, o[2 * w]);
        o[2 * w + 1] = fmaf(pj, v.y, o[2 * w + 1]);
      }
    }
    __syncwarp();  // p_stage is rewritten by the next pass
  }
  const int64_t chunk = head * a.max_splits + (chunks_of_row(a, len) - 1);
#pragma unroll
  for (int u = 0; u < kPer; ++u) a.part_out[chunk * D + kPer * lane + u] = o[u] / l;
  if (lane == 0) a.part_lse[chunk] = m + log2f(l);
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

// The shared memory of an attend_kernel launch and the arguments with its
// offsets filled in.
struct AttendLaunch {
  AttnArgs args;
  int smem;
};

template <int KF, int VF, bool kWide, int D>
AttendLaunch attend_launch(const AttnArgs& a) {
  using L = TileLayout<KF, VF, kWide, D>;
  const int lut_bytes = 4 * L::kRowWords * (lut_entries(KF) + (VF == KF ? 0 : lut_entries(VF)));
  // The epilogue's region: the warps' outputs, then their m and l.
  const int merge_bytes = 4 * (L::kWarps * 8 * kMergeRow<D> + 2 * L::kWarps * 8);
  // With cluster_merge, the chunk's result after those (merge_in_cluster).
  const int cluster_bytes = a.cluster_merge ? 4 * kDeviceMaxGroup * (D + 1) : 0;
  AttendLaunch l{a, lut_bytes + std::max(L::kWarps * L::kStages * L::kStageBytes, merge_bytes + cluster_bytes)};
  l.args.cluster_result_offset = merge_bytes;
  if (a.q_signs != nullptr) {  // the rotated queries of the group after everything else
    l.args.q_stage_offset = l.smem;
    l.smem += 4 * kDeviceMaxGroup * D;
  }
  if (a.append_k != nullptr) {  // the appending warps' indices (append_warp.cuh) after those
    l.args.append_scratch_offset = l.smem;
    l.smem += 2 * D;
  }
  return l;
}

template <int KF, int VF, bool kWide, int D>
void launch_attend(const AttnArgs& a, dim3 grid, cudaStream_t stream) {
  using L = TileLayout<KF, VF, kWide, D>;
  const AttendLaunch l = attend_launch<KF, VF, kWide, D>(a);
  cuda::ensure_dynamic_smem(attend_kernel<KF, VF, kWide, D>, l.smem);
  cuda::launch_with_pdl_in_clusters(attend_kernel<KF, VF, kWide, D>, a.cluster_merge ? static_cast<int>(grid.x) : 0,
                                    cuda::L2StreamSpan{a.pool, static_cast<size_t>(a.pool_bytes)}, grid,
                                    dim3(32 * L::kWarps), static_cast<size_t>(l.smem), stream, l.args);
}

// How many clusters of `cluster` CTAs of this instance, launched with
// cluster_merge as `a` asks, the current device holds at once
// (cudaOccupancyMaxActiveClusters; cached per device, cluster size and shared
// memory: the engine plans a call per layer and step).
template <int KF, int VF, bool kWide, int D>
int attend_clusters_resident(const AttnArgs& a, int cluster) {
  using L = TileLayout<KF, VF, kWide, D>;
  const AttendLaunch l = attend_launch<KF, VF, kWide, D>(a);
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, cluster, l.smem);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  cuda::ensure_dynamic_smem(attend_kernel<KF, VF, kWide, D>, l.smem);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(cluster));
  config.blockDim = dim3(32 * L::kWarps);
  config.dynamicSmemBytes = static_cast<size_t>(l.smem);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, attend_kernel<KF, VF, kWide, D>, &config));
  cache.emplace(key, clusters);
  return clusters;
}

// with_attend_instance: f.template operator()<KF, VF, kWide>() for the
// attend_kernel instance of these formats and layout (with_format: g's
// instance for one row format). The launches (dispatch) and the cluster
// occupancy queries (run_attention) take the same instances. The wide layout
// is built for d = 128 only (plan_decode never picks it at d = 64): it pays
// on long streams of Qwen3-sized heads, and each layout is 16 more kernels
// to compile.
template <typename G>
decltype(auto) with_format(int f, G&& g) {
  switch (f) {
    case kTq4:
      return g.template operator()<kTq4>();
    case kTq3:
      return g.template operator()<kTq3>();
    case kTq2:
      return g.template operator()<kTq2>();
    default:
      return g.template operator()<kFp16>();
  }
}

template <int D, typename F>
decltype(auto) with_attend_instance(int kf, int vf, bool wide, F&& f) {
  return with_format(kf, [&]<int KF>() -> decltype(auto) {
    return with_format(vf, [&]<int VF>() -> decltype(auto) {
      if constexpr (D == 128 && packed_pair(KF, VF, D)) {
        if (wide) return f.template operator()<KF, VF, true>();
      }
      return f.template operator()<KF, VF, false>();
    });
  });
}

template <int D>
void dispatch(int kf, int vf, bool wide, const AttnArgs& a, dim3 grid, cudaStream_t stream) {
  with_attend_instance<D>(kf, vf, wide,
                          [&]<int KF, int VF, bool kWide>() { launch_attend<KF, VF, kWide, D>(a, grid, stream); });
}

// Whether the current device launches clusters (sm_90 and later).
bool clusters_available() {
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  return cuda::device_attribute(cudaDevAttrClusterLaunch, device) != 0;
}

int sm_count() {
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  return cuda::device_attribute(cudaDevAttrMultiProcessorCount, device);
}

// The chunk length and the CTA layout of a call (see decode_split_tokens).
struct DecodePlan {
  int64_t split_tokens = 0;
  bool wide = false;  // packed K and V in 16-warp CTAs (TileLayout)
};

DecodePlan plan_decode(const KvCacheConfig& config, int rows, int64_t max_length, int sm_count, int forced_warps) {
  DecodePlan plan;
  const int kf = fmt_of(config.k_format), vf = fmt_of(config.v_format);
  const int64_t sms = std::max(sm_count, 1);
  // Every CTA of a call has about the same work, so the time is (waves) x (tiles per CTA +
  // a CTA's fixed cost): a partial last wave costs a whole wave (576 CTAs on
  // 264 slots ran 3 waves of which the last was 18% full). Pick the split
  // count with the least cost among those that give each warp at least 4
  // tiles, or give at most one CTA per two SMs: a CTA's fixed cost (its
  // tables, the wait for the queries, the warps' merge, one more chunk for
  // the merge kernel) is worth several tiles. Measured with `lowbit bench
  // attention --split-tokens` (tq4 / fp16, us): batch 1 / 4k 26.0 / 25.4 with
  // one tile per warp (the first rule), 20.8 / 21.3 with 4; batch 1 / 1k
  // 18.3 / 16.1 with 64 CTAs of one tile per warp, 24.3 / 27.1 with 16 of 4.
  // Chunks longer than a page are whole pages: 1008-token chunks at batch 1
  // / 32k took 38.8 us, 1024-token ones 36.6 us.
  // A wave is 2 CTAs per SM for the 8-warp (packed, narrow) layout, 1 for
  // the wide one, and 1 for the 4-warp (fp16) one although two fit: two fp16
  // CTAs on one SM stream no faster than one (batch 1 / 32k: 128 CTAs of
  // 2048 tokens 67.5 us, 256 of 1024 71.0 us; narrow tq4 the other way
  // round, 45.4 and 36.6 us).
  const int64_t pairs = int64_t{rows} * config.num_kv_heads;
  const int64_t tiles = (std::max<int64_t>(max_length, 1) + kTile - 1) / kTile;
  // The wide layout when every (row, KV head) can have a CTA of its own on
  // one wave of SMs (its chunks then fill that wave, below) and the call has
  // work for it: rows * KV heads * tiles of at least 16 per SM, and rows of
  // at least 2048 tokens unless the pairs fill more than half the SMs. A
  // sweep of `bench attention --cta-warps 8,16` over batch 1-16 and 1k-128k
  // tokens on an H100 (docs/kv-cache.md, v21): wide won or tied at every
  // point this picks (batch 1 / 16k 21.2 against 23.5 us, batch 8 / 2k 20.5
  // against 23.4, batch 8 / 128k 392.0 against 453.1, batch 16 / 1k 20.5
  // against 22.0) and lost at those it leaves (batch 8 / 1k 18.6 against
  // 16.5: its 64 CTAs of a whole row each). Until v20 the rows were also
  // limited to 32k tokens: at 128k the wide layout's chunks ran in two
  // waves (see the cap below), which is what lost there.
  const int d = config.head_dim;
  if (packed_pair(kf, vf, d) && d == 128)
    plan.wide = forced_warps == 16 || (forced_warps == 0 && pairs <= sms && pairs * tiles >= 16 * sms &&
                                       (tiles >= 2048 / kTile || 2 * pairs > sms));
  const int warps = warps_per_cta(kf, vf, plan.wide, d);
  const int64_t slots = (warps == 8 ? 2 : 1) * sms;
  const int64_t tiles_per_page = std::max(config.page_size / kTile, 1);
  constexpr int64_t kFixedTiles = 4;
  int64_t max_splits = std::max<int64_t>({1, tiles / (4 * int64_t{warps}), sms / 2 / pairs});
  // 16-warp CTAs hold an SM each: their grid is one wave. A second one pays
  // every CTA's fixed cost twice and waits for the first wave's slowest SM
  // (batch 1 / 128k, 16 warps: 32 chunks of 4096 tokens in two waves 75.6
  // us, 16 chunks of 8192 in one 71.0 us; the cost below counted the two
  // full waves as cheaper).
  if (plan.wide) max_splits = std::min<int64_t>(max_splits, std::max<int64_t>(1, slots / pairs));
  int64_t best_splits = 1, best_cost = -1;
  for (int64_t s = 1; s <= std::min<int64_t>({tiles, max_splits, 4096}); ++s) {
    const int64_t per_cta = (tiles + s - 1) / s;
    const int64_t waves = (pairs * s + slots - 1) / slots;
    const int64_t cost = waves * (per_cta + kFixedTiles);
    if (best_cost < 0 || cost < best_cost) best_cost = cost, best_splits = s;
  }
  int64_t per_cta = (tiles + best_splits - 1) / best_splits;
  if (best_splits > 1 && per_cta > tiles_per_page) per_cta = (per_cta + tiles_per_page - 1) / tiles_per_page * tiles_per_page;
  plan.split_tokens = per_cta * kTile;
  return plan;
}

// The chunks' merge: Haar-rotated V (mt without signs) by merge_haar_kernel,
// else one warp per query head.
template <int D>
void launch_merge(const AttnArgs& a, int rows, const float* mt, const float* v_signs, float* out, __half* out16,
                  cudaStream_t stream) {
  if (mt != nullptr && v_signs == nullptr) {
    cuda::launch_with_pdl(merge_haar_kernel<D>, dim3(rows, a.num_kv_heads), dim3(kRotThreads<D>), 0, stream, a, mt,
                          out, out16);
    return;
  }
  const dim3 grid(rows, (a.num_q_heads + kMergeWarps - 1) / kMergeWarps);
  cuda::launch_with_pdl(v_signs != nullptr ? merge_heads_kernel<D, true> : merge_heads_kernel<D, false>, grid,
                        dim3(32 * kMergeWarps), 0, stream, a, v_signs, out, out16);
}

void run_attention(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int prefill_row,
                   int64_t first_pos, int rows, int64_t max_length, int num_q_heads, const float* q, float* out,
                   AttentionWorkspace& ws, const DeviceDecodeOptions& options, cudaStream_t stream) {
  const KvCacheConfig& cfg = cache.config();
  const int H = cfg.num_kv_heads;
  LOWBIT_CHECK_ARG(num_q_heads >= H && num_q_heads % H == 0 && num_q_heads / H <= kDeviceMaxGroup, "num_q_heads",
                   num_q_heads,
                   "a multiple of num_kv_heads = " + std::to_string(H) + " with at most 8 query heads per KV head");
  LOWBIT_CHECK_ARG(q != nullptr && (out != nullptr || options.out_f16 != nullptr), "q/out", "null",
                   "device pointers");
  LOWBIT_CHECK_ARG(rows >= 1 && rows <= 65535, "rows", rows, "1 to 65535 query rows per call");
  LOWBIT_CHECK_ARG(options.softmax_scale >= 0.0f, "softmax_scale", options.softmax_scale, "0 (default) or positive");
  LOWBIT_CHECK_ARG(options.split_tokens >= 0 && options.split_tokens % kTile == 0, "split_tokens",
                   options.split_tokens, "0 (auto) or a positive multiple of 16");
  const int group = num_q_heads / H;
  const DeviceKvWindow* window = options.window;
  LOWBIT_CHECK_ARG((options.window_k == nullptr) == (options.window_v == nullptr), "window_k",
                   options.window_k == nullptr ? "null" : "set", "set together with window_v");
  if (window != nullptr) {
    LOWBIT_CHECK_ARG(window->num_kv_heads() == H && window->head_dim() == cfg.head_dim, "window", "another geometry",
                     "a window made for this cache's config");
    LOWBIT_CHECK_ARG(options.window_slots != nullptr, "window_slots", "null",
                     "each row's sequence slot in the window (device)");
    LOWBIT_CHECK_ARG(options.append_k == nullptr ||
                         (options.append_k == options.window_k && options.append_v == options.window_v),
                     "append_k", "set", "null, or window_k / window_v (the window's kernel stores both)");
    LOWBIT_CHECK_ARG(options.window_k == nullptr || prefill_row < 0, "window_k", "set",
                     "null for prefill (device_window_write stores a block's copies)");
    LOWBIT_CHECK_ARG(prefill_row < 0 || rows <= device_window_max_block(*window), "n_tokens", rows,
                     "at most capacity - window + 1 = " + std::to_string(device_window_max_block(*window)) +
                         " with this window (attend a longer block in pieces)");
    LOWBIT_CHECK_ARG(max_length < (int64_t{1} << 31), "length", max_length, "below 2^31 positions with a window");
  } else {
    LOWBIT_CHECK_ARG(options.window_k == nullptr, "window_k", "set", "null without a window");
  }
  // With a window the code chunks cover the positions older than it (at
  // least one planned position, so that the launch has a CTA per row: rows
  // shorter than the window exit at once).
  const int64_t code_tokens =
      window != nullptr ? std::max<int64_t>(max_length - window->window(), 1) : max_length;
  const int64_t whole = (code_tokens + kTile - 1) / kTile * kTile;  // one chunk per row
  LOWBIT_CHECK_ARG(options.cta_warps == 0 || options.cta_warps == 8 || options.cta_warps == 16, "cta_warps",
                   options.cta_warps, "0 (chosen), 8 or 16");
  const DecodePlan plan = plan_decode(cfg, rows, code_tokens, sm_count(), options.cta_warps);
  // Prefill: the tiled kernel (prefill_attention.cu) unless the caller asks
  // for the decode kernel, one row per query token, or the device's shared
  // memory per block is too small for it. With a window it attends each
  // query's codes with its causal mask shifted by the window.
  const bool tiled = prefill_row >= 0 && options.prefill_tiled &&
                     tiled_prefill_fits(fmt_of(cfg.k_format), fmt_of(cfg.v_format), cfg.head_dim, num_q_heads / H);
  LOWBIT_CHECK_ARG(!tiled || max_length < (int64_t{1} << 30), "first_pos + n_tokens", max_length,
                   "below 2^30 positions for the tiled prefill");
  const int64_t auto_split =
      tiled ? tiled_prefill_split_tokens(rows, code_tokens, H, num_q_heads / H, sm_count()) : plan.split_tokens;
  const int64_t split = options.split_tokens > 0 ? std::min(options.split_tokens, whole) : auto_split;
  // The code chunks of the longest row, then the window's chunk.
  const int code_chunks = static_cast<int>((code_tokens + split - 1) / split);
  const int max_splits = code_chunks + (window != nullptr ? 1 : 0);
  LOWBIT_CHECK_ARG(max_splits <= 65535, "split_tokens", split, "at most 65535 chunks per row");
  const int d = cfg.head_dim;
  const float scale = softmax_scale_of(cfg, options);

  const size_t q_floats = static_cast<size_t>(rows) * num_q_heads * d;
  const bool k_rot = is_quantized(cfg.k_format), v_rot = is_quantized(cfg.v_format);
  LOWBIT_CHECK_ARG(!options.queries_rotated || (k_rot && prefill_row < 0), "queries_rotated", "true",
                   "false for fp16 K and for prefill (decode queries against quantized K only)");
  LOWBIT_CHECK_ARG((options.append_k == nullptr) == (options.append_v == nullptr), "append_k",
                   options.append_k == nullptr ? "null" : "set", "set together with append_v");
  LOWBIT_CHECK_ARG(options.append_k == nullptr || prefill_row < 0, "append_k", "set",
                   "null for prefill (device_write_tokens stores a prefill's tokens)");
  // Before any launch: Error(unsupported) for Haar-rotated parts.
  const KvAppendTarget append_target =
      options.append_k != nullptr ? device_append_target(cache, layer, tables) : KvAppendTarget{};
  // Quantized K, the queries rotated (q' = q @ M, times the softmax scale):
  //  - by the caller (DeviceDecodeOptions::queries_rotated);
  //  - Hadamard: inside the attention CTAs, with the d signs (no kernel before
  //    them; batch 8 / 32k 122.3 -> 121.0 us against a rotation kernel of
  //    the signs, docs/kv-cache.md);
  //  - Haar: by a kernel of its own (each attention CTA reading the 64 KB of
  //    M measured 3-4 us slower for tq4 K/V at batch 1 and 8).
  // fp16 K: the attention kernel scales q itself, one launch fewer (2-3 us
  // at batch 1).
  const float* signs = cache.hadamard_signs(layer);
  const bool rotate_in_cta = k_rot && !options.queries_rotated && signs != nullptr;
  const bool rotate_here = k_rot && !options.queries_rotated && !rotate_in_cta;
  float* q_rot = rotate_here ? ws.q_rotated(q_floats) : nullptr;
  if (rotate_here) {
    if (d == 64)
      cuda::launch_with_pdl(rotate_queries_kernel<64>, dim3(rows, H), dim3(kRotThreads<64>), 0, stream, q,
                            cache.rotation(layer), q_rot, num_q_heads, group, decode_query_scale(cfg, options));
    else
      cuda::launch_with_pdl(rotate_queries_kernel<128>, dim3(rows, H), dim3(kRotThreads<128>), 0, stream, q,
                            cache.rotation(layer), q_rot, num_q_heads, group, decode_query_scale(cfg, options));
  }

  AttnArgs a{};
  const PageLayout& l = cache.layout();
  a.pool = cache.pool(layer);
  a.pool_bytes = options.l2_streaming ? cache.pool_bytes() : 0;
  a.slab_bytes = l.bytes;
  a.k_rows = l.k_rows, a.k_scales = l.k_scales, a.v_rows = l.v_rows, a.v_scales = l.v_scales;
  a.scale_bytes = static_cast<int>(scale_dtype_bytes(cfg.scale_dtype));
  a.num_kv_heads = H, a.group = group, a.num_q_heads = num_q_heads, a.page_size = cfg.page_size;
  a.tables = tables.tables.as<const int32_t>();
  a.table_stride = tables.stride;
  // attend_kernel stages its tiles with 32-bit offsets inside one page's
  // slabs and 32-bit indices into the block tables.
  LOWBIT_REQUIRE(int64_t{H} * l.bytes <= INT32_MAX, "decode attention: a page of ", H, " KV heads spans ",
                 int64_t{H} * l.bytes, " bytes, more than 2^31 - 1");
  LOWBIT_REQUIRE(int64_t{tables.rows} * tables.stride <= INT32_MAX, "decode attention: ",
                 int64_t{tables.rows} * tables.stride, " block-table entries, more than 2^31 - 1");
  a.lengths = tables.lengths.as<const int32_t>();
  a.prefill_row = prefill_row;
  a.first_pos = first_pos;
  a.q = rotate_here ? q_rot : q;
  a.queries_rotated = k_rot;
  // No kernel between the caller's last one and this: it may have appended
  // each row's newest token, or made the K/V this call appends. (With the
  // queries rotated in the CTAs the kernel reads no tile before its wait.)
  a.newest_token_fresh = options.queries_rotated || options.append_k != nullptr;
  if (options.append_k != nullptr) {  // the newest tokens stored by the CTAs holding them
    a.append = append_target;
    a.append_k = options.append_k;
    a.append_v = options.append_v;
  }
  a.q_signs = rotate_in_cta ? signs : nullptr;
  a.q_rotate_scale = decode_query_scale(cfg, options);
  a.q_scale = k_rot ? 1.0f : scale * kLog2e;
  a.split_tokens = split;
  a.max_splits = max_splits;
  if (window != nullptr) {
    a.window = static_cast<int>(std::min<int64_t>(window->window(), int64_t{1} << 30));
    a.window_capacity = window->capacity();
    a.win_k = static_cast<__half*>(window->k(layer));
    a.win_v = static_cast<__half*>(window->v(layer));
    a.win_slots = options.window_slots;
    a.win_store_k = options.window_k;
    a.win_store_v = options.window_v;
    const auto rotation_of = [&](KvFormat f) {
      WindowRotation r;
      if (!is_quantized(f)) return r;
      r.signs = signs;
      if (signs == nullptr) r.matrix = cache.rotation(layer);
      return r;
    };
    a.win_rot_k = rotation_of(cfg.k_format);
    a.win_rot_v = rotation_of(cfg.v_format);
  }
  const float* mt = v_rot ? cache.rotation_t(layer) : nullptr;
  const float* v_signs = v_rot ? signs : nullptr;
  __half* out16 = static_cast<__half*>(options.out_f16);
  // The chunks of a row merged inside a cluster of its CTAs (sm_90, up to 8
  // chunks per row, V un-rotated by signs if at all), else by the merge
  // kernel from partials in global memory.
  a.cluster_merge = !tiled && window == nullptr && options.cluster_merge && max_splits <= kMaxClusterChunks &&
                    (mt == nullptr || v_signs != nullptr) && clusters_available();
  // A cluster is placed whole, inside one GPC. When the call's clusters do
  // not all fit at once, those left over wait for a second wave: on an H100,
  // 15 clusters of 8 one-SM CTAs fit, and batch 2 / 16k (16 of them) took
  // 44.0 us against 30.0 us with no cluster. Those calls take the merge
  // kernel.
  if (a.cluster_merge && max_splits > 1) {
    const int kf = fmt_of(cfg.k_format), vf = fmt_of(cfg.v_format);
    const int clusters =
        d == 64 ? with_attend_instance<64>(kf, vf, plan.wide,
                                           [&]<int KF, int VF, bool kWide>() {
                                             return attend_clusters_resident<KF, VF, kWide, 64>(a, max_splits);
                                           })
                : with_attend_instance<128>(kf, vf, plan.wide, [&]<int KF, int VF, bool kWide>() {
                    return attend_clusters_resident<KF, VF, kWide, 128>(a, max_splits);
                  });
    if (int64_t{rows} * H > clusters) a.cluster_merge = false;
  }
  a.out = out;
  a.out16 = out16;
  a.v_signs = v_signs;
  if (!a.cluster_merge) {
    // One chunk: the partial has the output's layout, so the merge kernel
    // un-rotates in place and the workspace needs no copy of the output
    // (when out is 16-byte aligned, as merge_heads_kernel's copies need).
    a.part_out = max_splits == 1 && options.out_f16 == nullptr && reinterpret_cast<uintptr_t>(out) % 16 == 0
                     ? out
                     : ws.partial_out(q_floats * static_cast<size_t>(max_splits));
    a.part_lse = ws.partial_lse(static_cast<size_t>(rows) * num_q_heads * max_splits);
  }
  for (KvPart part : {KvPart::key, KvPart::value}) {
    const VectorQuantizer* vq = cache.quantizer(part);
    float* dst = part == KvPart::key ? a.k_centroids : a.v_centroids;
    if (vq == nullptr) continue;
    const auto& c = vq->codebook().centroids_f32;
    for (size_t i = 0; i < c.size(); ++i) dst[i] = c[i];
  }
  const dim3 grid(code_chunks, H, rows);
  if (tiled) {
    TiledPrefillArgs t;
    t.pool = a.pool;
    t.slab_bytes = a.slab_bytes;
    t.k_rows = a.k_rows, t.k_scales = a.k_scales, t.v_rows = a.v_rows, t.v_scales = a.v_scales;
    t.scale_bytes = a.scale_bytes;
    t.num_kv_heads = H, t.group = group, t.num_q_heads = num_q_heads, t.page_size = cfg.page_size;
    t.table = a.tables + prefill_row * a.table_stride;
    t.first_pos = static_cast<int>(first_pos);
    t.n_tokens = rows;
    t.window = a.window;
    t.q = a.q;
    t.q_signs = a.q_signs;
    t.q_rotate_scale = a.q_rotate_scale;
    t.q_scale = a.q_scale;
    t.split_tokens = static_cast<int>(split);
    t.max_splits = max_splits;
    t.part_out = a.part_out;
    t.part_lse = a.part_lse;
    for (int i = 0; i < 16; ++i) t.k_centroids[i] = a.k_centroids[i], t.v_centroids[i] = a.v_centroids[i];
    launch_tiled_prefill(fmt_of(cfg.k_format), fmt_of(cfg.v_format), d, t, stream);
  }
  // The window's chunk first: the code chunks then start behind it, and the
  // merge kernel, which waits for the code chunks' grid, reads both.
  if (window != nullptr) {
    const dim3 block(32 * static_cast<unsigned>(window_head_warps(group) + (options.append_k != nullptr ? 2 : 0)));
    if (d == 64) cuda::launch_with_pdl(window_attend_kernel<64>, dim3(rows, H), block, 0, stream, a);
    else cuda::launch_with_pdl(window_attend_kernel<128>, dim3(rows, H), block, 0, stream, a);
  }
  if (d == 64) {
    if (!tiled) dispatch<64>(fmt_of(cfg.k_format), fmt_of(cfg.v_format), plan.wide, a, grid, stream);
    if (!a.cluster_merge) launch_merge<64>(a, rows, mt, v_signs, out, out16, stream);
  } else {
    if (!tiled) dispatch<128>(fmt_of(cfg.k_format), fmt_of(cfg.v_format), plan.wide, a, grid, stream);
    if (!a.cluster_merge) launch_merge<128>(a, rows, mt, v_signs, out, out16, stream);
  }
}

}  // namespace

float decode_query_scale(const KvCacheConfig& config, const DeviceDecodeOptions& options) {
  return softmax_scale_of(config, options) * kLog2e;
}

int64_t decode_split_tokens(const KvCacheConfig& config, int rows, int64_t max_length, int sm_count,
                            int cta_warps) {
  LOWBIT_CHECK_ARG(cta_warps == 0 || cta_warps == 8 || cta_warps == 16, "cta_warps", cta_warps, "0 (chosen), 8 or 16");
  return plan_decode(config, rows, max_length, sm_count, cta_warps).split_tokens;
}

void device_decode_attention(const DeviceKvCache& cache, int layer, const DeviceBlockTables& tables, int num_q_heads,
                             const float* q, float* out, AttentionWorkspace& workspace,
                             const DeviceDecodeOptions& options, cudaStream_t stream) {
  for (int r = 0; r < tables.rows; ++r)
    LOWBIT_CHECK_ARG(tables.host_lengths[static_cast<size_t>(r)] >= 1, "tables.lengths[" + std::to_string(r) + "]",
                     tables.host_lengths[static_cast<size_t>(r)],
                     "at least 1 (write the current token before decode attends to it)");
  LOWBIT_CHECK_ARG(options.plan_length >= 0, "plan_length", options.plan_length, "0 or a token count");
  run_attention(cache, layer, tables, -1, 0, tables.rows, std::max(tables.max_length, options.plan_length),
                num_q_heads, q, out, workspace, options, stream);
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
