// Causal prefill attention on the paged TurboQuant cache, tiled for tensor
// cores: a CTA takes a block of query tokens of one KV head, every query head
// of the group, and streams the keys of one KV chunk in 64-key tiles.
//
// Why it is not the decode kernel: the decode kernel (device_attention.cu)
// runs one query token per row, so a prefill of n tokens decodes every
// cached vector n times and re-reads the block's K/V for every query token;
// its mma rows are keys, and the <= 8 query heads of one token are its only
// columns. At 32k tokens that was ~200 ms per layer, where the arithmetic of
// causal attention is ~11 TFLOP (20 ms at half of the H100's fp16 peak).
// Here a key tile is dequantized once per CTA into shared memory as fp16 and
// then multiplied by 16 * warps query rows (flash-attention 2's order: the
// query rows are the mma's m, the keys its n for Q K^T and its k for P V).
//
// Per key tile:
//  1. The packed rows and scales of the next tile are copied (cp.async) into
//     the other half of a two-stage raw buffer while this one is decoded.
//  2. Every thread decodes 16-byte pieces (8 coordinates) of K and V rows
//     through the centroid pair tables (attention_mma.cuh; one shared load
//     per pair, a copy of the table per lane so random indices do not
//     collide in banks) into fp16 tiles whose 16-byte chunks are XOR-swizzled
//     by the key: ldmatrix then reads 8 keys' chunks from 8 distinct bank
//     groups. Keys past the chunk are zeros (their slots may hold anything;
//     0 * NaN would poison P V), their scales 0.
//  3. Each warp: S = Q K^T (Q's fragments in registers for the whole call,
//     K's from ldmatrix), times the keys' scales, causal mask, online softmax
//     in exp2 (the queries carry softmax_scale * log2(e)); P times V's
//     scales goes to fp16 as the A operand of O += P V (V's fragments from
//     ldmatrix.trans), the row sums take P alone. The scores and values stay
//     in the rotated domain: the queries are rotated once (here, for a
//     Hadamard cache; by the rotation kernel for a Haar one), the merge
//     kernel un-rotates each output once.
// The result per (token, query head, chunk) is what the decode kernel leaves
// for the merge kernel: the normalized output and the log-sum-exp (log2).
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "attention_mma.cuh"
#include "prefill_attention.h"
#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernel_smem.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/kv/hadamard_warp.cuh"

namespace lowbit::kv::attention_mma {
namespace {

constexpr int kKeyTile = 64;  // keys per iteration: 8 n-tiles of Q K^T, 4 k-steps of P V
constexpr int kMaxWarps = 12;  // 12 x 32 threads x 168 registers: one CTA per SM

template <int KF, int VF, int D>
struct PrefillLayout {
  static constexpr int KR = row_bytes(KF, D), VR = row_bytes(VF, D);
  static constexpr int kChunks = D / 8;  // 16-byte chunks of an fp16 row
  static constexpr int kLutWords = 32 * (lut_entries(KF) + (VF == KF ? 0 : lut_entries(VF)));
  static constexpr int kTileBytes = kKeyTile * D * 2;  // one fp16 tile (K or V)
  static constexpr int kF16Bytes = 2 * kTileBytes;
  static constexpr int kRawK = kKeyTile * KR, kRawV = kKeyTile * VR;
  static constexpr int kRawScales = kRawK + kRawV;  // K's scales, then V's at + 4 * kKeyTile
  static constexpr int kRawBytes = kRawScales + 2 * 4 * kKeyTile;
  static constexpr int kF16Offset = 4 * kLutWords;
  static constexpr int kScaleOffset = kF16Offset + kF16Bytes;  // float k_scale[64], v_scale[64]
  // The slab offsets of the 16-key groups of three tiles (a ring: the tile
  // being copied, the next, and the one whose page numbers are loading).
  static constexpr int kPageOffset = kScaleOffset + 2 * 4 * kKeyTile;
  static constexpr int kRawOffset = kPageOffset + 3 * 4 * 8;
  // The warps' queries, staged once as fp16 rows padded by 16 bytes (8 rows'
  // fragments then sit in distinct banks), 16 rows per warp, last.
  static constexpr int kQStride = D + 8;
  static constexpr int kQOffset = kRawOffset + 2 * kRawBytes;
  static constexpr int smem_bytes(int warps) { return kQOffset + warps * 16 * kQStride * 2; }
  static_assert(kF16Offset % 16 == 0 && kRawK % 16 == 0 && kRawV % 16 == 0, "16-byte copies");
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Coordinates 8 * chunk .. 8 * chunk + 7 of one cached row as 8 fp16 values
// (paged_cache.h's row layouts); `lut` is this lane's copy of the pair table.
template <int F, int D>
__device__ __forceinline__ uint4 decode_chunk(const uint8_t* row, int chunk, const uint32_t* lut) {
  if constexpr (F == kTq4) {  // byte b: coordinates 2b (low nibble), 2b + 1
    // One PRMT extracts each byte (the entry), one shift-add makes the
    // address: the decode of a tile is a third of the kernel's instructions.
    const uint32_t w = *reinterpret_cast<const uint32_t*>(row + 4 * chunk);
    return make_uint4(lut[__byte_perm(w, 0u, 0x4440u) * 32], lut[__byte_perm(w, 0u, 0x4441u) * 32],
                      lut[__byte_perm(w, 0u, 0x4442u) * 32], lut[__byte_perm(w, 0u, 0x4443u) * 32]);
  } else if constexpr (F == kTq2) {  // nibble k: coordinates 8 chunk + 2k, + 1
    const uint32_t w = *reinterpret_cast<const uint16_t*>(row + 2 * chunk);
    return make_uint4(lut[(w & 15u) * 32], lut[((w >> 4) & 15u) * 32], lut[((w >> 8) & 15u) * 32],
                      lut[(w >> 12) * 32]);
  } else if constexpr (F == kTq3) {  // the low 2-bit plane as tq2, bit 2 from the plane at D / 4
    const uint32_t lo = *reinterpret_cast<const uint16_t*>(row + 2 * chunk);
    const uint32_t hi = row[D / 4 + chunk];
    uint32_t e[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t i0 = ((lo >> (4 * k)) & 3u) | (((hi >> (2 * k)) & 1u) << 2);
      const uint32_t i1 = ((lo >> (4 * k + 2)) & 3u) | (((hi >> (2 * k + 1)) & 1u) << 2);
      e[k] = lut[(i0 | (i1 << 3)) * 32];
    }
    return make_uint4(e[0], e[1], e[2], e[3]);
  } else {
    return *reinterpret_cast<const uint4*>(row + 16 * chunk);
  }
}

template <int KF, int VF, int D>
__global__ void __maxnreg__(168) tiled_prefill_kernel(TiledPrefillArgs a) {
  using L = PrefillLayout<KF, VF, D>;
  extern __shared__ float4 smem_f4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_f4);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, threads = blockDim.x;
  const int g = lane >> 2, c = lane & 3;
  const int G = a.group;
  const int tokens_per_cta = threads / 32 * 16 / G;
  // The last query blocks have the most keys: they go first, so the grid's
  // tail is made of short CTAs.
  const int qblock = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, split = blockIdx.z;
  const int tok_begin = qblock * tokens_per_cta;
  const int tok_end = min(a.n_tokens, tok_begin + tokens_per_cta);
  const int kv_begin = split * a.split_tokens;
  const int pos_last = a.first_pos + tok_end - 1 - a.window;  // the block's last key

  // The tables depend on the arguments only: filled before the wait.
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  if constexpr (quantized(KF)) fill_lut<32>(lut, KF, a.k_centroids);
  if constexpr (quantized(VF) && VF != KF) fill_lut<32>(lut + 32 * lut_entries(KF), VF, a.v_centroids);
  float lane_signs[D / 32];
  if (a.q_signs != nullptr) load_lane_signs<D>(a.q_signs, lane_signs);
  cuda::pdl_wait();  // q and the block's K/V come from the kernels before
  if (kv_begin > pos_last) return;  // the chunk starts after the block's last token
  const int kv_end = min(pos_last + 1, kv_begin + a.split_tokens);
  const int first_row_pos = a.first_pos + tok_begin - a.window;  // no key at or before it is masked for any row

  // This lane's rows: g and g + 8 of the warp's 16 (token row / G, head row % G).
  int pos[2], tok[2], head[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = warp * 16 + g + 8 * i;
    tok[i] = tok_begin + row / G;
    head[i] = row % G;
    // The row's last key; -1 for padding (and rows inside the window): every key masked.
    pos[i] = tok[i] < tok_end ? a.first_pos + tok[i] - a.window : -1;
  }

  // Queries: rotated (Hadamard) or scaled, staged once as fp16 in the
  // warp's rows of the query area; each key tile reads their fragments with
  // ldmatrix. (Held in registers for the whole call, they took the kernel
  // to ~240 registers: one CTA per SM.)
  __half* q_stage = reinterpret_cast<__half*>(smem + L::kQOffset) + warp * 16 * L::kQStride;
  for (int i = 0; i < 16; ++i) {
    const int row = warp * 16 + i, t = tok_begin + row / G, hd = row % G;
    float v[D / 32];
#pragma unroll
    for (int u = 0; u < D / 32; ++u) v[u] = 0.0f;
    if (t < tok_end) {  // the same for the whole warp
      const float* src = a.q + (static_cast<int64_t>(t) * a.num_q_heads + h * G + hd) * D;
#pragma unroll
      for (int u = 0; u < D / 32; ++u) v[u] = src[lane + 32 * u];
      if (a.q_signs != nullptr) {
        hadamard_rotate_warp<D>(v, lane_signs, a.q_rotate_scale);
      } else {
#pragma unroll
        for (int u = 0; u < D / 32; ++u) v[u] *= a.q_scale;
      }
    }
#pragma unroll
    for (int u = 0; u < D / 32; ++u) q_stage[i * L::kQStride + lane + 32 * u] = __float2half_rn(v[u]);
  }
  // ldmatrix x4 of the A fragment of k-step ks: rows 0-7 / 8-15 (lanes 0-7 /
  // 8-15, then again for the upper 8 columns, lanes 16-31).
  const uint32_t q_frag_s = static_cast<uint32_t>(__cvta_generic_to_shared(
      q_stage + ((lane & 7) + 8 * ((lane >> 3) & 1)) * L::kQStride + 8 * (lane >> 4)));

  const std::byte* head_slabs = a.pool + static_cast<int64_t>(h) * a.slab_bytes;
  const int64_t page_stride = int64_t{a.num_kv_heads} * a.slab_bytes;
  const int sb = a.scale_bytes;
  // 16-byte pieces of one 16-key group (a group never crosses a page): K
  // rows, V rows, K scales, V scales.
  constexpr int kKPieces = L::KR, kVPieces = L::VR;
  // The page of each 16-key group is looked up two tiles ahead (one lane
  // per group, its latency behind a tile's work) and kept in shared memory:
  // looked up by every copying thread right before its copies, the block
  // table's round trip sat between the barrier and the first copy of every tile.
  int64_t* group_slab = reinterpret_cast<int64_t*>(smem + L::kPageOffset);  // [3 tiles][4 groups]
  auto group_offset = [&](int tile_start, int grp) -> int64_t {
    const int key0 = tile_start + 16 * grp;
    if (key0 >= kv_end) return -1;
    return int64_t{a.table[key0 / a.page_size]} * 1024 + key0 % a.page_size;  // page, slot (< 256)
  };
  // Rows first (a group's 16 rows are contiguous in its page: K then V
  // pieces, a compile-time count per group), then the scales (threads 0-31,
  // at most 4 groups x 2 parts x 4 pieces). Written as one loop over mixed
  // pieces with a runtime divisor it cost ~130 instructions per piece.
  auto issue = [&](int tile_index) {
    uint8_t* raw = smem + L::kRawOffset + (tile_index & 1) * L::kRawBytes;
    const int64_t* slabs = group_slab + 4 * (tile_index % 3);
    constexpr int kRowPieces = 4 * (kKPieces + kVPieces);
    for (int p = tid; p < kRowPieces; p += threads) {
      const bool is_v = p >= 4 * kKPieces;
      const int q = is_v ? p - 4 * kKPieces : p;
      const int grp = is_v ? q / kVPieces : q / kKPieces, o = is_v ? q - grp * kVPieces : q - grp * kKPieces;
      const int64_t at = slabs[grp];  // page * 1024 + slot, or -1 past the chunk
      if (at < 0) continue;
      const int slot = static_cast<int>(at & 1023);
      const std::byte* slab = head_slabs + (at >> 10) * page_stride;
      if (is_v) cp_async16(raw + L::kRawK + grp * 16 * L::VR + 16 * o, slab + a.v_rows + slot * L::VR + 16 * o);
      else cp_async16(raw + grp * 16 * L::KR + 16 * o, slab + a.k_rows + slot * L::KR + 16 * o);
    }
    if (tid < 32) {  // pieces: 2 parts x 4 groups x sb (2 or 4)
      const int part = tid / 16, grp = (tid / 4) % 4, o = tid % 4;
      const bool packed = part == 0 ? quantized(KF) : quantized(VF);
      const int64_t at = slabs[grp];
      if (packed && o < sb && at >= 0) {
        const int slot = static_cast<int>(at & 1023);
        const std::byte* slab = head_slabs + (at >> 10) * page_stride;
        cp_async16(raw + L::kRawScales + part * 4 * kKeyTile + grp * 16 * sb + 16 * o,
                   slab + (part == 0 ? a.k_scales : a.v_scales) + slot * sb + 16 * o);
      }
    }
  };

  __half* k_tile = reinterpret_cast<__half*>(smem + L::kF16Offset);
  __half* v_tile = k_tile + kKeyTile * D;
  float* k_scale = reinterpret_cast<float*>(smem + L::kScaleOffset);
  float* v_scale = k_scale + kKeyTile;
  const uint32_t* lut_k = lut + (tid & 31);
  const uint32_t* lut_v = VF == KF ? lut_k : lut_k + 32 * lut_entries(KF);
  const uint32_t k_tile_s = static_cast<uint32_t>(__cvta_generic_to_shared(k_tile));
  const uint32_t v_tile_s = static_cast<uint32_t>(__cvta_generic_to_shared(v_tile));
  // An fp16 tile's 16-byte chunk (key, chunk), swizzled by the key.
  auto chunk_offset = [](int key, int chunk) { return key * (2 * D) + ((chunk ^ (key & 7)) << 4); };

  constexpr int kDT = D / 8;  // n-tiles of the output
  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const int n_tiles = (kv_end - kv_begin + kKeyTile - 1) / kKeyTile;
  if (tid < 8) group_slab[tid] = group_offset(kv_begin + kKeyTile * (tid / 4), tid % 4);  // tiles 0 and 1
  __syncthreads();
  issue(0);
  cp_async_commit();
  for (int it = 0; it < n_tiles; ++it) {
    const int tile_start = kv_begin + it * kKeyTile;
    cp_async_wait<0>();
    __syncthreads();  // tile `it` is in; nobody reads the previous fp16 tiles any more
    if (it + 1 < n_tiles) issue(it + 1);
    cp_async_commit();
    int64_t ahead = -1;  // tile it + 2's page of group tid, stored after the decode
    if (tid < 4) ahead = group_offset(tile_start + 2 * kKeyTile, tid);

    // 2. Decode into the fp16 tiles: piece u of a part is key u / kChunks,
    // chunk u % kChunks; 4 pieces per thread at a time, so that their loads
    // are in flight together (the stores, which may alias the raw rows as
    // far as the compiler knows, come after them). Keys past the chunk
    // decode to zeros.
    const uint8_t* raw = smem + L::kRawOffset + (it & 1) * L::kRawBytes;
    const int live_keys = kv_end - tile_start;
    auto decode_part = [&](auto format, const uint8_t* rows, int row_bytes_, const uint32_t* part_lut, uint8_t* tile) {
      constexpr int F = decltype(format)::value;
      constexpr unsigned kUnits = kKeyTile * L::kChunks, kShift = L::kChunks == 16 ? 4 : 3;
      // Unsigned, power-of-two index arithmetic and no branches: signed
      // divisions and a branch per piece made this ~50 instructions a piece.
      for (unsigned u0 = tid; u0 < kUnits; u0 += 4 * threads) {
        uint4 x[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const unsigned u = min(u0 + j * threads, kUnits - 1), key = u >> kShift, chunk = u & (L::kChunks - 1);
          x[j] = decode_chunk<F, D>(rows + key * row_bytes_, static_cast<int>(chunk), part_lut);
          if (live_keys < kKeyTile && static_cast<int>(key) >= live_keys) x[j] = make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const unsigned u = u0 + j * threads, key = u >> kShift, chunk = u & (L::kChunks - 1);
          if (u < kUnits)
            *reinterpret_cast<uint4*>(tile + chunk_offset(static_cast<int>(key), static_cast<int>(chunk))) = x[j];
        }
      }
    };
    decode_part(std::integral_constant<int, KF>{}, raw, L::KR, lut_k, reinterpret_cast<uint8_t*>(k_tile));
    decode_part(std::integral_constant<int, VF>{}, raw + L::kRawK, L::VR, lut_v, reinterpret_cast<uint8_t*>(v_tile));
    if (tid < 2 * kKeyTile) {
      const bool is_v = tid >= kKeyTile;
      const int key = tid % kKeyTile;
      const bool packed = is_v ? quantized(VF) : quantized(KF);
      float s = 0.0f;
      if (tile_start + key < kv_end) {
        s = 1.0f;
        if (packed) {
          const uint8_t* sp = raw + L::kRawScales + (is_v ? 4 * kKeyTile : 0);
          s = sb == 2 ? __half2float(reinterpret_cast<const __half*>(sp)[key]) : reinterpret_cast<const float*>(sp)[key];
        }
      }
      k_scale[tid] = s;  // v_scale = k_scale + kKeyTile
    }
    if (tid < 4) group_slab[4 * ((it + 2) % 3) + tid] = ahead;
    __syncthreads();

    // 3. S = Q K^T for the warp's 16 rows x 64 keys.
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks += 2) {
      uint32_t qa[4], qb[4];  // the A fragments of k-steps ks and ks + 1
      ldmatrix_x4(q_frag_s + 32 * ks, qa);
      ldmatrix_x4(q_frag_s + 32 * (ks + 1), qb);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t b[4];  // chunks 2ks .. 2ks + 3 of keys 8nt .. 8nt + 7
        const int key = 8 * nt + (lane & 7);
        ldmatrix_x4(k_tile_s + chunk_offset(key, 2 * ks + (lane >> 3)), b);
        mma16816(s[nt], qa[0], qa[1], qa[2], qa[3], b[0], b[1]);
        mma16816(s[nt], qb[0], qb[1], qb[2], qb[3], b[2], b[3]);
      }
    }
    // Scales and the causal mask; s[nt][2i + j]: row g + 8i, key 8nt + 2c + j.
    // Only the tiles at the block's diagonal or the chunk's end mask keys
    // (the test is the same for the whole CTA).
    float mx[2] = {-INFINITY, -INFINITY};
    const bool masked = tile_start + kKeyTile - 1 > first_row_pos || tile_start + kKeyTile > kv_end;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 ksc = *reinterpret_cast<const float2*>(k_scale + 8 * nt + 2 * c);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int kpos = tile_start + 8 * nt + 2 * c + j;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float& x = s[nt][2 * i + j];
          x *= j == 0 ? ksc.x : ksc.y;
          if (masked && !(kpos <= pos[i] && kpos < kv_end)) x = -INFINITY;
          mx[i] = fmaxf(mx[i], x);
        }
      }
    }
    float alpha[2], base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float next = fmaxf(m[i], mx[i]);
      // A row with no live key yet keeps -inf: exponents relative to 0 then
      // give 0 for every masked score (and no -inf - -inf).
      base[i] = next == -INFINITY ? 0.0f : next;
      alpha[i] = fast_exp2(m[i] - base[i]);
      m[i] = next;
    }
    float rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        s[nt][q] = fast_exp2(s[nt][q] - base[q >> 1]);
        rowsum[q >> 1] += s[nt][q];
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rowsum[i];
    // Once the running maxima settle, skip the rescale unless a row of the
    // warp needs it.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
      }
    }
    // O += (P * s_v) V, 16 keys per k-step: the score accumulators of
    // n-tiles 2kk and 2kk + 1 are the A fragment (flash-attention 2's
    // register reuse).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const float2 vs0 = *reinterpret_cast<const float2*>(v_scale + 16 * kk + 2 * c);
      const float2 vs1 = *reinterpret_cast<const float2*>(v_scale + 16 * kk + 8 + 2 * c);
      const uint32_t pa0 = pack_half2(s[2 * kk][0] * vs0.x, s[2 * kk][1] * vs0.y);
      const uint32_t pa1 = pack_half2(s[2 * kk][2] * vs0.x, s[2 * kk][3] * vs0.y);
      const uint32_t pa2 = pack_half2(s[2 * kk + 1][0] * vs1.x, s[2 * kk + 1][1] * vs1.y);
      const uint32_t pa3 = pack_half2(s[2 * kk + 1][2] * vs1.x, s[2 * kk + 1][3] * vs1.y);
      const int key = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int dt = 0; dt < kDT; dt += 2) {
        uint32_t b[4];  // keys 16kk .. +15 of output chunks dt, dt + 1, transposed
        ldmatrix_x4_trans(v_tile_s + chunk_offset(key, dt + (lane >> 4)), b);
        mma16816(o[dt], pa0, pa1, pa2, pa3, b[0], b[1]);
        mma16816(o[dt + 1], pa0, pa1, pa2, pa3, b[2], b[3]);
      }
    }
  }
  cuda::pdl_launch_dependents();  // the merge kernel may launch; it waits for this grid

  // Rows whose token lies before the chunk have no part in it (the merge
  // kernel reads chunks 0 .. ceil((pos + 1) / split_tokens) - 1 only).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    if (pos[i] < kv_begin) continue;
    const int64_t part = (static_cast<int64_t>(tok[i]) * a.num_q_heads + h * G + head[i]) * a.max_splits + split;
    float* dst = a.part_out + part * D + 2 * c;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<float2*>(dst + 8 * dt) = make_float2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
    if (c == 0) a.part_lse[part] = m[i] + log2f(l[i]);
  }
}

template <int KF, int VF, int D>
void launch(const TiledPrefillArgs& a, cudaStream_t stream) {
  using L = PrefillLayout<KF, VF, D>;
  const int warps = tiled_prefill_warps(a.group), tokens = tiled_prefill_tokens_per_cta(a.group);
  const dim3 grid((a.n_tokens + tokens - 1) / tokens, a.num_kv_heads, a.max_splits);
  const int smem = L::smem_bytes(warps);
  cuda::ensure_dynamic_smem(tiled_prefill_kernel<KF, VF, D>, smem);
  cuda::launch_with_pdl(tiled_prefill_kernel<KF, VF, D>, grid, dim3(32 * warps), static_cast<size_t>(smem), stream, a);
}

// fn(integral_constant<KF>, integral_constant<VF>) for the runtime format codes.
template <typename Fn>
void with_formats(int kf, int vf, Fn&& fn) {
  auto with_v = [&](auto k) {
    switch (vf) {
      case kTq4:
        return fn(k, std::integral_constant<int, kTq4>{});
      case kTq3:
        return fn(k, std::integral_constant<int, kTq3>{});
      case kTq2:
        return fn(k, std::integral_constant<int, kTq2>{});
      default:
        return fn(k, std::integral_constant<int, kFp16>{});
    }
  };
  switch (kf) {
    case kTq4:
      return with_v(std::integral_constant<int, kTq4>{});
    case kTq3:
      return with_v(std::integral_constant<int, kTq3>{});
    case kTq2:
      return with_v(std::integral_constant<int, kTq2>{});
    default:
      return with_v(std::integral_constant<int, kFp16>{});
  }
}

}  // namespace

// 16 rows per warp and whole tokens per CTA: the most warps up to 12 (the
// register file at 168 registers) that hold whole tokens. A key tile is
// decoded once per CTA, so more rows per CTA make it cheaper per row: with
// Qwen3's group of 5, 16 tokens in 5 warps spent ~40% of their
// instructions decoding; 32 tokens in 10 warps halve that share.
int tiled_prefill_warps(int group) { return group * (kMaxWarps / group); }
int tiled_prefill_tokens_per_cta(int group) { return 16 * tiled_prefill_warps(group) / group; }

int64_t tiled_prefill_split_tokens(int n_tokens, int64_t max_length, int num_kv_heads, int group, int sm_count) {
  const int tokens = tiled_prefill_tokens_per_cta(group);
  const int64_t blocks = int64_t{(n_tokens + tokens - 1) / tokens} * num_kv_heads;
  // At least 4 CTAs per SM (one or two are resident at a time), and chunks
  // of at least 4 tiles: a short block over a long history (chunked
  // prefill) still fills the GPU.
  const int64_t want = 4 * int64_t{std::max(sm_count, 1)};
  const int64_t splits =
      std::clamp<int64_t>((want + blocks - 1) / blocks, 1, std::max<int64_t>(1, max_length / (4 * kKeyTile)));
  const int64_t per = (max_length + splits - 1) / splits;
  return (per + kKeyTile - 1) / kKeyTile * kKeyTile;
}

bool tiled_prefill_fits(int kf, int vf, int head_dim, int group) {
  int device = 0, optin = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int bytes = 0;
  with_formats(kf, vf, [&](auto k, auto v) {
    const int warps = tiled_prefill_warps(group);
    bytes = head_dim == 64 ? PrefillLayout<k.value, v.value, 64>::smem_bytes(warps)
                           : PrefillLayout<k.value, v.value, 128>::smem_bytes(warps);
  });
  return bytes <= optin;
}

void launch_tiled_prefill(int kf, int vf, int head_dim, const TiledPrefillArgs& a, cudaStream_t stream) {
  LOWBIT_CHECK_ARG(head_dim == 64 || head_dim == 128, "head_dim", head_dim, "64 or 128");
  LOWBIT_CHECK_ARG(a.group >= 1 && a.group <= 8, "group", a.group, "1 to 8 query heads per KV head");
  with_formats(kf, vf, [&](auto k, auto v) {
    if (head_dim == 64) launch<k.value, v.value, 64>(a, stream);
    else launch<k.value, v.value, 128>(a, stream);
  });
}

}  // namespace lowbit::kv::attention_mma
