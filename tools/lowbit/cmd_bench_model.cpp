// `lowbit bench model`: the CUDA engine's decode and prefill speed on a
// full-size architecture with random weights.
#include <string>
#include <vector>

#include "commands.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/decode_gemv_splits.h"
#include "lowbit/engine/model_bench.h"

namespace lowbit::cli {

void add_bench_model_command(CLI::App& bench) {
  auto* model = bench.add_subcommand(
      "model",
      "Decode and prefill speed of a full-size decoder on the GPU with random weights made on the device\n"
      "(no checkpoint needed): fp16 vs w4 weights, fp16 vs tq4 KV, per batch size and context length.\n"
      "Each decode step is reported beside its bytes floor: the weights plus batch x context tokens of K/V,\n"
      "read once at the measured copy bandwidth. Configurations that do not fit in GPU memory are skipped.");
  static engine::ModelBenchOptions options;
  static bool random_weights = false;
  model->add_option("--config", options.config, "qwen3-14b, llama3-8b, or a config.json path")
      ->capture_default_str();
  model->add_flag("--random-weights", random_weights, "Use random weights (required: the only mode for now)");
  model->add_option("--weights", options.weights, "Weight formats: fp16, w4")
      ->delimiter(',')
      ->capture_default_str();
  model->add_option("--kv", options.kv, "KV formats: fp16, tq4, tq3, tq2")
      ->delimiter(',')
      ->capture_default_str();
  model->add_option("--kv-rotation", options.kv_rotation,
                    "TurboQuant rotation of the tq formats: haar (dense QR rotation, the seed's), hadamard\n"
                    "(random signs + fast Walsh-Hadamard; the qkv GEMM then also rotates q), or auto (hadamard\n"
                    "when head_dim is a power of two)")
      ->check(CLI::IsMember({"auto", "haar", "hadamard"}))
      ->capture_default_str();
  model->add_option("--kv-fp16-window", options.kv_fp16_window,
                    "With the tq formats: each sequence's newest N tokens also as fp16 copies, attended from\n"
                    "them (lowbit generate's --kv-fp16-window), to time what the window costs")
      ->check(at_least(0))
      ->capture_default_str();
  model->add_option("--batch", options.batches, "Batch sizes")
      ->delimiter(',')
      ->check(at_least(1))
      ->capture_default_str();
  model->add_option("--context", options.contexts, "Context lengths (tokens already in the cache)")
      ->delimiter(',')
      ->check(at_least(1))
      ->capture_default_str();
  model
      ->add_option("--max-prefill-context", options.max_prefill_context,
                   "Time prefill only for contexts up to this length")
      ->capture_default_str();
  model->add_option("--reps", options.reps, "Timed decode steps per point")
      ->check(at_least(1))
      ->capture_default_str();
  auto* tune = model->add_flag("--tune-gemms", options.tune_gemms,
                  "Run single-row W4A16 GEMMs with the plan timed fastest per layer shape when the engine is made "
                  "(each alone), instead of auto's plan (what lowbit generate runs by default). Slower in a whole "
                  "decode step on an H100: Qwen3-14B 228.6 against 249.7-249.9 tok/s at batch 1 in one run (docs/engine.md v28), and on an H200: 235.6 against 257-260 (v32)");
  static std::string gemv_splits;
  model->add_option("--gemv-splits", gemv_splits,
                    "Single-row GEMMs of these layer roles run the gemv kernel at this K split instead of auto's\n"
                    "(role=split, comma-separated; roles qkv, o, gate_up, down, lm_head), to time a split inside\n"
                    "whole decode steps rather than alone (bench gemm --gemv-splits)")
      ->check(CLI::Validator(
          [](std::string& text) {
            try {
              engine::parse_decode_gemv_splits(text);
              return std::string();
            } catch (const Error& e) {
              return std::string(e.what());
            }
          },
          "ROLE=SPLIT,..."))
      ->excludes(tune);
  model->add_flag("!--no-query-rotation-fusion", options.fuse_query_rotation,
                  "With a Hadamard rotation: rotate the queries in the attention kernel, not in the qkv GEMM's "
                  "epilogue");
  model->add_flag("!--no-kv-append-fusion", options.fuse_kv_append,
                  "Append each decode step's K/V with a kernel of its own, not inside the attention kernel");
  model->add_flag("!--no-graphs", options.graphs,
                  "Time decode steps launched eagerly, not replayed as CUDA graphs");
  model->add_flag("--breakdown", options.breakdown,
                  "After each decode and prefill measurement, time a few eager steps stage by stage (an event\n"
                  "after each GEMM, norm, attention...) and print where the step's time goes");
  model->add_option("--json", options.json_path, "Write one JSON row per measurement to this file");
  model->add_option("--settle-ms", options.settle_ms,
                  "Milliseconds the GPU idles before each measurement's warm-up, so that no row is timed in the wake\n"
                  "of a heavier point before it (0: none; with 50 ms, the one-row step right after the batch-16 /\n"
                  "32k point read 3.5% slow on an H200)")
      ->capture_default_str()
      ->check(CLI::Range(0, 60000));
  add_gpu_environment_footer(*model);
  model->callback([] {
    if (!random_weights) {
      fail(ErrorKind::unsupported,
           "bench model: only --random-weights is supported (checkpoints: lowbit generate)");
    }
    options.decode_gemv_splits = engine::parse_decode_gemv_splits(gemv_splits);
    engine::run_model_benchmark(options);
  });
}

}  // namespace lowbit::cli
