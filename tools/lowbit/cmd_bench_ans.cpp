// `lowbit bench ans`: entropy-coded weights on the GPU (src/ans/ans_bench.cu).
//
//   1. the seed's Figure 2: chains of K (20) square products on the seed's data
//      for each size, every method (cuBLAS SGEMV fp32, cuBLASLt int8 with the
//      vector padded to 32 columns, lowbit's int8 GEMV, the seed-faithful MATVANS
//      kernel on the seed container, lowbit's fused kernel on the lowbit
//      container), resident and with the weights copied from pinned host memory;
//   2. the targets on 4-bit per-group codes (entropy <= 5 bits):
//      single products (fused over a few tile geometries vs the int8 GEMV and the
//      cuBLAS baselines), decode rate in symbols per clock per SM, fraction of the
//      copy bandwidth on compressed bytes, and chains with copies against
//      int8 time x compressed / int8 bytes + 10%.
// Every method's final vector is checked against the CPU reference first.
#include <string>
#include <vector>

#include "commands.h"
#include "lowbit/ans/ans_cuda.h"

namespace lowbit::cli {

void add_bench_ans_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand(
      "ans",
      "Entropy-coded weights: the seed's Figure 2 (chains of K products, sizes 512..8192, every method,\n"
      "resident and with weight copies from pinned host memory) and the issue's targets for the fused\n"
      "lowbit kernel on 4-bit per-group codes; a summary table puts the targets beside the measurements.\n"
      "L2 flushed before every timed call, median of the reps, CPU reference checked first.");
  static ans::AnsBenchOptions options;
  static bool no_figure2 = false, no_targets = false;
  cmd->add_option("--sizes", options.figure2_sizes, "Figure 2 matrix sizes N (N x N), comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{16}, int64_t{65536}))
      ->capture_default_str();
  cmd->add_option("--target-sizes", options.target_sizes, "Sizes for the targets, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{16}, int64_t{65536}))
      ->capture_default_str();
  cmd->add_option("--layers", options.layers, "K: matrices per chain")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--reps", options.reps, "Timed calls per resident point")->check(at_least(1))->capture_default_str();
  cmd->add_option("--copy-reps", options.copy_reps, "Timed calls per point with copies")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--seed", options.seed, "Seed of the synthetic weights")->capture_default_str();
  cmd->add_flag("--no-figure2", no_figure2, "Skip Figure 2");
  cmd->add_flag("--no-targets", no_targets, "Skip the targets");
  cmd->add_option("--json", options.json_path, "Write one JSON row per measurement to this file");
  cmd->callback([] {
    options.figure2 = !no_figure2;
    options.targets = !no_targets;
    ans::run_ans_benchmark(options);
  });
}

}  // namespace lowbit::cli
