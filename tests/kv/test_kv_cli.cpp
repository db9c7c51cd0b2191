// `lowbit kv` as a user meets it: codebook and roundtrip output (text and
// JSON) that agree with the library, determinism, and exit codes (2 for
// usage errors caught by the option validators, 1 for library errors).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "lowbit/kv/codebook.h"
#include "tolerances.h"

#include "cli_runner.h"

namespace {

using RunResult = lowbit::test::CliResult;
using lowbit::test::run_lowbit;

class KvCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(LOWBIT_CLI_PATH))
        << LOWBIT_CLI_PATH << " is missing: build the lowbit command (ninja lowbit_cli) before test_kv";
  }
};

TEST_F(KvCli, CodebookTextShowsTheLevels) {
  const RunResult r = run_lowbit("kv codebook --bits 4 --dim 128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle :
       {"16 levels", "N(0, 1/128)", "-0.241529", "0.182877", "0.0113486", "boundaries (15)", "0.00950101"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  const RunResult sphere = run_lowbit("kv codebook --bits 4 --dim 128 --sphere");
  ASSERT_EQ(sphere.exit_code, 0) << sphere.output;
  EXPECT_NE(sphere.output.find("0.237664"), std::string::npos) << sphere.output;
}

TEST_F(KvCli, CodebookJsonEqualsTheLibrary) {
  for (int bits : {2, 3, 4}) {
    const RunResult r = run_lowbit("kv codebook --bits " + std::to_string(bits) + " --dim 96 --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json j = nlohmann::json::parse(r.output);
    const lowbit::kv::Codebook book = lowbit::kv::make_codebook(bits, 96);
    EXPECT_EQ(j.at("centroids").get<std::vector<double>>(), book.centroids);
    EXPECT_EQ(j.at("boundaries").get<std::vector<double>>(), book.boundaries);
    EXPECT_EQ(j.at("levels").get<int>(), 1 << bits);
    EXPECT_EQ(j.at("distribution").get<std::string>(), "gaussian");
    EXPECT_DOUBLE_EQ(j.at("unit_vector_mse").get<double>(), book.unit_vector_mse);
  }
}

TEST_F(KvCli, RoundtripReportsMseNearTheoryAndIsDeterministic) {
  const std::string args = "kv roundtrip --bits 4 --dim 128 --n 3000 --seed 5 --json";
  const RunResult r = run_lowbit(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_LE(j.at("relative_mse").get<double>(), lowbit::test::kRoundTripMseTq4);
  EXPECT_GE(j.at("relative_mse").get<double>(),
            lowbit::test::kRoundTripMseMinFractionOfTheory * j.at("theory_mse").get<double>());
  EXPECT_EQ(j.at("bytes_per_vector").get<int>(), 66);
  EXPECT_GT(j.at("inner_product_rmse").get<double>(), 0.0);
  EXPECT_EQ(run_lowbit(args).output, r.output);  // same seed, same bytes
  EXPECT_NE(run_lowbit("kv roundtrip --bits 4 --dim 128 --n 3000 --seed 6 --json").output, r.output);

  const RunResult text =
      run_lowbit("kv roundtrip --bits 3 --dim 64 --n 500 --seed 1 --rotation hadamard --scale f32");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const char* needle : {"tq3 round trip", "hadamard rotation", "relative MSE", "Lloyd-Max theory",
                             "bytes per vector: 28 (24 index + 4 scale)", "inner product error"})
    EXPECT_NE(text.output.find(needle), std::string::npos) << needle << "\n" << text.output;
  const RunResult two = run_lowbit("kv roundtrip --bits 2 --dim 128 --n 2000 --json --no-renorm");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_LE(nlohmann::json::parse(two.output).at("relative_mse").get<double>(),
            lowbit::test::kRoundTripMseTq2);
}

TEST_F(KvCli, UsageErrorsExitTwoLibraryErrorsExitOne) {
  for (const char* args : {"kv", "kv frobnicate", "kv codebook --bits 9", "kv codebook --dim 2",
                           "kv roundtrip --bits 5", "kv roundtrip --dim 100", "kv roundtrip --dim abc",
                           "kv roundtrip --n 0", "kv roundtrip --rotation qr", "kv roundtrip --scale bf16"}) {
    const RunResult r = run_lowbit(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  }
  const RunResult dim = run_lowbit("kv roundtrip --dim 100");
  EXPECT_NE(dim.output.find("100"), std::string::npos) << dim.output;
  // A valid option combination the library refuses: a Hadamard rotation of a non-power-of-two.
  const RunResult hadamard = run_lowbit("kv roundtrip --dim 96 --n 10 --rotation hadamard");
  EXPECT_EQ(hadamard.exit_code, 1) << hadamard.output;
  EXPECT_NE(hadamard.output.find("'dim' = 96"), std::string::npos) << hadamard.output;
  EXPECT_NE(hadamard.output.find("power of two"), std::string::npos) << hadamard.output;
}

// `lowbit bench attention` (the benchmark itself runs on the GPU machine by
// hand; here only what never touches a device): option validation exits 2,
// a page size the cache refuses exits 1 before any device work, or with
// "built without CUDA" in a CPU-only build.
TEST_F(KvCli, BenchAttentionRejectsBadOptions) {
  for (const char* args : {"bench attention --batch 0", "bench attention --context -5",
                           "bench attention --page-size 300", "bench attention --prefill-tokens 70000",
                           "bench attention --reps 0", "bench attention --l2-flush sideways",
                           "bench attention --cta-warps 12"}) {
    const RunResult r = run_lowbit(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  }
  const RunResult page = run_lowbit("bench attention --page-size 24");
  EXPECT_EQ(page.exit_code, 1) << page.output;
  EXPECT_TRUE(page.output.find("'page_size' = 24") != std::string::npos ||
              page.output.find("built without CUDA") != std::string::npos)
      << page.output;
  const RunResult help = run_lowbit("bench attention --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* needle :
       {"--batch", "--context", "--page-size", "--prefill-tokens", "--json", "SDPA", "--l2-flush", "--cta-warps"})
    EXPECT_NE(help.output.find(needle), std::string::npos) << needle << "\n" << help.output;
}

TEST_F(KvCli, HelpExplainsTheOptions) {
  const RunResult kv = run_lowbit("kv --help");
  EXPECT_EQ(kv.exit_code, 0) << kv.output;
  EXPECT_NE(kv.output.find("codebook"), std::string::npos);
  EXPECT_NE(kv.output.find("roundtrip"), std::string::npos);
  const RunResult rt = run_lowbit("kv roundtrip --help");
  EXPECT_EQ(rt.exit_code, 0) << rt.output;
  for (const char* needle : {"--rotation", "hadamard", "--seed", "--no-renorm", "relative MSE"})
    EXPECT_NE(rt.output.find(needle), std::string::npos) << needle << "\n" << rt.output;
  EXPECT_NE(run_lowbit("kv codebook --help").output.find("--sphere"), std::string::npos);
}

}  // namespace
