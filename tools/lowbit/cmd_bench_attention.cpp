// `lowbit bench attention`: decode attention on the paged TurboQuant KV cache
// (tq4) beside our FP16 paged kernel and the torch SDPA anchors, plus the cost
// of quantizing a long prefill's K/V.
#include <string>
#include <vector>

#include "commands.h"
#include "lowbit/kv/attention_bench.h"

namespace lowbit::cli {

void add_bench_attention_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "attention",
      "KV-cache decode attention, Qwen3-14B geometry (40 query heads over 8 KV heads, d = 128): tq4 K/V\n"
      "vs our FP16 paged kernel vs torch SDPA (--sdpa, else the H100 anchors), random paged caches, L2 flushed before every\n"
      "timed call, median of the reps; bytes per token and GB/s on the K/V bytes read. Then the cost of\n"
      "quantizing a prefill's K/V against that prefill's attention. Prints a summary with the targets.");
  static KvAttentionBenchOptions options;
  cmd->add_option("--batch", options.batches, "Batch sizes, comma-separated")
      ->delimiter(',')
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--context", options.contexts, "Context lengths in tokens, comma-separated")
      ->delimiter(',')
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--page-size", options.page_size, "Tokens per page (a multiple of 16 in [16, 256])")
      ->check(CLI::Range(16, 256))
      ->capture_default_str();
  cmd->add_option("--reps", options.reps, "Timed calls per decode point")->check(at_least(1))->capture_default_str();
  cmd->add_option("--prefill-tokens", options.prefill_tokens, "Prefill length: times the K/V quantization and both prefill attention kernels, tiled and decode-per-token (0: skip)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--prefill-reps", options.prefill_reps, "Timed calls of each prefill attention kernel")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--split-tokens", options.split_tokens,
                  "KV chunk lengths per CTA (multiples of 16, comma-separated) to time besides the one chosen\n"
                  "by the split heuristic, for decode and for the tiled prefill (--prefill-tokens); their rows\n"
                  "are marked split_forced")
      ->delimiter(',')
      ->check(at_least(1));
  cmd->add_option("--cta-warps", options.cta_warps,
                  "CTA layouts of the tq4 decode kernel (8 or 16 warps per CTA, comma-separated) to time besides\n"
                  "the one chosen by the work per call, each with its own chunk length and every --split-tokens\n"
                  "value; their rows are marked cta_warps_forced")
      ->delimiter(',')
      ->check(CLI::IsMember({8, 16}));
  static std::string rotation = "hadamard";
  cmd->add_option("--rotation", rotation,
                  "Rotation of the tq4 cache: hadamard (the signs and a fast Walsh-Hadamard transform, done inside\n"
                  "the attention kernels; the engine's default at head_dim 128) or haar (a 64 KB matrix per layer,\n"
                  "read by a query rotation kernel and by the output's un-rotation)")
      ->check(CLI::IsMember({"haar", "hadamard"}))
      ->capture_default_str();
  cmd->add_flag("--read-floor", options.read_floor,
                "Also time a kernel that only reads the tq4 cache's bytes at each point (row read_floor; "
                "summary columns 'floor us' and 'floor/SDPA'): the ceiling of any tq4 decode kernel under the "
                "same timing");
  cmd->add_flag("!--no-cluster-merge", options.cluster_merge,
                "Merge the KV chunks with the merge kernel even where a cluster of the attention's CTAs could\n"
                "(rows of at most 8 chunks)");
  static std::string sdpa_path;
  cmd->add_option("--sdpa", sdpa_path,
                  "Torch SDPA times measured on this GPU, as JSON rows (scripts/bench_torch_peers.py --what sdpa\n"
                  "--out FILE writes them), for the SDPA column and ratios; without it that column holds the\n"
                  "anchors' H100 times, which compare two GPUs on any other device")
      ->check(CLI::ExistingFile);
  cmd->add_option("--json", options.json_path, "Write one JSON row per measurement to this file");
  add_l2_flush_option(*cmd, options.flush_by_reading);
  cmd->add_option("--settle-ms", options.settle_ms,
                  "Milliseconds the GPU idles before each decode row's warm-up, so that no row is timed in the wake\n"
                  "of a heavier point before it (0: none; scripts/bench_torch_peers.py idles as long by default)")
      ->capture_default_str()
      ->check(CLI::Range(0, 60000));
  add_gpu_environment_footer(*cmd);
  cmd->callback([] {
    options.hadamard = rotation == "hadamard";
    if (!sdpa_path.empty()) {
      options.sdpa_measured = read_sdpa_baseline_rows(sdpa_path);
      options.sdpa_source = sdpa_path;
    }
    run_kv_attention_benchmark(options);
  });
}

}  // namespace lowbit::cli
