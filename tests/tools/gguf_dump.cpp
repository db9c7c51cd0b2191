// gguf_dump FILE OUTDIR [NAME | NAME@ROW0:ROW1]...
// Reads FILE with lowbit's GgufFile and writes
//   OUTDIR/info.json   version, alignment, data offset, every metadata key
//                      ({"type", "value"} for scalars; {"type", "count",
//                      "head": first 8 elements} for arrays) and the tensor
//                      table (name, shape in ggml order, type, offset, nbytes);
//   OUTDIR/<i>.f32     for the i-th NAME given: dequantize_to_f32 (or the rows
//                      ROW0..ROW1 through dequantize_rows_to_f32), raw float32;
//   OUTDIR/<i>.ql.f32  for Q4_1/Q4_0 tensors dumped whole: to_quantized_linear's
//                      dequant(k, n) in lowbit's [K, N] order.
// Driven by tests/python/test_gguf_compat.py, which checks all of it against
// a GGUF reader and dequantizers written in numpy from the format description.
// Exit codes: 0 success, 1 any error (message on stderr), 2 usage.
#include <exception>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/gguf/gguf_file.h"

namespace {

using lowbit::gguf::GgufFile;
using lowbit::gguf::ValueType;

void write_floats(const std::filesystem::path& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!out) lowbit::fail(lowbit::ErrorKind::io, "cannot write ", path.string());
}

nlohmann::ordered_json metadata_json(const GgufFile& f, const std::string& key) {
  const ValueType t = *f.type_of(key);
  nlohmann::ordered_json j;
  if (t == ValueType::array) {
    const ValueType e = *f.array_type_of(key);
    j["type"] = lowbit::gguf::value_type_name(t, e);
    j["count"] = f.array_size(key);
    nlohmann::ordered_json head = nlohmann::ordered_json::array();
    const size_t n = std::min<uint64_t>(f.array_size(key), 8);
    if (e == ValueType::string) {
      const auto v = f.get_string_array(key);
      for (size_t i = 0; i < n; ++i) head.push_back(v[i]);
    } else if (e == ValueType::f32 || e == ValueType::f64) {
      const auto v = f.get_float_array(key);
      for (size_t i = 0; i < n; ++i) head.push_back(v[i]);
    } else if (e != ValueType::boolean) {
      const auto v = f.get_int_array(key);
      for (size_t i = 0; i < n; ++i) head.push_back(v[i]);
    }
    j["head"] = head;
    return j;
  }
  j["type"] = lowbit::gguf::value_type_name(t);
  switch (t) {
    case ValueType::string: j["value"] = f.get_string(key); break;
    case ValueType::boolean: j["value"] = f.get_bool(key); break;
    case ValueType::f32: case ValueType::f64: j["value"] = f.get_float(key); break;
    default: j["value"] = f.get_int(key); break;
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: gguf_dump FILE OUTDIR [NAME | NAME@ROW0:ROW1]...\n";
    return 2;
  }
  try {
    const GgufFile f = GgufFile::open(argv[1]);
    const std::filesystem::path out = argv[2];
    std::filesystem::create_directories(out);
    nlohmann::ordered_json info;
    info["version"] = f.version();
    info["alignment"] = f.alignment();
    info["data_offset"] = f.data_offset();
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& k : f.metadata_keys()) meta[k] = metadata_json(f, k);
    info["metadata"] = meta;
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const auto& t : f.tensors())
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"type", lowbit::gguf::ggml_type_name(t.type)},
                         {"offset", t.offset}, {"nbytes", t.nbytes}});
    info["tensors"] = tensors;
    std::ofstream(out / "info.json")
        << info.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";

    for (int i = 3; i < argc; ++i) {
      std::string arg = argv[i];
      const std::string index = std::to_string(i - 3);
      const size_t at = arg.find('@');
      const auto& t = f.tensor(arg.substr(0, at));
      if (at == std::string::npos) {
        write_floats(out / (index + ".f32"), lowbit::gguf::dequantize_to_f32(f, t));
        if (lowbit::gguf::maps_to_quantized_linear(t.type)) {
          const auto q = lowbit::gguf::to_quantized_linear(f, t);
          std::vector<float> w(static_cast<size_t>(q.K * q.N));
          for (int64_t k = 0; k < q.K; ++k)
            for (int64_t n = 0; n < q.N; ++n) w[static_cast<size_t>(k * q.N + n)] = q.dequant(k, n);
          write_floats(out / (index + ".ql.f32"), w);
        }
      } else {
        const std::string range = arg.substr(at + 1);
        const size_t colon = range.find(':');
        const int64_t r0 = std::stoll(range.substr(0, colon)), r1 = std::stoll(range.substr(colon + 1));
        std::vector<float> v(static_cast<size_t>((r1 - r0) * t.shape[0]));
        lowbit::gguf::dequantize_rows_to_f32(f, t, r0, r1, v);
        write_floats(out / (index + ".f32"), v);
      }
    }
  } catch (const lowbit::Error& e) {
    std::cerr << "gguf_dump: " << lowbit::error_kind_name(e.kind()) << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gguf_dump: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
