// read_sdpa_baseline_rows: the torch SDPA times that `lowbit bench attention
// --sdpa FILE` compares against. Rows of the anchors' schema are read, other
// rows skipped, and a file that would leave the SDPA column empty or wrong is
// refused with a message naming the line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "lowbit/kv/attention_bench.h"
#include "error_matchers.h"

#include "cli_runner.h"

namespace {

namespace fs = std::filesystem;
using lowbit::ErrorKind;
using lowbit::read_sdpa_baseline_rows;
using lowbit::test::throws_error;

class SdpaBaseline : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove(path_); }
  std::string write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_.string();
  }
  fs::path path_ = fs::temp_directory_path() / ("lowbit_sdpa_rows_" + std::to_string(::getpid()) + ".jsonl");
};

TEST_F(SdpaBaseline, ReadsTheSdpaRowsAndSkipsTheOthers) {
  const std::string path = write(
      "{\"kind\": \"copy\", \"bytes\": 2147483648, \"us\": 500.0, \"GBps\": 4294.9}\n"
      "\n"
      "{\"kind\": \"attn_decode\", \"impl\": \"torch_sdpa_fp16\", \"B\": 1, \"L\": 32768, \"us\": 48.25}\n"
      "{\"kind\": \"gemm\", \"impl\": \"cublas_fp16\", \"us\": 15.0, \"shape\": \"sq4096\", \"M\": 1}\n"
      "{\"kind\": \"attn_decode\", \"impl\": \"other_kernel\", \"B\": 8, \"L\": 32768, \"us\": 1.0}\n"
      "{\"kind\": \"attn_decode\", \"impl\": \"torch_sdpa_fp16\", \"B\": 8, \"L\": 4096, \"us\": 47.5, "
      "\"device\": \"NVIDIA H200\"}\n");
  const auto points = read_sdpa_baseline_rows(path);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].batch, 1);
  EXPECT_EQ(points[0].context, 32768);
  EXPECT_DOUBLE_EQ(points[0].us, 48.25);
  EXPECT_EQ(points[1].batch, 8);
  EXPECT_EQ(points[1].context, 4096);
  EXPECT_DOUBLE_EQ(points[1].us, 47.5);
}

TEST_F(SdpaBaseline, RefusesFilesThatWouldLeaveTheColumnWrong) {
  EXPECT_TRUE(throws_error([&] { read_sdpa_baseline_rows((path_ / "missing").string()); }, ErrorKind::io,
                           "cannot open SDPA rows"));
  EXPECT_TRUE(throws_error([&] { read_sdpa_baseline_rows(write("{\"kind\": \"copy\", \"us\": 1}\n")); },
                           ErrorKind::invalid_argument, "holds no torch SDPA decode rows"));
  EXPECT_TRUE(throws_error([&] { read_sdpa_baseline_rows(write("{\"kind\": \"copy\"}\nnot json\n")); },
                           ErrorKind::invalid_argument, {":2:", "not a JSON object"}));
  EXPECT_TRUE(throws_error(
      [&] {
        read_sdpa_baseline_rows(write("{\"kind\": \"attn_decode\", \"impl\": \"torch_sdpa_fp16\", \"B\": 1, \"us\": 3}\n"));
      },
      ErrorKind::invalid_argument, {":1:", "'L'"}));
  EXPECT_TRUE(throws_error(
      [&] {
        read_sdpa_baseline_rows(
            write("{\"kind\": \"attn_decode\", \"impl\": \"torch_sdpa_fp16\", \"B\": 1, \"L\": 4096, \"us\": -2}\n"));
      },
      ErrorKind::invalid_argument, "'us'"));
  EXPECT_TRUE(throws_error(
      [&] {
        read_sdpa_baseline_rows(
            write("{\"kind\": \"attn_decode\", \"impl\": \"torch_sdpa_fp16\", \"B\": 1.5, \"L\": 4096, \"us\": 2}\n"));
      },
      ErrorKind::invalid_argument, {"integer", "'B'"}));
  EXPECT_TRUE(throws_error(
      [&] {
        read_sdpa_baseline_rows(
            write("{\"kind\": \"attn_decode\", \"impl\": \"torch_sdpa_fp16\", \"B\": 1, \"L\": 4096, \"us\": 2}\n"
                  "{\"kind\": \"attn_decode\", \"impl\": \"torch_sdpa_fp16\", \"B\": 1, \"L\": 4096, \"us\": 3}\n"));
      },
      ErrorKind::invalid_argument, {":2:", "second SDPA row", "batch 1, context 4096"}));
  // A row whose kind is no string is not an SDPA row (skipped, not a crash).
  EXPECT_TRUE(throws_error([&] { read_sdpa_baseline_rows(write("{\"kind\": 7, \"impl\": [1]}\n")); },
                           ErrorKind::invalid_argument, "holds no torch SDPA decode rows"));
}

// The CLI reads the file before any device work, so a bad one is refused on
// a machine without a GPU as well (exit 1), and a missing one by the option
// check (exit 2).
TEST_F(SdpaBaseline, BenchAttentionRefusesABadSdpaFile) {
  const lowbit::test::CliResult missing = lowbit::test::run_lowbit("bench attention --sdpa " + (path_ / "x").string());
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  const lowbit::test::CliResult empty = lowbit::test::run_lowbit("bench attention --sdpa " + write("{}\n"));
  EXPECT_EQ(empty.exit_code, 1) << empty.output;
  EXPECT_NE(empty.output.find("holds no torch SDPA decode rows"), std::string::npos) << empty.output;
}

}  // namespace
