// How w4a16_tune (w4a16_gemm.h) picks among the K splits it timed for the
// gemv strategy. Plain C++ header, so that the rule is tested on the CPU.
#pragma once

#include <cstdint>
#include <span>

namespace lowbit {

struct TimedGemvSplit {
  int split = 1;      // K split over the CTAs of a column block
  double us = 0.0;    // median time of the GEMM alone
};

// A larger split is taken only when it beats the split taken so far by more
// than `margin` (a fraction: 0.03 is 3%); the splits are visited smallest
// first, whatever their order in `timed`. Why: the tuner times each GEMM
// alone, where a larger split's extra CTAs and partial sums cost little,
// while inside a replayed decode step they sit on the critical path
// (Qwen3-14B's gate/up projection: split 8 timed within 1% of split 4 alone,
// and its step was 5% slower; docs/engine.md, v12). Returns the chosen
// split; Error(invalid_argument) for an empty list or a split < 1.
int choose_gemv_split(std::span<const TimedGemvSplit> timed, double margin);

// The margin w4a16_tune uses.
inline constexpr double kGemvSplitMargin = 0.03;

// The gemv K split used untimed (`auto` at 1-4 rows, and the gemv strategy
// with split_k 0): about 16 k-iterations (1024 rows of K) per CTA, at most
// 16 ways, and more where the grid would leave most SMs idle (fewer CTAs
// than half of `sms`: up to `sms` CTAs, keeping 4 k-iterations per CTA).
// Then, at one row (`rows` == 1), for a grid of more CTAs than `sms` x
// `ctas_per_sm` (resident at once) whose last round would be less than a
// quarter full, one split fewer where that fills the last round better: in
// a Qwen3-14B decode step whose GEMMs let the next kernel launch early, its
// gate/up GEMM at split 4 (1.65 rounds) instead of 5 (2 rounds and 6%) made
// the batch-1 step 0.9% faster; at 2-3 rows the same change made the step
// 0.3-0.7% slower, so it is not made there (docs/engine.md, v29).
// From the H100 M = 1 sweeps of the nine benchmark shapes (docs/w4a16-gemm.md,
// v26): the best measured split or within 3% of it on seven shapes; 7% off
// on Qwen3-14B's qkv (split 4 best; the o projection, as many k-iterations,
// wants 5). iters: k-iterations of 64 rows; col_blocks: the grid's
// 128-column blocks; ctas_per_sm: the kernel's resident CTAs per SM; rows:
// the rows of x (M).
// Error(invalid_argument) for iters, col_blocks, sms, ctas_per_sm or rows
// below 1.
int gemv_split_rule(int iters, int64_t col_blocks, int sms, int ctas_per_sm, int64_t rows);

}  // namespace lowbit
