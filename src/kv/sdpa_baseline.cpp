// The torch SDPA decode times that `lowbit bench attention --sdpa FILE`
// compares against, read from JSON rows (scripts/bench_torch_peers.py writes
// them on the GPU at hand; the anchors' file has the same schema). Plain C++,
// built with or without CUDA, so that its errors are tested in CI.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/kv/attention_bench.h"

namespace lowbit {

std::vector<SdpaBaselinePoint> read_sdpa_baseline_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::io, "cannot open SDPA rows '", path, "': ", std::strerror(errno));
  std::vector<SdpaBaselinePoint> points;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() || !row.is_object())
      fail(ErrorKind::invalid_argument, path, ":", line_no, ": not a JSON object");
    const auto text = [&](const char* key) {
      const auto it = row.find(key);
      return it != row.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (text("kind") != "attn_decode" || text("impl") != "torch_sdpa_fp16") continue;
    const auto number = [&](const char* key, bool integer) {
      const auto it = row.find(key);
      if (it == row.end() || !(integer ? it->is_number_integer() : it->is_number()) || it->get<double>() <= 0 ||
          (integer && it->get<double>() > 2147483647.0))
        fail(ErrorKind::invalid_argument, path, ":", line_no, ": an SDPA row needs a positive ",
             integer ? "integer" : "number", " '", key, "'");
      return it->get<double>();
    };
    SdpaBaselinePoint p;
    p.batch = static_cast<int>(number("B", true));
    p.context = static_cast<int64_t>(number("L", true));
    p.us = number("us", false);
    // Two rows for one point (files of two runs put together) would leave
    // which one is the baseline to the order of the lines.
    for (const SdpaBaselinePoint& q : points)
      if (q.batch == p.batch && q.context == p.context)
        fail(ErrorKind::invalid_argument, path, ":", line_no, ": a second SDPA row for batch ", p.batch, ", context ",
             p.context);
    points.push_back(p);
  }
  if (points.empty())
    fail(ErrorKind::invalid_argument, "'", path,
         "' holds no torch SDPA decode rows (kind attn_decode, impl torch_sdpa_fp16)");
  return points;
}

}  // namespace lowbit
