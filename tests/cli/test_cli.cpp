// The `lowbit` command as a user meets it: exit codes (0 ok, 2 usage, 1 other
// errors), messages that name the problem, --help on every command, and the
// quantize -> inspect -> dequantize round trip on a checkpoint made here.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>

#include "lowbit/core/half.h"
#include "lowbit/io/safetensors.h"

namespace fs = std::filesystem;

#include "cli_runner.h"

namespace {

using RunResult = lowbit::test::CliResult;
using lowbit::test::run_lowbit;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("lowbit-cli-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// A one-block Llama-like checkpoint: q_proj [N=64, K=128] and an embedding.
void write_small_checkpoint(const fs::path& dir, int64_t K = 128) {
  fs::create_directories(dir);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<lowbit::f16> q_proj(static_cast<size_t>(64 * K)), embed(32 * 16);
  for (auto& v : q_proj) v = lowbit::float_to_f16(normal(rng));
  for (auto& v : embed) v = lowbit::float_to_f16(normal(rng));
  lowbit::io::SafetensorsWriter writer;
  writer.add_copy("model.layers.0.self_attn.q_proj.weight", lowbit::DType::f16, {64, K},
                  std::as_bytes(std::span(q_proj)));
  writer.add_copy("model.embed_tokens.weight", lowbit::DType::f16, {32, 16}, std::as_bytes(std::span(embed)));
  writer.write(dir / "model.safetensors");
  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "vocab_size": 32, "torch_dtype": "float16"})";
  std::ofstream(dir / "tokenizer.json") << "{}";
}

TEST(Cli, HelpListsEveryCommandAndExitsZero) {
  const RunResult r = run_lowbit("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* command : {"env", "inspect", "quantize", "dequantize"})
    EXPECT_NE(r.output.find(command), std::string::npos) << command << "\n" << r.output;
  for (const char* command : {"env", "inspect", "quantize", "dequantize"}) {
    const RunResult sub = run_lowbit(std::string(command) + " --help");
    EXPECT_EQ(sub.exit_code, 0) << command << ": " << sub.output;
    EXPECT_NE(sub.output.find("Usage"), std::string::npos) << sub.output;
  }
  EXPECT_NE(run_lowbit("quantize --help").output.find("--group-size"), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_lowbit("").exit_code, 2);  // a command is required
  EXPECT_EQ(run_lowbit("frobnicate").exit_code, 2);
  EXPECT_EQ(run_lowbit("env --no-such-flag").exit_code, 2);
  const RunResult missing = run_lowbit("inspect /no/such/file.safetensors");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("/no/such/file.safetensors"), std::string::npos) << missing.output;
  TempDir tmp;
  write_small_checkpoint(tmp.path() / "in");
  const RunResult bad_group =
      run_lowbit("quantize " + (tmp.path() / "in").string() + " " + (tmp.path() / "out").string() + " --group-size 48");
  EXPECT_EQ(bad_group.exit_code, 2);
  EXPECT_NE(bad_group.output.find("48"), std::string::npos) << bad_group.output;
  EXPECT_FALSE(fs::exists(tmp.path() / "out"));
  EXPECT_EQ(run_lowbit("quantize " + (tmp.path() / "in").string() + " x --format marlin").exit_code, 2);
}

// bench gemm's options are checked before anything needs a GPU: its help
// names every strategy and the L2 eviction modes, and a bad mode is a usage
// error that names the value. Every GPU benchmark's help names the
// environment switches and its idle before each row (--settle-ms), whose
// out-of-range value is a usage error.
TEST(Cli, BenchGemmOptions) {
  const RunResult help = run_lowbit("bench gemm --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* word : {"--l2-flush", "write", "read", "gemv", "wgmma", "--gemv-splits", "--strategies"})
    EXPECT_NE(help.output.find(word), std::string::npos) << word << "\n" << help.output;
  // The GPU benchmarks name the switches that turn their defaults off.
  for (const char* command : {"bench gemm --help", "bench attention --help", "bench model --help"}) {
    const RunResult h = run_lowbit(command);
    EXPECT_EQ(h.exit_code, 0) << command << "\n" << h.output;
    for (const char* word : {"LOWBIT_L2_STREAMING=0", "LOWBIT_PDL=0", "--settle-ms"})
      EXPECT_NE(h.output.find(word), std::string::npos) << command << ": " << word << "\n" << h.output;
  }
  // Usage errors (exit 2) whose message names what was wrong: an idle out of
  // range, bench model's forced gemv splits with a malformed entry or with
  // the tuner beside them, an unknown L2 mode or strategy.
  const std::pair<const char*, const char*> usage_errors[] = {
      {"bench gemm --settle-ms -1", "--settle-ms"},
      {"bench attention --settle-ms -1", "--settle-ms"},
      {"bench model --settle-ms 70000", "--settle-ms"},
      {"bench model --random-weights --gemv-splits qkv=4,attention=2", "unknown role 'attention'"},
      {"bench model --random-weights --gemv-splits qkv=4 --tune-gemms", "excludes"},
      {"bench gemm --l2-flush sideways", "sideways"},
      {"bench gemm --strategies gemv,sideways", "sideways"},
      // Counts below their bound say so in words (CLI11's own check printed a
      // 300-digit double range), and a thread count past lowbit::kMaxThreads
      // is refused before a pool of them starts.
      {"bench gemm --m 1,0", "--m: must be at least 1, got 0"},
      {"bench gemm --m 1,x", "'x' is not a number"},
      {"bench attention --batch 0", "--batch: must be at least 1, got 0"},
      {"bench model --reps 0", "--reps: must be at least 1, got 0"},
      {"generate --kv-fp16-window -1", "--kv-fp16-window: must be at least 0, got -1"},
      {"generate --threads 100000 --prompt hi", "--threads"},
  };
  for (const auto& [command, needle] : usage_errors) {
    const RunResult r = run_lowbit(command);
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << command << ": " << needle << "\n" << r.output;
    EXPECT_EQ(r.output.find("0.000000"), std::string::npos) << command << "\n" << r.output;
  }
  // LOWBIT_NUM_THREADS is read strictly: a malformed value is an error (exit 1) that names it.
  // (The child inherits this process's environment; no other test here reads the variable.)
  ::setenv("LOWBIT_NUM_THREADS", "8x", 1);
  const RunResult bad_threads = run_lowbit("env");
  ::unsetenv("LOWBIT_NUM_THREADS");
  EXPECT_EQ(bad_threads.exit_code, 1) << bad_threads.output;
  EXPECT_NE(bad_threads.output.find("LOWBIT_NUM_THREADS"), std::string::npos) << bad_threads.output;
}

TEST(Cli, VersionAndEnv) {
  const RunResult version = run_lowbit("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find("lowbit"), std::string::npos);
  const RunResult env = run_lowbit("env");
  EXPECT_EQ(env.exit_code, 0) << env.output;
  EXPECT_NE(env.output.find("cpu:"), std::string::npos) << env.output;
  EXPECT_NE(env.output.find("build:"), std::string::npos) << env.output;
  const RunResult json = run_lowbit("env --json");
  EXPECT_EQ(json.exit_code, 0);
  EXPECT_NE(json.output.find("\"gpus\""), std::string::npos) << json.output;
}

TEST(Cli, MalformedFileExitsOneAndNamesTheFile) {
  TempDir tmp;
  const fs::path bad = tmp.path() / "broken.safetensors";
  std::ofstream(bad, std::ios::binary) << std::string("\xff\xff\xff\xff\x00\x00\x00\x00{", 9);
  const RunResult r = run_lowbit("inspect " + bad.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("broken.safetensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("header"), std::string::npos) << r.output;
}

// A corrupt .gguf file is reported as a GGUF file (by its name), not as a
// safetensors file, whatever its first bytes.
TEST(Cli, MalformedGgufIsReportedAsGguf) {
  TempDir tmp;
  const fs::path bad = tmp.path() / "broken.gguf";
  std::ofstream(bad, std::ios::binary) << std::string("garbage, not a model\n");
  const RunResult r = run_lowbit("inspect " + bad.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("broken.gguf"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GGUF"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("safetensors"), std::string::npos) << r.output;
}

TEST(Cli, QuantizeInspectDequantizeRoundTrip) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in", out = tmp.path() / "out";
  write_small_checkpoint(in);
  const RunResult q = run_lowbit("quantize " + in.string() + " " + out.string() + " --format awq --group-size 64");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("1 linear layers quantized"), std::string::npos) << q.output;
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));

  const RunResult inspect = run_lowbit("inspect " + out.string());
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("quantization: awq, 4 bits, group size 64"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("model.layers.0.self_attn.q_proj.qweight"), std::string::npos);

  const RunResult dq = run_lowbit("dequantize " + out.string() + " " + (tmp.path() / "dq.safetensors").string() +
                                  " --reference " + in.string());
  ASSERT_EQ(dq.exit_code, 0) << dq.output;
  const auto file = lowbit::io::SafetensorsFile::open(tmp.path() / "dq.safetensors");
  const auto* w = file.find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(file.find("model.layers.0.self_attn.q_proj.qweight"), nullptr);

  // A second quantize into the same, now non-empty, folder is refused...
  const RunResult again = run_lowbit("quantize " + in.string() + " " + out.string());
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_NE(again.output.find("--force"), std::string::npos) << again.output;
  // ...unless forced.
  EXPECT_EQ(run_lowbit("quantize " + in.string() + " " + out.string() + " --force --format gptq").exit_code, 0);
  EXPECT_NE(run_lowbit("inspect " + out.string()).output.find("quantization: gptq"), std::string::npos);
}

TEST(Cli, FailedQuantizeLeavesNothingBehind) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in", out = tmp.path() / "out";
  write_small_checkpoint(in, /*K=*/96);  // in_features 96 is not a multiple of group size 64
  const RunResult r = run_lowbit("quantize " + in.string() + " " + out.string() + " --group-size 64");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("q_proj"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& entry : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(entry.path().filename().string().find(".partial"), std::string::npos) << entry.path();
}

}  // namespace
