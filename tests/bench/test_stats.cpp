#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "lowbit/bench/json_rows.h"
#include "lowbit/bench/stats.h"
#include "lowbit/core/error.h"

namespace lowbit::bench {
namespace {

TEST(Stats, OddCount) {
  const TimingStats s = summarize_us({5, 1, 4, 2, 3});
  EXPECT_EQ(s.reps, 5);
  EXPECT_DOUBLE_EQ(s.median_us, 3);
  EXPECT_DOUBLE_EQ(s.min_us, 1);
  EXPECT_DOUBLE_EQ(s.max_us, 5);
  EXPECT_DOUBLE_EQ(s.mean_us, 3);
  EXPECT_DOUBLE_EQ(s.p10_us, 1.4);  // rank 0.4 between 1 and 2
  EXPECT_DOUBLE_EQ(s.p90_us, 4.6);  // rank 3.6 between 4 and 5
}

TEST(Stats, EvenCountMedianIsMeanOfMiddlePair) {
  const TimingStats s = summarize_us({10, 40, 20, 30});
  EXPECT_EQ(s.reps, 4);
  EXPECT_DOUBLE_EQ(s.median_us, 25);
  EXPECT_DOUBLE_EQ(s.mean_us, 25);
  EXPECT_DOUBLE_EQ(s.p10_us, 13);  // rank 0.3
  EXPECT_DOUBLE_EQ(s.p90_us, 37);  // rank 2.7
}

TEST(Stats, OutlierMovesMeanNotMedian) {
  std::vector<double> samples(99, 10.0);
  samples.push_back(1000.0);
  const TimingStats s = summarize_us(samples);
  EXPECT_DOUBLE_EQ(s.median_us, 10);
  EXPECT_DOUBLE_EQ(s.p90_us, 10);
  EXPECT_DOUBLE_EQ(s.max_us, 1000);
  EXPECT_DOUBLE_EQ(s.mean_us, 19.9);
}

TEST(Stats, OneElement) {
  const TimingStats s = summarize_us({7.5});
  EXPECT_EQ(s.reps, 1);
  for (double v : {s.median_us, s.min_us, s.max_us, s.p10_us, s.p90_us, s.mean_us})
    EXPECT_DOUBLE_EQ(v, 7.5);
}

TEST(Stats, EmptyOrNonFiniteIsInvalidArgument) {
  try {
    summarize_us({});
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
  }
  try {
    summarize_us({1.0, std::numeric_limits<double>::quiet_NaN()});
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("samples_us[1]"), std::string::npos) << e.what();
  }
}

BenchRow gemm_row(int64_t M, double median_us) {
  BenchRow row;
  row.suite = "gemm_f16";
  row.impl = "cublas";
  row.shape = {{"M", M}, {"K", 4096}, {"N", 4096}};
  row.stats = summarize_us({median_us - 1, median_us, median_us + 1});
  row.bytes = static_cast<uint64_t>(2 * (M * 4096 + 4096 * 4096 + M * 4096));
  row.flops = 2.0 * static_cast<double>(M) * 4096 * 4096;
  return row;
}

TEST(JsonRows, FieldsAndOrder) {
  BenchRow row = gemm_row(1, 20.0);
  row.extra = {{"peer_us", 21.5}, {"note", "x"}};
  const nlohmann::ordered_json j = to_ordered_json(row);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  const std::vector<std::string> expected = {"suite", "impl", "M", "K", "N", "us", "us_p10",
                                             "us_p90", "reps", "bytes", "GBps", "flops",
                                             "TFLOPs", "peer_us", "note"};
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(j["suite"], "gemm_f16");
  EXPECT_EQ(j["M"], 1);
  EXPECT_DOUBLE_EQ(j["us"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(j["us_p10"].get<double>(), 19.2);
  EXPECT_DOUBLE_EQ(j["us_p90"].get<double>(), 20.8);
  EXPECT_EQ(j["reps"], 3);
  EXPECT_EQ(j["bytes"].get<uint64_t>(), 2u * (4096 + 4096 * 4096 + 4096));
  EXPECT_DOUBLE_EQ(j["GBps"].get<double>(), static_cast<double>(row.bytes) / 20e3);
  EXPECT_DOUBLE_EQ(j["TFLOPs"].get<double>(), 2.0 * 4096 * 4096 / 20e6);

  const nlohmann::json sorted = to_json(row);
  EXPECT_EQ(sorted.size(), expected.size());
  EXPECT_EQ(sorted["impl"], "cublas");
  EXPECT_DOUBLE_EQ(sorted["peer_us"].get<double>(), 21.5);
}

TEST(JsonRows, NoFlopsMeansNoFlopFields) {
  BenchRow row = gemm_row(1, 10.0);
  row.flops.reset();
  const nlohmann::ordered_json j = to_ordered_json(row);
  EXPECT_FALSE(j.contains("flops"));
  EXPECT_FALSE(j.contains("TFLOPs"));
}

TEST(JsonRows, ReservedOrRepeatedNamesAreRejected) {
  BenchRow row = gemm_row(1, 10.0);
  row.shape.push_back({"us", 3});
  EXPECT_THROW(to_ordered_json(row), Error);
  row = gemm_row(1, 10.0);
  row.extra.push_back({"M", 3});
  EXPECT_THROW(to_json(row), Error);
}

TEST(JsonRows, WriterWritesOneObjectPerLine) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("lowbit_test_rows_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".jsonl");
  {
    JsonRowsWriter writer(path.string());
    writer.write(gemm_row(1, 20.0));
    writer.write(gemm_row(16, 22.0));
  }
  {
    JsonRowsWriter writer(path.string(), /*append=*/true);
    writer.write(gemm_row(64, 30.0));
  }
  std::ifstream in(path);
  std::string line;
  std::vector<int64_t> ms;
  while (std::getline(in, line)) ms.push_back(nlohmann::json::parse(line)["M"].get<int64_t>());
  EXPECT_EQ(ms, (std::vector<int64_t>{1, 16, 64}));
  {
    JsonRowsWriter writer(path.string());  // truncates
    writer.write(gemm_row(1, 20.0));
  }
  std::ifstream again(path);
  int lines = 0;
  while (std::getline(again, line)) ++lines;
  EXPECT_EQ(lines, 1);
  std::filesystem::remove(path);
}

// JsonRowsWriter::set_run_fields: every row written after it carries the
// fields after its own (rows and plain objects alike); a row with a field of
// the same name is refused and nothing of it is written.
TEST(JsonRows, WriterAddsTheRunFieldsToEveryRow) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("lowbit_test_run_fields_" +
                     std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".jsonl");
  {
    JsonRowsWriter writer(path.string());
    writer.write(gemm_row(1, 20.0));
    writer.set_run_fields({{"l2_streaming", true}, {"pdl", false}});
    writer.write(gemm_row(16, 22.0));
    writer.write(nlohmann::ordered_json{{"suite", "summary"}, {"x", 1}});
    BenchRow clash = gemm_row(64, 30.0);
    clash.extra.push_back({"pdl", true});
    EXPECT_THROW(writer.write(clash), Error);
    EXPECT_THROW(writer.write(nlohmann::ordered_json{{"l2_streaming", false}}), Error);
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[0].contains("l2_streaming"));
  EXPECT_EQ(rows[1]["M"], 16);
  EXPECT_EQ(rows[1]["l2_streaming"], true);
  EXPECT_EQ(rows[1]["pdl"], false);
  EXPECT_EQ(rows[2]["suite"], "summary");
  EXPECT_EQ(rows[2]["l2_streaming"], true);
  std::filesystem::remove(path);
}

TEST(JsonRows, WriterOnBadPathIsIoError) {
  try {
    JsonRowsWriter writer("/nonexistent-dir-lowbit/x.jsonl");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-lowbit/x.jsonl"), std::string::npos);
  }
}

TEST(JsonRows, TableIsAligned) {
  BenchRow a = gemm_row(1, 20.0);
  a.extra = {{"peer_us", 21.5}};
  BenchRow b = gemm_row(64, 123.456);
  b.impl = "lowbit_w4a16";
  b.flops.reset();
  const std::string table = format_table({a, b});
  std::istringstream in(table);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "suite     impl           M     K     N      us    GB/s  TFLOP/s  peer_us");
  EXPECT_EQ(lines[1], "--------  ------------  --  ----  ----  ------  ------  -------  -------");
  EXPECT_EQ(lines[2], "gemm_f16  cublas         1  4096  4096   20.00  1678.5     1.68     21.5");
  EXPECT_EQ(lines[3], "gemm_f16  lowbit_w4a16  64  4096  4096  123.46   280.3        -        -");
}

TEST(JsonRows, EmptyTableHasHeaderOnly) {
  const std::string table = format_table({});
  EXPECT_EQ(table, "suite  impl  us  GB/s\n-----  ----  --  ----\n");
}

}  // namespace
}  // namespace lowbit::bench
