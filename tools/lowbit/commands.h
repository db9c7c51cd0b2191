// The subcommands of the `lowbit` command. Each file cmd_<name>.cpp adds one
// subcommand to the app; its callback throws lowbit::Error on failure and
// main() turns that into a message and exit code 1 (usage errors: 2).
#pragma once

#include <CLI/CLI.hpp>

namespace lowbit::cli {

// A number option's lower bound, for the counts and sizes of every command:
// "--m: must be at least 1, got 0". Why not CLI11's PositiveNumber and
// NonNegativeNumber: CLI11 2.1 words them as a range of doubles ("Value 0 not
// in range 0.000000 to 17976931348623157081...", 300 digits).
CLI::Validator at_least(long long lower_bound);

void add_env_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_dequantize_command(CLI::App& app);
void add_kv_command(CLI::App& app);
void add_ans_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_bench_command(CLI::App& app);
// Under `bench` (one file each, cmd_bench_<name>.cpp), added by add_bench_command.
void add_bench_ans_command(CLI::App& bench);
void add_bench_attention_command(CLI::App& bench);
void add_bench_model_command(CLI::App& bench);

// The GPU benchmarks' --l2-flush option: how L2 is evicted before each timed
// call, 'write' (a memset, as the peers' anchors were taken; it leaves dirty
// lines that the timed call writes back) or 'read' (clean lines, the state a
// decode step finds). Sets flush_by_reading when the option is parsed.
void add_l2_flush_option(CLI::App& cmd, bool& flush_by_reading);

// The help footer of the GPU benchmarks: the environment switches that turn
// off what their kernels use by default (LOWBIT_L2_STREAMING, LOWBIT_PDL), to
// measure without it.
void add_gpu_environment_footer(CLI::App& cmd);

}  // namespace lowbit::cli
