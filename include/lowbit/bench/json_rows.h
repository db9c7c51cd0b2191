// Benchmark results as rows: one JSON object per timed configuration, written
// one per line (jsonl) so that runs can be concatenated and compared by
// scripts, and the same rows rendered as an aligned text table for people.
//
// A row: {"suite", "impl", <shape fields in order>, "us" (median), "us_p10",
// "us_p90", "reps", "bytes", "GBps", ["flops", "TFLOPs"], <extra fields>}.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/bench/stats.h"

namespace lowbit::bench {

using JsonField = std::pair<std::string, nlohmann::json>;

struct BenchRow {
  std::string suite;              // what is measured, e.g. "gemm_f16"
  std::string impl;               // who computes it, e.g. "cublas"
  std::vector<JsonField> shape;   // e.g. {{"M", 1}, {"K", 4096}, {"N", 4096}}, kept in order
  TimingStats stats;
  uint64_t bytes = 0;             // bytes that must cross device memory per call (the floor)
  std::optional<double> flops;    // floating-point operations per call, if meaningful
  std::vector<JsonField> extra;   // anything else (e.g. a peer's time), after the standard fields

  double GBps() const;    // bytes / median time; 0 when the median is not positive
  double TFLOPs() const;  // flops / median time; 0 without flops
};

// The row as a JSON object. Throws Error(invalid_argument) when a shape or
// extra field repeats a name or takes one of the standard names.
nlohmann::ordered_json to_ordered_json(const BenchRow& row);  // fields in the order above
nlohmann::json to_json(const BenchRow& row);                  // same content, keys sorted

// Writes rows as JSON lines: one object per line, flushed after each row so a
// crash loses nothing already measured. Truncates an existing file unless
// `append`. Throws Error(io) when the file cannot be opened or written.
class JsonRowsWriter {
 public:
  explicit JsonRowsWriter(const std::string& path, bool append = false);
  // Fields every row written from now on carries after its own: the run's
  // settings that move every timing (e.g. the GPU launch switches). A row
  // that already has a field of that name is refused with
  // Error(invalid_argument), as a repeated name within a row is.
  void set_run_fields(std::vector<JsonField> fields) { run_fields_ = std::move(fields); }
  void write(const BenchRow& row);
  void write(const nlohmann::ordered_json& object);
  const std::string& path() const { return path_; }

 private:
  void write_line(const nlohmann::ordered_json& object);
  std::string path_;
  std::ofstream out_;
  std::vector<JsonField> run_fields_;
};

// An aligned text table with one line per row and a header: suite, impl, the
// union of the shape fields (in order of first appearance; "-" where a row
// lacks one), us (median), GB/s, TFLOP/s (only if some row has flops), then
// the union of the extra fields. Text is left-aligned, numbers right-aligned.
std::string format_table(const std::vector<BenchRow>& rows);

}  // namespace lowbit::bench
