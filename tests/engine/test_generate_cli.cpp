// `lowbit generate` run as a user runs it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "engine_test_util.h"
#include "lowbit/cuda/device.h"

namespace lowbit::test {
namespace {

TEST(GenerateCli, ExplainsAMissingDefaultModel) {
  // The child inherits the environment: point the cache somewhere empty.
  const char* old = std::getenv("LOWBIT_CACHE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("LOWBIT_CACHE_DIR", "/nonexistent/lowbit-cache", 1);
  const CliResult r = run_lowbit("generate --prompt hi");
  if (old) ::setenv("LOWBIT_CACHE_DIR", saved.c_str(), 1);
  else ::unsetenv("LOWBIT_CACHE_DIR");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("scripts/fetch-default-model"), std::string::npos) << r.output;
}

TEST(GenerateCli, CudaIsRefusedWithoutAGpu) {
  if (cuda_device_count() > 0) {
    GTEST_SKIP() << "a GPU is visible, so --device cuda is accepted here; tests/cuda/test_cuda_engine.cu covers "
                    "the CUDA backend";
  }
  // Refused before the model is loaded: the build has no CUDA or the machine no GPU.
  const CliResult r = run_lowbit("generate --device cuda --model " + golden_dir("llama").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unsupported: --device cuda: "), std::string::npos) << r.output;
}

TEST(GenerateCli, BadInputsFailCleanly) {
  CliResult r = run_lowbit("generate --model /nonexistent/model.gguf");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  // The golden checkpoints have no tokenizer.
  r = run_lowbit("generate --model " + golden_dir("llama").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
  r = run_lowbit("generate --kv tq5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_lowbit("generate --kv tq4 --kv-fp16-window -1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(GenerateCli, DefaultModelStreamsTextAndReportsSpeedAndMemory) {
  if (default_model_path().empty()) GTEST_SKIP() << "the default model is not in the cache: run scripts/fetch-default-model";
  const CliResult r = run_lowbit("generate --max-tokens 12 --prompt 'The capital of France is' --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("The capital of France is Paris.", 0), 0u) << r.output;
  for (const char* needle : {"prefill:", "decode:", "tokens/s", "weights", "KV cache"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  // Two prompts decoded as one batch, tq4 K and fp16 V, numbers to JSON.
  const std::string json = ::testing::TempDir() + "lowbit_generate_" + std::to_string(::getpid()) + ".jsonl";
  const CliResult b = run_lowbit(
      "generate --max-tokens 6 --prompt 'The capital of France is' --prompt 'One, two, three,' --kv-k tq4 --kv-v fp16"
      " --ignore-eos --json " + json);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("== prompt 1: One, two, three,"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("batch 2"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("K tq4, V fp16"), std::string::npos) << b.output;
  std::ifstream in(json);
  std::string line;
  ASSERT_TRUE(std::getline(in, line)) << json;
  const nlohmann::json row = nlohmann::json::parse(line);
  EXPECT_EQ(row.at("batch"), 2);
  EXPECT_EQ(row.at("generated_tokens"), 12);
  EXPECT_GT(row.at("decode_tokens_per_s").get<double>(), 0.0);
  EXPECT_EQ(row.at("kv"), "K tq4, V fp16");
  std::remove(json.c_str());
}

// `lowbit perplexity` on the shipped text (data/perplexity/lowbit-prose.txt,
// written for this project). The fp16-KV value was recorded once on this
// machine's CPU backend (21.9408 over 896 tokens); the tolerance allows for a
// different summation order on other CPUs. tq4 K/V costs some perplexity on
// this head_dim-64 model but must stay close; with the newest 64 tokens
// attended from fp16 copies (--kv-fp16-window 64) it measured 21.803 against
// 22.747 without, in chunks of 512 or of 8 alike.
TEST(PerplexityCli, DefaultModelOnTheShippedText) {
  if (default_model_path().empty()) GTEST_SKIP() << "the default model is not in the cache: run scripts/fetch-default-model";
  const std::string text = std::string(LOWBIT_SOURCE_DIR) + "/data/perplexity/lowbit-prose.txt";
  std::vector<nlohmann::json> rows;
  for (const char* kv : {"fp16", "tq4", "tq4 --kv-fp16-window 64"}) {
    const std::string json =
        ::testing::TempDir() + "lowbit_ppl_" + std::to_string(rows.size()) + "_" + std::to_string(::getpid()) + ".jsonl";
    const CliResult r = run_lowbit(std::string("perplexity --device cpu --threads 2 --quiet --text ") + text +
                                   " --kv " + kv + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.rfind("perplexity ", 0), 0u) << r.output;
    std::ifstream in(json);
    std::string line;
    ASSERT_TRUE(std::getline(in, line)) << json;
    rows.push_back(nlohmann::json::parse(line));
    std::remove(json.c_str());
  }
  EXPECT_EQ(rows[0].at("scored"), 896);
  const double fp16 = rows[0].at("perplexity").get<double>(), tq4 = rows[1].at("perplexity").get<double>();
  EXPECT_NEAR(fp16, 21.9408, 0.02);
  EXPECT_GT(tq4, fp16);
  EXPECT_LT(tq4, 1.15 * fp16);
  EXPECT_EQ(rows[1].at("kv"), "K tq4, V tq4");
  const double windowed = rows[2].at("perplexity").get<double>();
  EXPECT_LT(windowed, fp16 + 0.5 * (tq4 - fp16)) << "the window should take back most of what tq4 costs";
  EXPECT_EQ(rows[2].at("kv"), "K tq4, V tq4, newest 64 tokens also fp16");
}

TEST(PerplexityCli, BadInputsFailCleanly) {
  CliResult r = run_lowbit("perplexity");
  EXPECT_EQ(r.exit_code, 2) << r.output;  // --text is required
  EXPECT_NE(r.output.find("--text"), std::string::npos) << r.output;
  r = run_lowbit("perplexity --text /nonexistent/text.txt --model " + golden_dir("llama").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot open --text"), std::string::npos) << r.output;
  r = run_lowbit("perplexity --text /dev/null --chunk 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace lowbit::test
