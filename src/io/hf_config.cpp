#include "lowbit/io/hf_config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>

#include "lowbit/core/error.h"

namespace lowbit::io {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string show_path(const fs::path& p) { return "'" + p.string() + "'"; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// nlohmann's what() is "[json.exception.parse_error.101] parse error at line 1,
// column 2: syntax error ..."; keep the part after the position.
std::string parse_error_detail(const json::parse_error& e) {
  std::string msg = e.what();
  const size_t at = msg.find("parse error");
  if (at != std::string::npos) {
    const size_t colon = msg.find(": ", at);
    if (colon != std::string::npos) return msg.substr(colon + 2);
  }
  return msg;
}

// A field of a JSON object; nullptr when absent or null.
const json* field(const json& obj, std::string_view name) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> get_int(const json& obj, std::string_view name, const std::string& where) {
  const json* v = field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(ErrorKind::format, where, ": field '", name, "' = ", v->dump(), " is too large");
    return v->get<int64_t>();
  }
  // Accept 4096.0 written by some tools, but nothing fractional.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15)
      return static_cast<int64_t>(d);
  }
  fail(ErrorKind::format, where, ": field '", name, "' = ", v->dump(), " is a JSON ",
       v->type_name(), ": expected an integer");
}

int64_t get_positive(const json& obj, std::string_view name, const std::string& where,
                     std::optional<int64_t> fallback) {
  const auto v = get_int(obj, name, where);
  if (!v) {
    if (fallback) return *fallback;
    fail(ErrorKind::format, where, ": missing required field '", name,
         "': expected a positive integer");
  }
  if (*v <= 0)
    fail(ErrorKind::format, where, ": field '", name, "' = ", *v, ": expected a positive integer");
  return *v;
}

std::optional<double> get_double(const json& obj, std::string_view name, const std::string& where) {
  const json* v = field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number())
    fail(ErrorKind::format, where, ": field '", name, "' = ", v->dump(), " is a JSON ",
         v->type_name(), ": expected a number");
  return v->get<double>();
}

std::optional<std::string> get_string(const json& obj, std::string_view name,
                                      const std::string& where) {
  const json* v = field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string())
    fail(ErrorKind::format, where, ": field '", name, "' = ", v->dump(), " is a JSON ",
         v->type_name(), ": expected a string");
  return v->get<std::string>();
}

std::optional<bool> get_bool(const json& obj, std::string_view name, const std::string& where) {
  const json* v = field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean())
    fail(ErrorKind::format, where, ": field '", name, "' = ", v->dump(), " is a JSON ",
         v->type_name(), ": expected true or false");
  return v->get<bool>();
}

// Re-throws an Error with "file 'path': " in front, keeping its kind.
template <typename F>
auto with_file(const fs::path& file, F&& body) {
  try {
    return body();
  } catch (const Error& e) {
    throw Error(e.kind(), "file " + show_path(file) + ": " + e.what());
  }
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

}  // namespace

// ---- JSON files ----------------------------------------------------------------

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    fail(ErrorKind::io, "cannot read JSON file ", show_path(path), ": it is a directory");
  if (!fs::exists(path, ec))
    fail(ErrorKind::io, "cannot open JSON file ", show_path(path), ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    fail(ErrorKind::io, "cannot open JSON file ", show_path(path), ": ", std::strerror(err));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(ErrorKind::io, "cannot read JSON file ", show_path(path));
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte counts the bytes read, the offending one included (1-based).
    const size_t at = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') { ++line; column = 1; } else { ++column; }
    }
    fail(ErrorKind::format, "JSON file ", show_path(path), " is not valid JSON: at line ", line,
         ", column ", column, " (byte ", at, "): ", parse_error_detail(e));
  }
}

// ---- config.json ---------------------------------------------------------------

HfConfig parse_hf_config(const nlohmann::json& config) {
  const std::string where = "HF config";
  if (!config.is_object())
    fail(ErrorKind::format, where, ": the config is a JSON ", config.type_name(),
         ": expected an object");
  HfConfig c;
  c.raw = config;
  c.model_type = get_string(config, "model_type", where).value_or("");
  if (const json* a = field(config, "architectures")) {
    if (!a->is_array())
      fail(ErrorKind::format, where, ": field 'architectures' is a JSON ", a->type_name(),
           ": expected an array of strings");
    for (size_t i = 0; i < a->size(); ++i) {
      if (!(*a)[i].is_string())
        fail(ErrorKind::format, where, ": field 'architectures[", i, "]' = ", (*a)[i].dump(),
             ": expected a string");
      c.architectures.push_back((*a)[i].get<std::string>());
    }
  }
  c.hidden_size = get_positive(config, "hidden_size", where, std::nullopt);
  c.intermediate_size = get_positive(config, "intermediate_size", where, std::nullopt);
  c.num_hidden_layers = get_positive(config, "num_hidden_layers", where, std::nullopt);
  c.num_attention_heads = get_positive(config, "num_attention_heads", where, std::nullopt);
  c.vocab_size = get_positive(config, "vocab_size", where, std::nullopt);
  c.num_key_value_heads =
      get_positive(config, "num_key_value_heads", where, c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(ErrorKind::format, where, ": num_attention_heads = ", c.num_attention_heads,
         " is not a multiple of num_key_value_heads = ", c.num_key_value_heads);
  if (get_int(config, "head_dim", where)) {
    c.head_dim = get_positive(config, "head_dim", where, std::nullopt);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      fail(ErrorKind::format, where, ": no 'head_dim', and hidden_size = ", c.hidden_size,
           " is not a multiple of num_attention_heads = ", c.num_attention_heads,
           " to derive it from");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (const auto eps = get_double(config, "rms_norm_eps", where)) {
    if (!(*eps > 0.0) || !std::isfinite(*eps))
      fail(ErrorKind::format, where, ": field 'rms_norm_eps' = ", *eps,
           ": expected a positive number");
    c.rms_norm_eps = *eps;
  }
  std::optional<double> theta = get_double(config, "rope_theta", where);
  if (!theta) {
    if (const json* rp = field(config, "rope_parameters"); rp != nullptr && rp->is_object())
      theta = get_double(*rp, "rope_theta", where + " (rope_parameters)");
  }
  if (theta) {
    if (!(*theta > 0.0) || !std::isfinite(*theta))
      fail(ErrorKind::format, where, ": field 'rope_theta' = ", *theta,
           ": expected a positive number");
    c.rope_theta = *theta;
  }
  if (auto dt = get_string(config, "torch_dtype", where)) {
    c.torch_dtype = std::move(*dt);
  } else if (auto dt2 = get_string(config, "dtype", where)) {
    c.torch_dtype = std::move(*dt2);
  }
  c.tie_word_embeddings = get_bool(config, "tie_word_embeddings", where).value_or(false);
  return c;
}

HfConfig load_hf_config(const std::filesystem::path& dir) {
  const fs::path file = dir / "config.json";
  const json j = read_json_file(file);
  return with_file(file, [&] { return parse_hf_config(j); });
}

// ---- quantization --------------------------------------------------------------

const char* quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::none: return "none";
    case QuantMethod::gptq: return "gptq";
    case QuantMethod::awq: return "awq";
  }
  return "?";
}

QuantizationInfo parse_quantization_config(const nlohmann::json& config, std::string_view source) {
  const std::string where = "quantization config (" + std::string(source) + ")";
  if (!config.is_object())
    fail(ErrorKind::format, where, " is a JSON ", config.type_name(), ": expected an object");
  QuantizationInfo q;
  q.source = std::string(source);
  q.raw = config;

  std::string method;
  if (auto m = get_string(config, "quant_method", where)) {
    method = lower(*m);
  } else if (field(config, "w_bit") || field(config, "q_group_size") ||
             field(config, "zero_point")) {
    method = "awq";  // AutoAWQ's field names
  } else if (field(config, "bits")) {
    method = "gptq";  // older AutoGPTQ quantize_config.json omit quant_method
  } else {
    fail(ErrorKind::format, where,
         ": no 'quant_method' and no 'bits': cannot tell how the weights are quantized");
  }
  if (method == "gptq") {
    q.method = QuantMethod::gptq;
  } else if (method == "awq") {
    q.method = QuantMethod::awq;
  } else {
    fail(ErrorKind::unsupported, where, ": quant_method '", method,
         "' is not supported: lowbit reads 'gptq' and 'awq' checkpoints");
  }

  const char* bits_name = field(config, "bits") ? "bits" : "w_bit";
  const auto bits = get_int(config, bits_name, where);
  if (!bits)
    fail(ErrorKind::format, where, ": missing 'bits'", q.method == QuantMethod::awq ? " (or 'w_bit')" : "",
         ": expected the number of bits per weight");
  if (*bits < 1 || *bits > 8)
    fail(ErrorKind::format, where, ": field '", bits_name, "' = ", *bits, ": expected 1 to 8");
  q.bits = static_cast<int>(*bits);

  const char* group_name = field(config, "group_size") ? "group_size" : "q_group_size";
  const int64_t group = get_int(config, group_name, where).value_or(128);
  if (group != -1 && (group <= 0 || group > std::numeric_limits<int>::max()))
    fail(ErrorKind::format, where, ": field '", group_name, "' = ", group,
         ": expected -1 (per channel) or a positive group size");
  q.group_size = static_cast<int>(group);

  if (q.method == QuantMethod::gptq) {
    q.sym = get_bool(config, "sym", where).value_or(true);
    q.desc_act = get_bool(config, "desc_act", where).value_or(false);
    q.zero_point = true;
    if (get_bool(config, "is_marlin_format", where).value_or(false))
      fail(ErrorKind::unsupported, where,
           ": is_marlin_format = true: Marlin-repacked GPTQ checkpoints are not supported; "
           "expected checkpoint_format 'gptq' or 'gptq_v2'");
    const char* fmt_name = field(config, "checkpoint_format") ? "checkpoint_format" : "format";
    q.checkpoint_format = lower(get_string(config, fmt_name, where).value_or("gptq"));
    if (q.checkpoint_format != "gptq" && q.checkpoint_format != "gptq_v2")
      fail(ErrorKind::unsupported, where, ": ", fmt_name, " '", q.checkpoint_format,
           "' is not supported: expected 'gptq' or 'gptq_v2'");
  } else {
    q.zero_point = get_bool(config, "zero_point", where).value_or(true);
    q.sym = !q.zero_point;
    q.desc_act = false;
    q.awq_version = lower(get_string(config, "version", where).value_or("gemm"));
  }
  return q;
}

QuantizationInfo detect_quantization(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(ErrorKind::io, "cannot look for quantization configs in ", show_path(dir),
         ": not a folder");
  std::optional<QuantizationInfo> from_config;
  const fs::path config_file = dir / "config.json";
  if (is_file(config_file)) {
    const json cfg = read_json_file(config_file);
    if (cfg.is_object()) {
      if (const json* qc = field(cfg, "quantization_config"))
        from_config = with_file(config_file, [&] {
          return parse_quantization_config(*qc, "config.json:quantization_config");
        });
    }
  }
  std::optional<QuantizationInfo> from_quantize;
  const fs::path quantize_file = dir / "quantize_config.json";
  if (is_file(quantize_file)) {
    const json qc = read_json_file(quantize_file);
    from_quantize =
        with_file(quantize_file, [&] { return parse_quantization_config(qc, "quantize_config.json"); });
  }
  if (from_config && from_quantize) {
    QuantizationInfo& a = *from_config;
    const QuantizationInfo& b = *from_quantize;
    if (a.method == b.method && (a.bits != b.bits || a.group_size != b.group_size))
      fail(ErrorKind::format, "checkpoint ", show_path(dir),
           ": config.json's quantization_config (bits ", a.bits, ", group_size ", a.group_size,
           ") and quantize_config.json (bits ", b.bits, ", group_size ", b.group_size,
           ") disagree");
    const bool a_has_format = field(a.raw, "checkpoint_format") || field(a.raw, "format");
    if (a.method == QuantMethod::gptq && b.method == QuantMethod::gptq && !a_has_format)
      a.checkpoint_format = b.checkpoint_format;
  }
  if (from_config) return *from_config;
  if (from_quantize) return *from_quantize;
  const fs::path awq_file = dir / "quant_config.json";
  if (is_file(awq_file)) {
    const json qc = read_json_file(awq_file);
    return with_file(awq_file, [&] { return parse_quantization_config(qc, "quant_config.json"); });
  }
  return QuantizationInfo{};
}

// ---- Checkpoint ----------------------------------------------------------------

namespace {

// The shard files an index names, in sorted order; checks that each exists.
std::vector<fs::path> shards_from_index(const fs::path& dir, const fs::path& index_file,
                                        const json& index,
                                        std::map<std::string, std::string>& weight_map) {
  const std::string where = "index " + show_path(index_file);
  if (!index.is_object())
    fail(ErrorKind::format, where, " is a JSON ", index.type_name(), ": expected an object");
  const json* wm = field(index, "weight_map");
  if (wm == nullptr || !wm->is_object())
    fail(ErrorKind::format, where, ": ",
         wm == nullptr ? std::string("missing 'weight_map'")
                       : "'weight_map' is a JSON " + std::string(wm->type_name()),
         ": expected an object mapping tensor names to shard file names");
  std::set<std::string> names;
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string())
      fail(ErrorKind::format, where, ": weight_map['", tensor, "'] = ", file.dump(),
           ": expected a shard file name (a string)");
    const auto& name = file.get_ref<const std::string&>();
    const fs::path rel(name);
    bool escapes = name.empty() || rel.is_absolute();
    for (const auto& part : rel)
      if (part == "..") escapes = true;
    if (escapes)
      fail(ErrorKind::format, where, ": weight_map['", tensor, "'] = '", name,
           "': expected a file name inside the checkpoint folder");
    const std::string norm = rel.lexically_normal().string();  // "./a" and "a" are one shard
    weight_map.emplace(tensor, norm);
    if (names.insert(norm).second && !is_file(dir / norm))
      fail(ErrorKind::format, where, " names shard '", name, "' (for tensor '", tensor,
           "'), which does not exist in ", show_path(dir));
  }
  return std::vector<fs::path>(names.begin(), names.end());
}

// The regular files in `dir` whose names end with `suffix`, sorted.
std::vector<fs::path> list_files(const fs::path& dir, std::string_view suffix) {
  std::vector<fs::path> out;
  try {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          is_file(entry.path()))
        out.push_back(entry.path());
    }
  } catch (const fs::filesystem_error& e) {
    fail(ErrorKind::io, "cannot list checkpoint folder ", show_path(dir), ": ", e.code().message());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Checkpoint Checkpoint::open(const std::filesystem::path& path) {
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  std::vector<fs::path> shards;  // relative to the folder (or the file itself)
  std::map<std::string, std::string> weight_map;
  fs::path index_file;
  fs::path dir;
  if (fs::is_regular_file(path, ec)) {
    shards.push_back(path);
  } else if (fs::is_directory(path, ec)) {
    dir = path;
    index_file = dir / "model.safetensors.index.json";
    if (!is_file(index_file)) {
      index_file.clear();
      const std::vector<fs::path> candidates = list_files(dir, ".safetensors.index.json");
      if (candidates.size() > 1)
        fail(ErrorKind::format, "checkpoint folder ", show_path(dir), " has ", candidates.size(),
             " safetensors index files (", show_path(candidates[0].filename()), ", ",
             show_path(candidates[1].filename()),
             ", ...) and no model.safetensors.index.json: expected one");
      if (candidates.size() == 1) index_file = candidates[0];
    }
    if (!index_file.empty()) {
      const json index = read_json_file(index_file);
      for (const auto& rel : shards_from_index(dir, index_file, index, weight_map))
        shards.push_back(dir / rel);
    } else {
      shards = list_files(dir, ".safetensors");
      if (shards.empty())
        fail(ErrorKind::format, "checkpoint folder ", show_path(dir),
             " has no .safetensors files (and no model.safetensors.index.json)");
    }
  } else {
    fail(ErrorKind::io, "cannot open checkpoint ", show_path(path),
         ": no such file or folder");
  }

  c.files_.reserve(shards.size());
  for (const auto& s : shards) c.files_.push_back(SafetensorsFile::open(s));
  // files_ is complete: pointers into it are stable from here on.
  for (const auto& f : c.files_) {
    for (const auto& t : f.tensors()) {
      const auto [it, inserted] = c.index_.emplace(t.name, CheckpointTensor{&f, &t});
      if (!inserted)
        fail(ErrorKind::format, "checkpoint ", show_path(path), ": tensor '", t.name,
             "' is in two shards, ", show_path(it->second.file->path().filename()), " and ",
             show_path(f.path().filename()), ": expected each name once");
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    const auto it = c.index_.find(tensor);
    if (it == c.index_.end())
      fail(ErrorKind::format, "index ", show_path(index_file), " puts tensor '", tensor,
           "' in shard '", file, "', but that shard has no such tensor");
    if (it->second.file->path() != dir / fs::path(file))
      fail(ErrorKind::format, "index ", show_path(index_file), " puts tensor '", tensor,
           "' in shard '", file, "', but it is in ",
           show_path(it->second.file->path().filename()));
  }

  if (!dir.empty()) {
    if (is_file(dir / "config.json")) c.config_ = load_hf_config(dir);
    c.quantization_ = detect_quantization(dir);
  }
  return c;
}

const CheckpointTensor* Checkpoint::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &it->second;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& kv : index_) names.push_back(kv.first);
  return names;
}

const CheckpointTensor& Checkpoint::get(std::string_view name) const {
  if (const auto* t = find(name)) return *t;
  std::ostringstream some;
  size_t shown = 0;
  for (const auto& kv : index_) {
    if (shown == 5) { some << ", ..."; break; }
    some << (shown++ ? ", '" : "'") << kv.first << "'";
  }
  fail(ErrorKind::format, "checkpoint ", show_path(path_), " has no tensor '", name, "' (it has ",
       index_.size(), " tensors", index_.empty() ? "" : ": ", some.str(), ")");
}

TensorView Checkpoint::view(std::string_view name) const {
  const auto& t = get(name);
  return t.file->view(*t.info);
}

std::span<const std::byte> Checkpoint::bytes(std::string_view name) const {
  const auto& t = get(name);
  return t.file->bytes(*t.info);
}

}  // namespace lowbit::io
