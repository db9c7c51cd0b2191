#include "lowbit/bench/json_rows.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "lowbit/core/error.h"

namespace lowbit::bench {
namespace {

constexpr const char* kStandardFields[] = {"suite", "impl",  "us",    "us_p10", "us_p90",
                                           "reps",  "bytes", "GBps",  "flops",  "TFLOPs"};

void check_field_names(const BenchRow& row) {
  std::set<std::string> seen(std::begin(kStandardFields), std::end(kStandardFields));
  auto check = [&](const std::vector<JsonField>& fields, const char* what) {
    for (const auto& field : fields) {
      if (!seen.insert(field.first).second)
        fail_argument(std::string(what) + " field name", field.first,
                      "a name not used by another field of the row nor a standard field "
                      "(suite, impl, us, us_p10, us_p90, reps, bytes, GBps, flops, TFLOPs)");
    }
  };
  check(row.shape, "shape");
  check(row.extra, "extra");
}

// A cell of the text table: integers as they are, other numbers with 4
// significant digits, strings without quotes.
std::string cell(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v.get<double>());
    return buf;
  }
  return v.dump();
}

std::string fixed(double value, int decimals) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

const nlohmann::json* find_field(const std::vector<JsonField>& fields, const std::string& name) {
  for (const auto& f : fields)
    if (f.first == name) return &f.second;
  return nullptr;
}

void add_unique(std::vector<std::string>& names, const std::vector<JsonField>& fields) {
  for (const auto& f : fields)
    if (std::find(names.begin(), names.end(), f.first) == names.end()) names.push_back(f.first);
}

}  // namespace

double BenchRow::GBps() const {
  return stats.median_us > 0 ? static_cast<double>(bytes) / (stats.median_us * 1e3) : 0.0;
}

double BenchRow::TFLOPs() const {
  return flops && stats.median_us > 0 ? *flops / (stats.median_us * 1e6) : 0.0;
}

nlohmann::ordered_json to_ordered_json(const BenchRow& row) {
  check_field_names(row);
  nlohmann::ordered_json j;
  j["suite"] = row.suite;
  j["impl"] = row.impl;
  for (const auto& [name, value] : row.shape) j[name] = value;
  j["us"] = row.stats.median_us;
  j["us_p10"] = row.stats.p10_us;
  j["us_p90"] = row.stats.p90_us;
  j["reps"] = row.stats.reps;
  j["bytes"] = row.bytes;
  j["GBps"] = row.GBps();
  if (row.flops) {
    j["flops"] = *row.flops;
    j["TFLOPs"] = row.TFLOPs();
  }
  for (const auto& [name, value] : row.extra) j[name] = value;
  return j;
}

nlohmann::json to_json(const BenchRow& row) {
  // Same values; only the key order differs (nlohmann::json sorts keys).
  return nlohmann::json::parse(to_ordered_json(row).dump());
}

JsonRowsWriter::JsonRowsWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::out | std::ios::app : std::ios::out | std::ios::trunc) {
  if (!out_) fail(ErrorKind::io, "cannot open benchmark output file '", path, "' for writing");
}

void JsonRowsWriter::write(const BenchRow& row) {
  if (run_fields_.empty()) return write_line(to_ordered_json(row));
  BenchRow with_run = row;
  with_run.extra.insert(with_run.extra.end(), run_fields_.begin(), run_fields_.end());
  write_line(to_ordered_json(with_run));  // checks the run fields' names against the row's
}

void JsonRowsWriter::write(const nlohmann::ordered_json& object) {
  if (run_fields_.empty() || !object.is_object()) return write_line(object);
  nlohmann::ordered_json with_run = object;
  for (const auto& [name, value] : run_fields_) {
    if (with_run.contains(name)) fail_argument("run field name", name, "a name the row does not use itself");
    with_run[name] = value;
  }
  write_line(with_run);
}

void JsonRowsWriter::write_line(const nlohmann::ordered_json& object) {
  out_ << object.dump() << '\n';
  out_.flush();
  if (!out_) fail(ErrorKind::io, "cannot write to benchmark output file '", path_, "'");
}

std::string format_table(const std::vector<BenchRow>& rows) {
  std::vector<std::string> shape_names, extra_names;
  bool any_flops = false;
  for (const auto& row : rows) {
    add_unique(shape_names, row.shape);
    add_unique(extra_names, row.extra);
    any_flops = any_flops || row.flops.has_value();
  }

  struct Column {
    std::string header;
    bool right = false;  // numbers are right-aligned
    std::vector<std::string> cells;
  };
  std::vector<Column> columns;
  columns.push_back({"suite", false, {}});
  columns.push_back({"impl", false, {}});
  for (const auto& name : shape_names) columns.push_back({name, true, {}});
  columns.push_back({"us", true, {}});
  columns.push_back({"GB/s", true, {}});
  if (any_flops) columns.push_back({"TFLOP/s", true, {}});
  for (const auto& name : extra_names) columns.push_back({name, true, {}});

  for (const auto& row : rows) {
    size_t c = 0;
    columns[c++].cells.push_back(row.suite);
    columns[c++].cells.push_back(row.impl);
    for (const auto& name : shape_names) {
      const nlohmann::json* v = find_field(row.shape, name);
      columns[c++].cells.push_back(v ? cell(*v) : "-");
    }
    columns[c++].cells.push_back(fixed(row.stats.median_us, 2));
    columns[c++].cells.push_back(fixed(row.GBps(), 1));
    if (any_flops) columns[c++].cells.push_back(row.flops ? fixed(row.TFLOPs(), 2) : "-");
    for (const auto& name : extra_names) {
      const nlohmann::json* v = find_field(row.extra, name);
      columns[c++].cells.push_back(v ? cell(*v) : "-");
    }
  }

  std::vector<size_t> widths;
  for (const auto& col : columns) {
    size_t w = col.header.size();
    for (const auto& s : col.cells) w = std::max(w, s.size());
    widths.push_back(w);
  }
  std::ostringstream out;
  auto emit_line = [&](auto&& text_of) {
    std::string line;
    for (size_t c = 0; c < columns.size(); ++c) {
      const std::string text = text_of(c);
      const std::string pad(widths[c] - text.size(), ' ');
      if (c) line += "  ";
      line += columns[c].right ? pad + text : text + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  emit_line([&](size_t c) { return columns[c].header; });
  emit_line([&](size_t c) { return std::string(widths[c], '-'); });
  for (size_t r = 0; r < rows.size(); ++r) emit_line([&](size_t c) { return columns[c].cells[r]; });
  return out.str();
}

}  // namespace lowbit::bench
