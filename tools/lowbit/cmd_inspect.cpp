// `lowbit inspect FILE|DIR`: the tensors of a checkpoint (name, dtype, shape,
// bytes), its config, and the quantization format and group size detected
// from the config and checked against the tensor shapes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "lowbit/checkpoint/quantized_checkpoint.h"
#include "lowbit/gguf/gguf_file.h"
#include "lowbit/io/hf_config.h"

namespace lowbit::cli {
namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

struct LayerSummary {
  std::string prefix;
  std::string layout;
  int64_t K = 0, N = 0;
  int group_size = 0;
  std::string zero_point;
  bool act_order = false;
};

nlohmann::json inspect(const std::string& path) {
  const io::Checkpoint ck = io::Checkpoint::open(path);
  nlohmann::json out;
  out["path"] = path;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : ck.files()) files.push_back(f.path().filename().string());
  out["files"] = files;
  if (ck.config()) {
    const io::HfConfig& c = *ck.config();
    out["config"] = {{"model_type", c.model_type},         {"architectures", c.architectures},
                     {"hidden_size", c.hidden_size},       {"intermediate_size", c.intermediate_size},
                     {"num_hidden_layers", c.num_hidden_layers}, {"num_attention_heads", c.num_attention_heads},
                     {"num_key_value_heads", c.num_key_value_heads}, {"vocab_size", c.vocab_size},
                     {"torch_dtype", c.torch_dtype}};
  }
  const io::QuantizationInfo& q = ck.quantization();
  out["quantization"] = {{"method", io::quant_method_name(q.method)}};
  if (q.method != io::QuantMethod::none) {
    out["quantization"].update({{"bits", q.bits}, {"group_size", q.group_size}, {"sym", q.sym},
                                {"desc_act", q.desc_act}, {"source", q.source}});
    if (q.method == io::QuantMethod::gptq) out["quantization"]["checkpoint_format"] = q.checkpoint_format;
    if (q.method == io::QuantMethod::awq) out["quantization"]["version"] = q.awq_version;
  }

  nlohmann::json tensors = nlohmann::json::array();
  uint64_t total = 0;
  int64_t quantizable = 0;
  for (const std::string& name : ck.tensor_names()) {
    const TensorView v = ck.view(name);
    std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.rank);
    tensors.push_back({{"name", name}, {"dtype", dtype_name(v.dtype)}, {"shape", shape}, {"bytes", v.nbytes()}});
    total += v.nbytes();
    if (checkpoint::is_quantizable_linear(name, shape)) ++quantizable;
  }
  out["tensors"] = tensors;
  out["total_bytes"] = total;
  out["quantizable_linear_layers"] = quantizable;

  nlohmann::json layers = nlohmann::json::array();
  for (const std::string& prefix : checkpoint::find_quantized_linears(ck)) {
    const formats::PackedLinear p = checkpoint::read_packed_linear(ck, prefix, q);
    layers.push_back({{"name", prefix}, {"layout", p.layout}, {"K", p.K}, {"N", p.N},
                      {"group_size", p.group_size}, {"zero_point", formats::zero_point_name(p.zero_point)},
                      {"act_order", p.has("g_idx") && !formats::unpack(p).has_trivial_g_idx()}});
  }
  out["quantized_layers"] = layers;
  return out;
}

void print_text(const nlohmann::json& r) {
  std::cout << r["path"].get<std::string>() << ": " << r["files"].size() << " safetensors file(s), "
            << r["tensors"].size() << " tensors, " << human_bytes(r["total_bytes"].get<double>()) << "\n";
  if (r.contains("config")) {
    const auto& c = r["config"];
    std::cout << "model: " << c["model_type"].get<std::string>() << ", " << c["num_hidden_layers"]
              << " layers, hidden " << c["hidden_size"] << ", intermediate " << c["intermediate_size"]
              << ", heads " << c["num_attention_heads"] << "/" << c["num_key_value_heads"] << ", vocab "
              << c["vocab_size"] << "\n";
  } else {
    std::cout << "model: no config.json\n";
  }
  const auto& q = r["quantization"];
  if (q["method"] == "none") {
    std::cout << "quantization: none (" << r["quantizable_linear_layers"]
              << " linear layers that `lowbit quantize` would quantize)\n";
  } else {
    std::cout << "quantization: " << q["method"].get<std::string>() << ", " << q["bits"] << " bits, group size "
              << q["group_size"] << (q["sym"].get<bool>() ? ", symmetric" : ", asymmetric")
              << (q["desc_act"].get<bool>() ? ", act-order" : "");
    if (q.contains("checkpoint_format")) std::cout << ", checkpoint_format " << q["checkpoint_format"].get<std::string>();
    if (q.contains("version")) std::cout << ", version " << q["version"].get<std::string>();
    std::cout << " (from " << q["source"].get<std::string>() << ")\n";
  }
  if (!r["quantized_layers"].empty()) {
    std::map<std::string, int> kinds;
    for (const auto& l : r["quantized_layers"])
      ++kinds["layout " + l["layout"].get<std::string>() + ", group size " + std::to_string(l["group_size"].get<int>()) +
              ", " + l["zero_point"].get<std::string>() + " zeros" + (l["act_order"].get<bool>() ? ", act-order" : "")];
    std::cout << "quantized layers: " << r["quantized_layers"].size() << " (detected from tensor shapes:";
    for (const auto& [k, n] : kinds) std::cout << " " << n << " x " << k << ";";
    std::cout << ")\n";
  }
  std::cout << "\n";
  size_t width = 4;
  for (const auto& t : r["tensors"]) width = std::max(width, t["name"].get<std::string>().size());
  std::printf("%-*s  %-5s  %-18s  %s\n", static_cast<int>(width), "name", "dtype", "shape", "bytes");
  for (const auto& t : r["tensors"]) {
    std::string shape = "[";
    for (size_t i = 0; i < t["shape"].size(); ++i) shape += (i ? ", " : "") + std::to_string(t["shape"][i].get<int64_t>());
    shape += "]";
    std::printf("%-*s  %-5s  %-18s  %s\n", static_cast<int>(width), t["name"].get<std::string>().c_str(),
                t["dtype"].get<std::string>().c_str(), shape.c_str(),
                human_bytes(t["bytes"].get<double>()).c_str());
  }
}

// ---- GGUF files ----------------------------------------------------------------

// A GGUF file by its magic, or by its name: a corrupt `.gguf` file then gets
// the GGUF reader's error (bad magic, truncated header) rather than the
// safetensors reader's, which would name a format the user never gave it.
// The engine's loaders decide by the extension too.
bool is_gguf_file(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".gguf") return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

nlohmann::json inspect_gguf(const std::string& path) {
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  nlohmann::json out;
  out["path"] = path;
  out["format"] = "gguf";
  out["version"] = f.version();
  out["alignment"] = f.alignment();
  out["architecture"] = f.get_string_or("general.architecture", "");
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& k : f.metadata_keys()) meta[k] = f.describe_value(k);
  out["metadata"] = meta;
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t total = 0;
  std::map<std::string, int> types;
  for (const auto& t : f.tensors()) {
    tensors.push_back({{"name", t.name}, {"type", gguf::ggml_type_name(t.type)}, {"shape", t.shape},
                       {"bytes", t.nbytes}});
    total += t.nbytes;
    ++types[gguf::ggml_type_name(t.type)];
  }
  out["tensors"] = tensors;
  out["tensor_types"] = types;
  out["total_bytes"] = total;
  return out;
}

void print_gguf_text(const nlohmann::json& r) {
  std::cout << r["path"].get<std::string>() << ": GGUF v" << r["version"] << ", " << r["tensors"].size()
            << " tensors, " << human_bytes(r["total_bytes"].get<double>()) << " (";
  bool first = true;
  for (const auto& [type, n] : r["tensor_types"].items()) {
    std::cout << (first ? "" : ", ") << n << " x " << type;
    first = false;
  }
  std::cout << ")\n";
  const auto& m = r["metadata"];
  if (!r["architecture"].get<std::string>().empty())
    std::cout << "architecture: " << r["architecture"].get<std::string>() << "\n";
  std::cout << "\nmetadata:\n";
  for (const auto& [k, v] : m.items()) std::cout << "  " << k << " = " << v.get<std::string>() << "\n";
  std::cout << "\n";
  size_t width = 4;
  for (const auto& t : r["tensors"]) width = std::max(width, t["name"].get<std::string>().size());
  std::printf("%-*s  %-5s  %-18s  %s\n", static_cast<int>(width), "name", "type", "shape (ggml order)", "bytes");
  for (const auto& t : r["tensors"]) {
    std::string shape = "[";
    for (size_t i = 0; i < t["shape"].size(); ++i) shape += (i ? ", " : "") + std::to_string(t["shape"][i].get<int64_t>());
    shape += "]";
    std::printf("%-*s  %-5s  %-18s  %s\n", static_cast<int>(width), t["name"].get<std::string>().c_str(),
                t["type"].get<std::string>().c_str(), shape.c_str(), human_bytes(t["bytes"].get<double>()).c_str());
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "inspect",
      "List a checkpoint's tensors (dtype, shape, bytes), its model config and the detected\n"
      "quantization format and group size (GPTQ v1/v2, AWQ, or none)");
  static std::string path;
  static bool json = false;
  cmd->add_option("PATH", path, "A .safetensors file, a Hugging Face checkpoint folder, or a .gguf file")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_flag("--json", json, "Print JSON instead of text");
  cmd->callback([] {
    if (is_gguf_file(path)) {  // GGUF model file: metadata summary and tensor table
      const nlohmann::json g = inspect_gguf(path);
      if (json)
        std::cout << g.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      else
        print_gguf_text(g);
      return;
    }
    const nlohmann::json r = inspect(path);
    if (json)
      std::cout << r.dump(2) << "\n";
    else
      print_text(r);
  });
}

}  // namespace lowbit::cli
