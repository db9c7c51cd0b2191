// The KV-cache attention benchmark behind `lowbit bench attention`: tq4 decode
// attention on the paged cache beside our own FP16 paged decode kernel (the
// same kernel reading fp16 K/V) and torch SDPA (the anchors measured on an
// H100, or times measured on this GPU and passed in), at the Qwen3-14B
// attention geometry (40 query heads over 8 KV
// heads, d = 128); plus the cost of quantizing a long prefill's K/V against
// that prefill's attention. Plain C++ header: a build without CUDA links a
// version that throws Error(unsupported).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lowbit {

// One torch SDPA decode time (FP16 K/V, GQA 40/8, d = 128) at a batch and context.
struct SdpaBaselinePoint {
  int batch = 0;
  int64_t context = 0;
  double us = 0;
};

struct KvAttentionBenchOptions {
  std::vector<int> batches = {1, 8, 32};
  std::vector<int64_t> contexts = {4096, 32768, 131072};
  int page_size = 128;
  int reps = 50;                   // timed calls per decode point (median reported)
  int64_t prefill_tokens = 32768;  // the prefill whose K/V quantization is timed; 0 skips it
  int prefill_reps = 3;            // timed calls of each prefill kernel (the per-token one: ~0.2 s at 32k)
  std::vector<int64_t> split_tokens;  // chunk lengths timed besides the chosen one (multiples of 16)
  // CTA layouts of the packed (tq4) decode kernel, 8 or 16 warps
  // (DeviceDecodeOptions::cta_warps), timed besides the chosen one, each with
  // the chunk length chosen for it and with every split_tokens value.
  std::vector<int> cta_warps;
  bool flush_by_reading = false;   // L2 eviction: false writes a buffer (as the SDPA anchors), true reads one
  // Milliseconds of idle device before each timed row's warm-up
  // (CudaTimerOptions::settle_ms), as `bench gemm` and
  // scripts/bench_torch_peers.py do, so that no row is timed in the wake of
  // the heavier point before it.
  int settle_ms = 50;
  bool hadamard = true;            // the tq4 cache's rotation: randomized Hadamard (the engine's default) or Haar
  bool cluster_merge = true;       // DeviceDecodeOptions::cluster_merge (false: the merge kernel always)
  // Also time, per point, a kernel that only reads the tq4 cache's bytes
  // (row "read_floor"): the ceiling of any tq4 decode kernel under this timer.
  bool read_floor = false;
  std::string json_path;           // JSON rows, one per line, when not empty
  // SDPA times measured on this GPU (scripts/bench_torch_peers.py); empty:
  // the anchors' H100 times, with a warning when the device is no H100.
  std::vector<SdpaBaselinePoint> sdpa_measured;
  std::string sdpa_source;         // where sdpa_measured came from (printed, and in the JSON rows)
};

// Reads the attn_decode rows of torch SDPA ({"kind": "attn_decode", "impl":
// "torch_sdpa_fp16", "B": .., "L": .., "us": ..}, one JSON object per line, as
// the anchors and scripts/bench_torch_peers.py write them). Other rows are
// skipped. Throws Error(io) for an unreadable file and Error(invalid_argument)
// for a line that is not JSON, a row with a missing or non-positive B, L or
// us, two rows for the same batch and context, or a file with no such row.
std::vector<SdpaBaselinePoint> read_sdpa_baseline_rows(const std::string& path);

// Runs on device 0, printing one line per measurement and a summary table
// with the targets beside the measurements. Configurations that do not
// fit in device memory are skipped with a message. Throws
// Error(invalid_argument) for a non-positive batch, context or reps.
void run_kv_attention_benchmark(const KvAttentionBenchOptions& options);

}  // namespace lowbit
