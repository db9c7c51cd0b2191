// `lowbit ans` as a user meets it: exit codes (0 ok, 2 usage, 1 other
// errors), messages that name the problem, --help on every subcommand, and
// make-synthetic -> inspect -> convert -> run on small files.
#include <gtest/gtest.h>

#include <cctype>

#include "ans_test_util.h"
#include "lowbit/core/host_memory.h"
#include "lowbit/cuda/device.h"

namespace {

using lowbit::test::ans::conformance_dir;
using lowbit::test::ans::run_cli;
using lowbit::test::ans::TempDir;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The hash `lowbit ans run` prints.
std::string printed_hash(const std::string& output) {
  const std::string key = "final vector hash: ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return "";
  size_t end = at + key.size();
  while (end < output.size() && std::isdigit(static_cast<unsigned char>(output[end]))) ++end;
  return output.substr(at + key.size(), end - at - key.size());
}

TEST(AnsCli, HelpExplainsEverySubcommand) {
  LOWBIT_REQUIRE_CLI();
  const auto top = run_cli("ans --help");
  EXPECT_EQ(top.exit_code, 0) << top.output;
  for (const char* sub : {"make-synthetic", "inspect", "convert", "run"}) {
    EXPECT_TRUE(contains(top.output, sub)) << sub << "\n" << top.output;
    const auto help = run_cli(std::string("ans ") + sub + " --help");
    EXPECT_EQ(help.exit_code, 0) << sub << ": " << help.output;
    EXPECT_TRUE(contains(help.output, "Usage")) << help.output;
  }
  EXPECT_TRUE(contains(run_cli("ans make-synthetic --help").output, "baseline-rowmajor"));
  EXPECT_TRUE(contains(run_cli("ans run --help").output, "--device"));
  EXPECT_EQ(run_cli("ans").exit_code, 2);  // a subcommand is required
}

TEST(AnsCli, UsageErrorsExitTwo) {
  LOWBIT_REQUIRE_CLI();
  TempDir tmp;
  const std::string out = (tmp / "x.bin").string();
  const auto bad_format = run_cli("ans make-synthetic --layers 2 --dim 8 --out " + out + " --format zip");
  EXPECT_EQ(bad_format.exit_code, 2) << bad_format.output;
  EXPECT_TRUE(contains(bad_format.output, "zip")) << bad_format.output;
  EXPECT_EQ(run_cli("ans make-synthetic --layers 0 --dim 8 --out " + out).exit_code, 2);
  EXPECT_EQ(run_cli("ans make-synthetic --layers 2 --dim abc --out " + out).exit_code, 2);
  EXPECT_EQ(run_cli("ans make-synthetic --dim 8 --out " + out).exit_code, 2);  // --layers missing
  EXPECT_EQ(run_cli("ans make-synthetic --layers 2 --dim 8 --out " + out + " --bits 3").exit_code, 2);
  EXPECT_EQ(run_cli("ans make-synthetic --layers 2 --dim 8 --out " + out + " --precision 16").exit_code, 2);
  const auto missing = run_cli("ans inspect /no/such/file.bin");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(contains(missing.output, "/no/such/file.bin")) << missing.output;
  EXPECT_EQ(run_cli("ans run /no/such/file.bin").exit_code, 2);
  EXPECT_FALSE(std::filesystem::exists(out));
  // A chain larger than the machine's memory (19.5 TiB: the codes and their
  // encoding) is refused at once, with its size, before anything is
  // generated or written (it used to run until the OOM killer ended it).
  if (!lowbit::host_memory_available()) return;  // no /proc/meminfo: the check does nothing (documented)
  const auto too_big = run_cli("ans make-synthetic --layers 10000 --dim 32768 --out " + out);
  EXPECT_EQ(too_big.exit_code, 1) << too_big.output;
  EXPECT_TRUE(contains(too_big.output, "needs 19.5 TiB of host memory")) << too_big.output;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(AnsCli, MakeInspectConvertRunAgree) {
  LOWBIT_REQUIRE_CLI();
  TempDir tmp;
  const std::string lb = (tmp / "a.lowbit").string(), seed = (tmp / "a.seed").string(),
                    base = (tmp / "a.base").string();
  const auto made = run_cli("ans make-synthetic --layers 3 --dim 96 --seed 7 --out " + lb);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_TRUE(contains(made.output, "result_hash")) << made.output;
  EXPECT_TRUE(contains(made.output, "encode")) << made.output;

  const auto inspect = run_cli("ans inspect " + lb);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  for (const char* what : {"lowbit container", "K = 3", "model (probability precision)", "coder", "whole file"})
    EXPECT_TRUE(contains(inspect.output, what)) << what << "\n" << inspect.output;
  const auto json = run_cli("ans inspect --json " + lb);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(contains(json.output, "\"entropy_bits\"")) << json.output;
  EXPECT_TRUE(contains(json.output, "\"cross_entropy_bits\"")) << json.output;

  const auto run = run_cli("ans run " + lb);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "matches the file's result_hash")) << run.output;
  const std::string hash = printed_hash(run.output);
  ASSERT_FALSE(hash.empty()) << run.output;
  EXPECT_TRUE(contains(made.output, "result_hash " + hash)) << made.output;

  ASSERT_EQ(run_cli("ans convert " + lb + " " + seed + " --format seed").exit_code, 0);
  ASSERT_EQ(run_cli("ans convert " + seed + " " + base + " --format baseline").exit_code, 0);
  const auto run_seed = run_cli("ans run " + seed + " --repeat 2");
  EXPECT_EQ(run_seed.exit_code, 0) << run_seed.output;
  EXPECT_EQ(printed_hash(run_seed.output), hash);
  const auto run_base = run_cli("ans run " + base);
  EXPECT_EQ(run_base.exit_code, 0) << run_base.output;
  EXPECT_EQ(printed_hash(run_base.output), hash);
  EXPECT_TRUE(contains(run_base.output, "records no result_hash")) << run_base.output;
  // Read with the wrong element order, the baseline chain is another chain.
  EXPECT_NE(printed_hash(run_cli("ans run " + base + " --baseline-order row").output), hash);
}

TEST(AnsCli, ScalesNeedAContainerThatKeepsThem) {
  LOWBIT_REQUIRE_CLI();
  TempDir tmp;
  const std::string out = (tmp / "g.bin").string();
  const auto refused =
      run_cli("ans make-synthetic --layers 1 --dim 64 --quant per-group --group-size 32 --bits 4 --format seed --out " + out);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "per-group")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "--drop-scales")) << refused.output;
  EXPECT_FALSE(std::filesystem::exists(out));
  const auto kept = run_cli("ans make-synthetic --layers 1 --dim 64 --quant per-group --group-size 32 --bits 4 --out " + out);
  EXPECT_EQ(kept.exit_code, 0) << kept.output;
  const auto inspect = run_cli("ans inspect " + out);
  EXPECT_TRUE(contains(inspect.output, "quantization scales")) << inspect.output;
}

TEST(AnsCli, CudaRunMatchesTheCpuOrSaysWhyNot) {
  LOWBIT_REQUIRE_CLI();
  TempDir tmp;
  const std::string f = (tmp / "c.bin").string();
  ASSERT_EQ(run_cli("ans make-synthetic --layers 2 --dim 48 --out " + f).exit_code, 0);
  const auto cpu = run_cli("ans run " + f);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  const auto r = run_cli("ans run " + f + " --device cuda");
  const auto a = run_cli("ans run " + f + " --device auto");
  EXPECT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(printed_hash(a.output), printed_hash(cpu.output)) << a.output;
  if (::lowbit::cuda_device_count() == 0) {  // no GPU here (or no CUDA in this build): a clear refusal
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "unsupported")) << r.output;
    EXPECT_TRUE(contains(r.output, "--device cpu")) << r.output;
  } else {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(printed_hash(r.output), printed_hash(cpu.output)) << r.output;
    EXPECT_TRUE(contains(r.output, "device cuda")) << r.output;
    const auto c = run_cli("ans run " + f + " --device cuda --with-copies --repeat 2");
    EXPECT_EQ(c.exit_code, 0) << c.output;
    EXPECT_EQ(printed_hash(c.output), printed_hash(cpu.output)) << c.output;
  }
  EXPECT_EQ(run_cli("ans run " + f + " --device tpu").exit_code, 2);
}

TEST(AnsCli, BrokenFilesExitOneAndNameTheFile) {
  LOWBIT_REQUIRE_CLI();
  TempDir tmp;
  const std::string f = (tmp / "broken.bin").string();
  ASSERT_EQ(run_cli("ans make-synthetic --layers 2 --dim 40 --format seed --out " + f).exit_code, 0);
  auto bytes = lowbit::test::ans::read_bytes(f);
  bytes.resize(bytes.size() - 10);
  lowbit::test::ans::write_bytes(f, bytes);
  const auto r = run_cli("ans inspect " + f);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "broken.bin")) << r.output;
  EXPECT_TRUE(contains(r.output, "format error")) << r.output;
  // A recorded hash the chain does not reproduce: the run fails after printing it.
  const std::string g = (tmp / "rehashed.bin").string();
  ASSERT_EQ(run_cli("ans make-synthetic --layers 2 --dim 40 --format seed --out " + g).exit_code, 0);
  bytes = lowbit::test::ans::read_bytes(g);
  bytes[4] ^= 0xFF;  // result_hash is bytes 4..7 of the seed container with hash
  lowbit::test::ans::write_bytes(g, bytes);
  const auto mismatch = run_cli("ans run " + g);
  EXPECT_EQ(mismatch.exit_code, 1) << mismatch.output;
  EXPECT_TRUE(contains(mismatch.output, "differs from the file's result_hash")) << mismatch.output;
}

TEST(AnsCli, ConformanceFilesRunToTheReadmeHash) {
  LOWBIT_REQUIRE_CLI();
  LOWBIT_REQUIRE_CONFORMANCE();
  const auto c = run_cli("ans run " + (conformance_dir() / "compressed_matrices_512.bin").string());
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(printed_hash(c.output), "3721080212");
  const auto r = run_cli("ans run --baseline-order row " + (conformance_dir() / "raw-matrices_512.bin").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(printed_hash(r.output), "3721080212");
  const auto i = run_cli("ans inspect " + (conformance_dir() / "compressed_matrices_512.bin").string());
  EXPECT_EQ(i.exit_code, 0) << i.output;
  EXPECT_TRUE(contains(i.output, "6.2156")) << i.output;  // matrix 0's achieved bits per weight
}

}  // namespace
