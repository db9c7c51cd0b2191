// The sm_90a W4A16 kernel (w4a16_wgmma.cu), internal to the module: the
// strategy W4A16Strategy::wgmma of w4a16_gemm.h. Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "w4a16_kernel_args.h"

namespace lowbit::w4a16_detail {

using WgmmaArgs = TiledGemmArgs;

// Output columns per CTA tile (two warpgroups of 64).
inline constexpr int kWgmmaColsPerTile = 128;
// Whether this build holds sm_90a code that runs on `device` (a probe kernel
// reports it; cached per device).
bool wgmma_supported(int device);
// The 64-row tile is built twice: for two resident CTAs per SM, and for
// three (`dense`, 80 registers per thread), which hides more of each
// warpgroup's dequantize-then-wgmma chain (choose_wgmma_dense,
// w4a16_wave_rule.h, says when).
inline constexpr int kWgmmaDenseRows = 64;
// CTAs per SM the kernel for `rows_per_tile` (and `dense`) can keep resident.
int wgmma_ctas_per_sm(int rows_per_tile, bool bf16, bool dense = false);
// Tail tiles (args.tail_tiles, w4a16_wave_rule.h) need tiles of at least
// this many rows: the decode tiles balance their CTAs by split_k alone, and
// their kernels do not carry the tail's fix-up code.
inline constexpr int kWgmmaMinTailRows = 64;
// At most one scale group per k-iteration of 64 rows of K: groups of 64+
// rows, or per channel (group_shift < 0). The kernel has instances for
// either case (kOneGroup in w4a16_wgmma.cu).
bool wgmma_one_scale_group(int group_shift);
// The tiles whose kernel applies the scales after the wgmma (kScaleAfter in
// w4a16_wgmma.cu), where wgmma_scale_after_applies says so: 16 rows. (v40
// had 32 too; since v41's shorter k-loop the 32-row tile is 4-7% faster
// without it: docs/w4a16-gemm.md, v41.)
inline constexpr int kScaleAfterMaxRows = 16;
// True for tiles of at most kScaleAfterMaxRows rows, integer zero points and at most one
// scale group per k-iteration (groups of 64+ rows or per channel), unless the
// environment sets LOWBIT_WGMMA_SCALE_AFTER=0 (to measure without it).
bool wgmma_scale_after_applies(int rows_per_tile, bool float_zero, int group_shift);
// The kernels that hold the shared fix-up of K splits (W4A16Plan::shared_fixup):
// the 64-row tile's two-CTA build, and the 128- and 256-row tiles.
// At most kWgmmaSharedFixupMaxSplits K splits per tile (its counter word
// holds a bit per split).
constexpr int kWgmmaSharedFixupMaxSplits = 24;
constexpr bool wgmma_shared_fixup_built(int rows_per_tile, bool dense) {
  return (rows_per_tile == 64 && !dense) || rows_per_tile == 128 || rows_per_tile == 256;
}
// grid = (ceil(M / rows_per_tile), ceil(N_pad / 128), split_k), or with tail
// tiles one CTA per whole tile plus tail_split per tail tile, or with
// stream-K stream_k_ctas CTAs (tiles of kWgmmaMinTailRows+ rows as well).
// dense: the three-CTA build (rows_per_tile == kWgmmaDenseRows only).
void launch_wgmma(const WgmmaArgs& args, int rows_per_tile, bool dense, bool bf16, bool float_zero,
                  cudaStream_t stream);

}  // namespace lowbit::w4a16_detail
