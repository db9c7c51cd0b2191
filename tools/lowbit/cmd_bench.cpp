// `lowbit bench`: the benchmarks users run on their own GPU. Each subcommand
// times lowbit beside its baseline in the same run and can write JSON rows.
#include <string>
#include <vector>

#include "commands.h"
#include "lowbit/w4a16/w4a16_bench.h"

namespace lowbit::cli {

void add_l2_flush_option(CLI::App& cmd, bool& flush_by_reading) {
  cmd.add_option_function<std::string>(
         "--l2-flush", [&flush_by_reading](const std::string& how) { flush_by_reading = how == "read"; },
         "How L2 is evicted before each timed call: 'write' (a memset, as the peers' anchors were taken; it "
         "leaves dirty lines that the timed call writes back while it reads) or 'read' (clean lines, as a "
         "decode step finds them). Default: write")
      ->check(CLI::IsMember({"write", "read"}));
}

void add_gpu_environment_footer(CLI::App& cmd) {
  cmd.footer(
      "Environment: LOWBIT_L2_STREAMING=0 reads the 4-bit weights and the KV cache without the L2 streaming\n"
      "windows that calls reading them once get by default; LOWBIT_PDL=0 launches without programmatic\n"
      "dependent launch; LOWBIT_WGMMA_SCALE_AFTER=0 runs the 16-row W4A16 wgmma tile with a multiply\n"
      "per weight instead of the scale after the product. All are for measuring without them.");
}

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks on the GPU, each with its baseline timed in the same run");
  bench->require_subcommand(1);

  auto* gemm = bench->add_subcommand(
      "gemm",
      "W4A16 GEMM: every strategy (data_parallel, split_k_atomic, split_k_deterministic, stream_k,\n"
      "decoupled, wgmma and gemv on sm_90a) and auto beside cuBLAS FP16, on the nine anchor layer shapes,\n"
      "random data, L2 evicted before every timed call (--l2-flush), median of the reps. Prints a line per\n"
      "measurement and a summary: geometric-mean speedup over cuBLAS per M (Marlin's from the anchors\n"
      "beside it) and the M = 1 bandwidth against the measured copy bandwidth.");
  static W4A16BenchOptions options;
  static std::string dtype = "f16";
  std::vector<std::string> labels;
  for (const auto& s : w4a16_bench_shapes()) labels.push_back(s.label);
  gemm->add_option("--shapes", options.shapes, "Layer shapes to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(labels));
  gemm->add_option("--m", options.ms, "Values of M, comma-separated")
      ->delimiter(',')
      ->check(at_least(1))
      ->capture_default_str();
  gemm->add_option("--reps", options.reps, "Timed calls per point")->check(at_least(1))->capture_default_str();
  gemm->add_option("--group-size", options.group_size, "Quantization group size")
      ->check(CLI::IsMember({32, 64, 128, 256, -1}))
      ->capture_default_str();
  gemm->add_option("--dtype", dtype, "Activation dtype: f16 or bf16 (the cuBLAS baseline is fp16)")
      ->check(CLI::IsMember({"f16", "bf16"}))
      ->capture_default_str();
  gemm->add_option("--json", options.json_path, "Write one JSON row per measurement to this file");
  gemm->add_option("--wgmma-tiles", options.wgmma_tiles,
                   "Also time the wgmma strategy with these tile rows forced (16,32,64,128,256; sm_90a only)")
      ->delimiter(',')
      ->check(CLI::IsMember({16, 32, 64, 128, 256}));
  gemm->add_option("--strategies", options.strategies,
                   "Time only these strategies (comma-separated: auto, data_parallel, split_k_atomic, "
                   "split_k_deterministic, stream_k, decoupled, wgmma, gemv; default: all this device runs)")
      ->delimiter(',')
      ->check(CLI::IsMember({"auto", "data_parallel", "split_k_atomic", "split_k_deterministic", "stream_k",
                             "decoupled", "wgmma", "gemv"}));
  gemm->add_option("--gemv-splits", options.gemv_splits,
                   "Also time the gemv strategy with these K splits forced (M <= 16 only)")
      ->delimiter(',')
      ->check(at_least(1));
  gemm->add_option("--wgmma-tail-splits", options.wgmma_tail_splits,
                   "Also time the wgmma strategy with the leftover tiles of a partly filled last wave split "
                   "this many ways along K (1: no split; points without such tiles are skipped; sm_90a only)")
      ->delimiter(',')
      ->check(at_least(1));
  gemm->add_option("--wgmma-stream-k", options.wgmma_stream_k_ctas,
                   "Also time the wgmma strategy with stream-K over this many CTAs (1: none, the uniform K "
                   "split or the tail split; fewer CTAs than tiles: ranges of several tiles; points on tiles "
                   "of fewer than 64 rows are skipped; sm_90a only)")
      ->delimiter(',')
      ->check(at_least(1));
  gemm->add_option("--wgmma-ctas-per-sm", options.wgmma_ctas_per_sm,
                   "Also time the wgmma strategy with the 64-row tile built for this many resident CTAs per SM "
                   "(2 or 3; points that run other tiles are skipped; sm_90a only)")
      ->delimiter(',')
      ->check(CLI::IsMember({2, 3}));
  gemm->add_option("--wgmma-group-rows", options.wgmma_group_rows,
                   "Also time the wgmma strategy with its output tiles handed out in groups of this many row "
                   "tiles, every column tile in turn (a count >= the row tiles: row tiles fastest over the "
                   "whole grid, the order without groups; points that run stream-K are skipped; sm_90a only)")
      ->delimiter(',')
      ->check(at_least(1));
  gemm->add_option("--row-remainder", options.row_remainders,
                   "Also time auto with the rows past the last whole 256-row tile run as a second GEMM: 1 never, "
                   "2 always (points of M <= 256 or a multiple of 256 are skipped; auto's own rule decides in "
                   "the plain auto row; sm_90a only)")
      ->delimiter(',')
      ->check(CLI::IsMember({1, 2}));
  gemm->add_option("--shared-fixup", options.shared_fixups,
                   "Also time auto with the K splits' fix-up of each tile set: 1 summed by the tile's last CTA "
                   "alone (and short K on 64- and 128-row tiles as stream-K, the choice without it), 0 the rule "
                   "(shared by the tile's CTAs where all of them fit in one wave), 2 shared past one wave too "
                   "(CTAs that wait for splits not yet resident give up after 20 us); points where the value "
                   "does not change auto's plan are skipped; sm_90a only")
      ->delimiter(',')
      ->check(CLI::IsMember({0, 1, 2}));
  gemm->add_flag("--read-floor", options.read_floor,
                 "Also time, at M <= 64, a kernel that only reads as many bytes as the W4 weights and scales "
                 "(row read_floor): the most any W4A16 kernel could gain over cuBLAS under the same timing");
  add_l2_flush_option(*gemm, options.flush_by_reading);
  gemm->add_option("--settle-ms", options.settle_ms,
                   "Milliseconds the GPU idles before each row's warm-up, so that no row is timed in the wake "
                   "of a heavy point before it (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 60000));
  add_gpu_environment_footer(*gemm);
  gemm->callback([] {
    options.dtype = dtype == "bf16" ? DType::bf16 : DType::f16;
    run_w4a16_gemm_benchmark(options);
  });

  add_bench_ans_command(*bench);
  add_bench_attention_command(*bench);
  add_bench_model_command(*bench);
}

}  // namespace lowbit::cli
