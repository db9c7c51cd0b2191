// What the host passes to the W4A16 kernels that take the problem whole (the
// sm_90a wgmma kernel and the decode gemv kernel, sm_80 and later), internal
// to the module. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::w4a16_detail {

// gemv, W4A16Options::attention_inputs (w4a16_gemm.h): the fields of
// W4A16AttentionInputs as the kernel takes them.
struct AttentionInputsArgs {
  const void* q_norm;
  const void* k_norm;
  const int32_t* positions;
  const float* inv_freq;
  float* q_out;
  float* k_out;
  float* v_out;
  int heads, kv_heads, head_dim;
  float eps;
  bool interleaved;
  const float* q_signs;  // non-null: q_out gets the Hadamard-rotated query times q_scale
  float q_scale;
};

struct TiledGemmArgs {
  const void* x;  // [M, K] (already permuted for act-order), row stride ldx, rows 16-byte aligned
  int64_t ldx;
  const uint4* qweight;  // tiled layout (w4a16_layout.h)
  const uint32_t* scale_zero;
  void* y;  // [M, N], row stride ldy
  int64_t ldy;
  float* partial;  // split_k > 1: [split_k, M, N_pad] partial sums
  int* counters;   // split_k > 1: one per output tile (two with shared_fixup), zero between calls
  int M, K, N, N_pad;
  int iters;        // K_pad / 64
  int group_shift;  // log2(group size), or -1 for per channel
  int split_k;
  // wgmma: the last tail_tiles output tiles (of the tile order, group_rows)
  // are split along K tail_split ways and every other tile is whole (split_k
  // is then 1):
  // a grid of tiles that leaves its last wave of resident CTAs mostly empty
  // spreads that wave's work over the SMs. 0: every tile split split_k ways.
  int tail_tiles;
  int tail_split;
  // wgmma, 0 otherwise: stream-K over this many CTAs (>= the tile count;
  // split_k 1, no tail tiles): the grid's k-iterations, tile after tile,
  // cut into equal contiguous ranges (w4a16_wave_rule.h). Partials: one
  // slot of a whole tile's accumulators per CTA; counters: one per tile.
  int stream_k_ctas;
  // wgmma K splits and tail tiles (not stream-K): the splits of a tile share
  // its fix-up (W4A16Plan::shared_fixup): counters then holds two ints per
  // tile, [0, tiles) the arrivals and give-up bits, [tiles, 2 tiles) the
  // departures.
  bool shared_fixup;
  // wgmma without stream-K: the tiles are handed out in groups of this many
  // row tiles, column tiles in turn, row tiles fastest in a group
  // (choose_wgmma_group_rows); 0 or >= the row tiles: row tiles fastest over
  // the whole grid.
  int group_rows;
  int64_t x_up_offset;  // gemv: 0, or x holds gate | up and the kernel reads silu(gate) * up (up at x + x_up_offset)
  // gemv, W4A16Options: residual add in the epilogue (y read and written)
  // with per-row sums of squares per column block out, and RMSNorm of x.
  float* residual_row_sq;
  const void* x_norm_weight;  // non-null: x is normalized while staged
  const float* x_norm_row_sq;
  int x_norm_blocks;
  float x_norm_eps;
  // gemv: let the next kernel launch before this one's wait (weights large
  // enough that its launch hides behind their stream), else after the K loop.
  bool early_dependents;
  // gemv, set by launch_gemv: (1 << gemv_fold_shift) - 1, the k-iterations of
  // a fold window less one. Read from the kernel's constant bank at each use:
  // rebuilt from the shift, it cost two instructions per k-iteration (v39).
  int gemv_fold_mask;
  bool attention_inputs;  // y is not written: `attention` is
  AttentionInputsArgs attention;
  // Host side only (the launch, not the kernel): W4A16Options::l2_streaming,
  // the bytes of qweight read through an L2 streaming window, or 0.
  size_t weight_stream_bytes;
};

// TiledGemmArgs::group_shift of a (power-of-two) group size; -1 per channel
// (group_size <= 0).
inline int group_shift_of(int group_size) {
  return group_size > 0 ? __builtin_ctz(static_cast<unsigned>(group_size)) : -1;
}

}  // namespace lowbit::w4a16_detail
