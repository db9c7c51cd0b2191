// `lowbit bench model`: decode and prefill speed of a full-size decoder on
// the GPU with random weights made on the device (no checkpoint needed):
// fp16 vs w4 weights, fp16 vs tq4 KV, over batch sizes and context lengths,
// beside the bytes floor (weights + KV bytes one step must read, at the
// measured copy bandwidth).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lowbit/engine/model_config.h"

namespace lowbit::engine {

// "qwen3-14b", "llama3-8b", or a path to a config.json.
ModelConfig bench_model_config(const std::string& name_or_path);

struct ModelBenchOptions {
  std::string config = "qwen3-14b";
  std::vector<std::string> weights = {"fp16", "w4"};
  std::vector<std::string> kv = {"fp16", "tq4"};
  // The TurboQuant rotation of the tq formats: "auto" (kv_rotation_for),
  // "haar" or "hadamard" (CudaEngineOptions::rotation).
  std::string kv_rotation = "auto";
  bool fuse_query_rotation = true;  // CudaEngineOptions::fuse_query_rotation_into_qkv
  bool fuse_kv_append = true;  // CudaEngineOptions::fuse_kv_append_into_attention
  int64_t kv_fp16_window = 0;  // CudaEngineOptions::fp16_window, for the tq formats
  std::vector<int> batches = {1, 16};
  std::vector<int64_t> contexts = {1024, 32768};
  // Prefill is timed for contexts up to this length (the prefill attention
  // kernel re-reads K/V per query token: long prefills take minutes).
  int64_t max_prefill_context = 4096;
  int reps = 20;
  // Milliseconds of idle device before each decode and prefill measurement
  // (CudaTimerOptions::settle_ms). On an H200 the one-row w4 + tq4 step timed
  // 50 ms after the batch-16 / 32k point ran 3.5% slower than alone, and as
  // fast as alone after 1-3 s (docs/engine.md, v44). The heavy points hold
  // the GPU at its 700 W power cap (SM clock 1.35-1.7 GHz instead of 1.98);
  // that the cap's recovery is the cause is our reading, not proven.
  int settle_ms = 1000;
  bool graphs = true;  // also time the decode step replayed as a CUDA graph
  bool tune_gemms = false;  // CudaEngineOptions::tune_decode_gemms
  // CudaEngineOptions::decode_gemv_splits: role -> forced gemv split of the
  // single-row GEMMs (parse_decode_gemv_splits); empty: auto's plans.
  std::map<std::string, int> decode_gemv_splits;
  // After each decode and prefill measurement, time a few eager steps stage
  // by stage (StepBreakdown) and print where the step's time goes.
  bool breakdown = false;
  std::string json_path;
};

// Prints one line per measurement and a summary headed "==== model" with the
// issue's targets beside the results. Throws Error(unsupported) in a build
// without CUDA or on a machine without a GPU.
void run_model_benchmark(const ModelBenchOptions& options);

}  // namespace lowbit::engine
