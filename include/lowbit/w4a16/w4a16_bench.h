// The W4A16 GEMM benchmark behind `lowbit bench gemm`: every strategy and
// `auto` beside cuBLAS FP16 on the same problem, in one run, on the nine layer
// shapes of the peer anchors. Plain C++ header: a build without CUDA links a
// version that throws Error(unsupported).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lowbit/core/dtype.h"

namespace lowbit {

struct W4A16BenchShape {
  const char* label;
  int64_t K, N;
};
// sq4096, sq8192, sq16384, qwen3-qkv, qwen3-o, qwen3-gateup, qwen3-down,
// llama70-gateup, llama70-down (K x N as in the shared anchors).
std::span<const W4A16BenchShape> w4a16_bench_shapes();

struct W4A16BenchOptions {
  std::vector<std::string> shapes;  // labels; empty = all nine
  std::vector<int64_t> ms = {1, 16, 32, 64, 128, 256, 1024};
  int reps = 50;                    // timed calls per point (median reported)
  int group_size = 128;
  DType dtype = DType::f16;         // activations and outputs (cuBLAS baseline is fp16)
  std::string json_path;            // JSON rows, one per line, when not empty
  // Extra rows "lowbit_wgmma_r<R>" with the wgmma tile forced to R rows (16..256;
  // tiles more than twice M are skipped), to measure the tile choice of auto.
  std::vector<int> wgmma_tiles;
  // Strategy names (w4a16_strategy_name) to time; empty = every strategy the
  // device runs. cuBLAS FP16 is always timed: it is the baseline.
  std::vector<std::string> strategies;
  // Extra rows "lowbit_gemv_s<S>" with the gemv strategy's K split forced to
  // S, M <= 16.
  std::vector<int> gemv_splits;
  // Extra rows "lowbit_wgmma_t<S>": the wgmma strategy with its tail split
  // (W4A16Options::tail_split) forced to S, 1 meaning none; only at points
  // whose plan has leftover tiles to split.
  std::vector<int> wgmma_tail_splits;
  // Extra rows "lowbit_wgmma_sk<G>": the wgmma strategy with stream-K over
  // G CTAs forced (W4A16Options::stream_k_ctas), 1 meaning none; only at
  // points whose grid has fewer tiles than a wave.
  std::vector<int> wgmma_stream_k_ctas;
  // Extra rows "lowbit_wgmma_c<C>": the wgmma strategy with the 64-row
  // tile's build for C resident CTAs per SM forced, C = 2 or 3
  // (W4A16Options::wgmma_ctas_per_sm); only at points that run 64-row tiles.
  std::vector<int> wgmma_ctas_per_sm;
  // Extra rows "lowbit_wgmma_g<G>": the wgmma strategy with its tiles handed
  // out in groups of G row tiles (W4A16Options::wgmma_group_rows; G >= the
  // row tiles: the plain row-major order); not at points that run stream-K.
  std::vector<int> wgmma_group_rows;
  // Extra rows "lowbit_auto_rr<V>": auto with W4A16Options::row_remainder = V
  // (1: one GEMM; 2: the rows past the last whole 256-row tile always as a
  // second one); only at M > 256 with such rows.
  std::vector<int> row_remainders;
  // Extra rows "lowbit_auto_sf<V>": auto with W4A16Options::shared_fixup =
  // V (1: the last CTA of a split tile sums its partials alone, and short K
  // on 64- and 128-row tiles runs stream-K again); only at points where V
  // changes auto's plan.
  std::vector<int> shared_fixups;
  // Extra rows "read_floor" at M <= 64: a kernel that only reads as many
  // bytes as the W4 weights and scales, timed the same way: the ceiling of
  // any W4A16 kernel's speedup under this timer and flush.
  bool read_floor = false;
  // Evict L2 between calls by reading a large buffer (clean lines) rather
  // than writing it (dirty lines whose write-back the timed call pays; the
  // peers' anchors were taken that way): see CudaTimerOptions.
  bool flush_by_reading = false;
  // Milliseconds of idle device before each row's warm-up
  // (CudaTimerOptions::settle_ms), so that no row is timed in the wake of a
  // heavy point before it.
  int settle_ms = 50;
};

// Runs the benchmark on device 0, printing one line per measurement and a
// summary (geometric-mean speedup over cuBLAS FP16 per M, Marlin's from the
// anchors beside it, M = 1 bandwidth against the measured copy bandwidth).
// Throws Error(invalid_argument) for an unknown shape label or M < 1.
void run_w4a16_gemm_benchmark(const W4A16BenchOptions& options);

}  // namespace lowbit
