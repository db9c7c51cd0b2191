#include "lowbit/checkpoint/quantized_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "lowbit/build_info.h"
#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/parallel.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/formats/rtn.h"

namespace fs = std::filesystem;

namespace lowbit::checkpoint {

const char* quant_format_name(QuantFormat format) {
  switch (format) {
    case QuantFormat::gptq: return "gptq";
    case QuantFormat::gptq_v2: return "gptq_v2";
    case QuantFormat::awq: return "awq";
  }
  return "?";
}

std::optional<QuantFormat> parse_quant_format(std::string_view name) {
  for (QuantFormat f : {QuantFormat::gptq, QuantFormat::gptq_v2, QuantFormat::awq})
    if (name == quant_format_name(f)) return f;
  return std::nullopt;
}

const char* layout_name(QuantFormat format) { return quant_format_name(format); }

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

std::string strip_suffix(std::string_view s, std::string_view suffix) {
  return std::string(s.substr(0, s.size() - suffix.size()));
}

// Element i of a f32/f16/bf16 host view, as float.
float load_float(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::f32: return v.as<const float>()[i];
    case DType::f16: return f16_to_float(v.as<const f16>()[i]);
    case DType::bf16: return bf16_to_float(v.as<const bf16>()[i]);
    default: break;
  }
  fail(ErrorKind::internal, "load_float on dtype ", dtype_name(v.dtype));
}

formats::HostTensor copy_tensor(const io::Checkpoint& ck, const std::string& name) {
  return formats::HostTensor::copy_of(ck.view(name));
}

// A folder that is removed on destruction unless released: the output of a
// job is assembled here and moved into place only when it is complete.
class StagingDir {
 public:
  explicit StagingDir(const fs::path& final_path) {
    const fs::path parent = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
    path_ = parent / ("." + final_path.filename().string() + ".partial-" + std::to_string(getpid()));
    std::error_code ec;
    fs::remove_all(path_, ec);
    fs::create_directories(path_, ec);
    if (ec) fail(ErrorKind::io, "cannot create the folder '", path_.string(), "': ", ec.message());
  }
  ~StagingDir() {
    if (!released_) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const fs::path& path() const { return path_; }

  // Moves the staging folder to `final_path`; an existing folder there is
  // replaced (the caller has checked that this is wanted) only after the new
  // one is complete, so a failure leaves either the old or the new folder.
  void commit(const fs::path& final_path) {
    std::error_code ec;
    fs::path backup;
    if (fs::exists(final_path)) {
      backup = final_path;
      backup += ".old-" + std::to_string(getpid());
      fs::rename(final_path, backup, ec);
      if (ec) fail(ErrorKind::io, "cannot move the existing '", final_path.string(), "' aside: ", ec.message());
    }
    fs::rename(path_, final_path, ec);
    if (ec) {
      if (!backup.empty()) fs::rename(backup, final_path, ec);
      fail(ErrorKind::io, "cannot move the finished output into '", final_path.string(), "': ", ec.message());
    }
    released_ = true;
    if (!backup.empty()) fs::remove_all(backup, ec);
  }

 private:
  fs::path path_;
  bool released_ = false;
};

void write_json(const fs::path& path, const nlohmann::json& value) {
  std::ofstream out(path);
  out << value.dump(2) << "\n";
  out.close();
  if (!out) fail(ErrorKind::io, "cannot write '", path.string(), "'");
}

void check_output_folder(const fs::path& input, const fs::path& output, bool overwrite) {
  std::error_code ec;
  if (fs::exists(output) && fs::equivalent(input, output, ec))
    fail(ErrorKind::invalid_argument, "the output folder '", output.string(),
         "' is the input folder: expected a different folder");
  if (fs::exists(output) && !fs::is_directory(output))
    fail(ErrorKind::invalid_argument, "the output '", output.string(),
         "' exists and is not a folder: expected a new or empty folder");
  if (fs::is_directory(output) && !fs::is_empty(output) && !overwrite)
    fail(ErrorKind::invalid_argument, "the output folder '", output.string(),
         "' exists and is not empty: expected a new or empty folder (pass --force to replace it)");
}

}  // namespace

bool is_quantizable_linear(std::string_view name, const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || !ends_with(name, ".weight")) return false;
  const bool in_block = contains(name, ".layers.") || contains(name, ".h.") ||
                        contains(name, ".blocks.") || name.rfind("layers.", 0) == 0;
  if (!in_block) return false;
  return !contains(name, "embed") && !contains(name, "norm") && !contains(name, "lm_head");
}

std::vector<std::string> find_quantized_linears(const io::Checkpoint& checkpoint) {
  std::vector<std::string> prefixes;
  for (const std::string& name : checkpoint.tensor_names())
    if (ends_with(name, ".qweight")) prefixes.push_back(strip_suffix(name, ".qweight"));
  std::sort(prefixes.begin(), prefixes.end());
  return prefixes;
}

formats::PackedLinear read_packed_linear(const io::Checkpoint& checkpoint, const std::string& prefix,
                                         const io::QuantizationInfo& q) {
  if (q.method == io::QuantMethod::none)
    fail(ErrorKind::format, "layer '", prefix, "' has a qweight but the checkpoint '",
         checkpoint.path().string(),
         "' has no quantization config: expected config.json:quantization_config or quantize_config.json");
  if (q.bits != 4)
    fail(ErrorKind::unsupported, "layer '", prefix, "': ", q.bits, "-bit ",
         io::quant_method_name(q.method), " checkpoints are not supported: expected bits = 4");
  const auto require = [&](const std::string& suffix) -> const std::string {
    const std::string name = prefix + suffix;
    if (checkpoint.find(name) == nullptr)
      fail(ErrorKind::format, "layer '", prefix, "' of '", checkpoint.path().string(),
           "' has no tensor '", name, "': expected qweight, qzeros and scales for a ",
           io::quant_method_name(q.method), " layer");
    return name;
  };

  formats::PackedLinear packed;
  const TensorView qweight = checkpoint.view(require(".qweight"));
  const TensorView scales = checkpoint.view(require(".scales"));
  if (qweight.rank != 2 || scales.rank != 2)
    fail(ErrorKind::format, "layer '", prefix, "': qweight ", qweight.shape_string(), " and scales ",
         scales.shape_string(), " must both be 2-D");
  if (q.method == io::QuantMethod::gptq) {
    packed.layout = q.checkpoint_format == "gptq_v2" ? "gptq_v2" : "gptq";
    packed.K = qweight.shape[0] * 8;
    packed.N = qweight.shape[1];
    packed.zero_point = q.sym ? formats::ZeroPoint::symmetric : formats::ZeroPoint::integer;
  } else {
    if (!q.awq_version.empty() && q.awq_version != "gemm")
      fail(ErrorKind::unsupported, "layer '", prefix, "': AWQ version '", q.awq_version,
           "' is not supported: expected \"gemm\"");
    packed.layout = "awq";
    packed.K = qweight.shape[0];
    packed.N = qweight.shape[1] * 8;
    packed.zero_point = formats::ZeroPoint::integer;
  }
  const int64_t G = scales.shape[0];
  if (scales.shape[1] != packed.N)
    fail(ErrorKind::format, "layer '", prefix, "': scales ", scales.shape_string(), " do not match qweight ",
         qweight.shape_string(), ": expected ", packed.N, " columns (out_features)");
  if (G < 1 || packed.K % G != 0)
    fail(ErrorKind::format, "layer '", prefix, "': scales has ", G, " rows, which does not divide K = ",
         packed.K, ": expected K / group_size rows");
  // One row of scales means one group spanning K: per channel (group_size -1).
  const int64_t rows_per_group = packed.K / G;
  if ((q.group_size > 0 && q.group_size != rows_per_group) || (q.group_size == -1 && G != 1))
    fail(ErrorKind::format, "layer '", prefix, "': scales ", scales.shape_string(), " imply groups of ",
         rows_per_group, " rows of K = ", packed.K, " but the config says group_size = ", q.group_size);
  packed.group_size = G == 1 ? -1 : static_cast<int>(rows_per_group);

  packed.tensors["qweight"] = formats::HostTensor::copy_of(qweight);
  packed.tensors["scales"] = formats::HostTensor::copy_of(scales);
  packed.tensors["qzeros"] = copy_tensor(checkpoint, require(".qzeros"));
  if (q.method == io::QuantMethod::gptq && checkpoint.find(prefix + ".g_idx") != nullptr)
    packed.tensors["g_idx"] = copy_tensor(checkpoint, prefix + ".g_idx");
  return packed;
}

void add_packed_linear(io::SafetensorsWriter& writer, const std::string& prefix,
                       const formats::PackedLinear& packed) {
  for (const auto& [name, tensor] : packed.tensors)
    writer.add_copy(prefix + "." + name, tensor.dtype, tensor.shape, tensor.bytes);
}

nlohmann::json make_quantization_config(const QuantizeOptions& options) {
  const nlohmann::json meta = {{"quantizer", std::string("lowbit ") + LOWBIT_VERSION},
                               {"method", "rtn (round to nearest, min-max)"}};
  if (options.format == QuantFormat::awq) {
    // AutoAWQ's GEMM layout always stores zero points; a symmetric layer stores z = 8.
    return {{"quant_method", "awq"},   {"bits", options.bits},
            {"group_size", options.group_size}, {"zero_point", true},
            {"version", "gemm"},       {"modules_to_not_convert", nullptr},
            {"meta", meta}};
  }
  return {{"quant_method", "gptq"},
          {"bits", options.bits},
          {"group_size", options.group_size},
          {"desc_act", false},
          {"sym", options.sym},
          {"static_groups", false},
          {"true_sequential", true},
          {"damp_percent", 0.01},
          {"checkpoint_format", options.format == QuantFormat::gptq_v2 ? "gptq_v2" : "gptq"},
          {"meta", meta}};
}

QuantizeSummary quantize_checkpoint(const fs::path& input, const fs::path& output,
                                    const QuantizeOptions& options, const ProgressFn& progress) {
  LOWBIT_CHECK_ARG(options.bits == 4, "bits", options.bits, "4 (the only width lowbit quantizes to)");
  LOWBIT_CHECK_ARG(formats::is_supported_group_size(options.group_size), "group_size", options.group_size,
                   "one of 32, 64, 128, 256 or -1 (per channel)");
  if (!fs::is_directory(input))
    fail(ErrorKind::invalid_argument, "the input '", input.string(),
         "' is not a folder: expected a Hugging Face checkpoint folder (config.json + *.safetensors)");
  check_output_folder(input, output, options.overwrite);

  const io::Checkpoint ck = io::Checkpoint::open(input);
  if (ck.quantization().method != io::QuantMethod::none)
    fail(ErrorKind::invalid_argument, "the input '", input.string(), "' is already quantized (",
         io::quant_method_name(ck.quantization().method), "): expected an fp16/bf16/fp32 checkpoint");
  if (!ck.config())
    fail(ErrorKind::format, "the input '", input.string(), "' has no config.json: expected a Hugging Face checkpoint folder");

  std::vector<std::string> linear;
  for (const std::string& name : ck.tensor_names()) {
    const TensorView v = ck.view(name);
    if (is_quantizable_linear(name, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank)))
      linear.push_back(name);
  }
  if (linear.empty())
    fail(ErrorKind::format, "the checkpoint '", input.string(),
         "' has no linear layer weights to quantize (2-D '*.weight' tensors inside '.layers.')");

  formats::RtnOptions rtn;
  rtn.group_size = options.group_size;
  rtn.zero_point = options.sym ? formats::ZeroPoint::symmetric : formats::ZeroPoint::integer;
  rtn.min_zero = options.format == QuantFormat::gptq ? 1 : 0;  // v1 cannot store z = 0

  QuantizeSummary summary;
  StagingDir staging(output);
  io::SafetensorsWriter writer;
  const std::set<std::string> linear_set(linear.begin(), linear.end());
  int64_t done = 0;
  for (const std::string& name : linear) {
    const TensorView w = ck.view(name);
    if (w.dtype != DType::f16 && w.dtype != DType::bf16 && w.dtype != DType::f32)
      fail(ErrorKind::format, "tensor '", name, "' has dtype ", dtype_name(w.dtype),
           ": expected f16, bf16 or f32 weights to quantize");
    const std::string prefix = strip_suffix(name, ".weight");
    try {
      const formats::QuantizedLinear layer = formats::quantize_rtn(w, formats::WeightOrientation::out_in, rtn);
      const formats::PackedLinear packed = formats::pack(layer, layout_name(options.format));
      add_packed_linear(writer, prefix, packed);
      summary.output_tensor_bytes += packed.nbytes();
    } catch (const Error& e) {
      throw Error(e.kind(), "cannot quantize '" + name + "' " + w.shape_string() + ": " + e.what());
    }
    summary.input_tensor_bytes += w.nbytes();
    ++summary.quantized_layers;
    if (progress) progress(++done, static_cast<int64_t>(linear.size()), name);
  }
  for (const std::string& name : ck.tensor_names()) {
    if (linear_set.count(name)) continue;
    const TensorView v = ck.view(name);
    writer.add(name, v);  // zero-copy from the input's mapping
    summary.input_tensor_bytes += v.nbytes();
    summary.output_tensor_bytes += v.nbytes();
    ++summary.copied_tensors;
  }
  writer.set_metadata({{"format", "pt"}});
  summary.output_file = output / "model.safetensors";
  writer.write(staging.path() / "model.safetensors");

  nlohmann::json config = ck.config()->raw;
  config["quantization_config"] = make_quantization_config(options);
  write_json(staging.path() / "config.json", config);
  if (options.format != QuantFormat::awq) {
    nlohmann::json qc = make_quantization_config(options);
    qc["model_file_base_name"] = "model";
    write_json(staging.path() / "quantize_config.json", qc);
  }
  // Tokenizer, generation config and the like travel with the weights.
  for (const auto& entry : fs::directory_iterator(input)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || ends_with(file, ".safetensors") || file == "config.json" ||
        file == "quantize_config.json" || file == "model.safetensors.index.json" ||
        ends_with(file, ".bin") || ends_with(file, ".pt") || ends_with(file, ".pth"))
      continue;
    std::error_code ec;
    fs::copy_file(entry.path(), staging.path() / file, ec);
    if (ec) fail(ErrorKind::io, "cannot copy '", entry.path().string(), "': ", ec.message());
    summary.copied_files.push_back(file);
  }
  staging.commit(output);
  return summary;
}

DequantizeSummary dequantize_checkpoint(const fs::path& input, const fs::path& output_file, DType dtype,
                                        const std::optional<fs::path>& reference,
                                        const ProgressFn& progress) {
  LOWBIT_CHECK_ARG(dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::f32, "dtype",
                   dtype_name(dtype), "f16, bf16 or f32");
  const io::Checkpoint ck = io::Checkpoint::open(input);
  const io::QuantizationInfo& q = ck.quantization();
  const std::vector<std::string> prefixes = find_quantized_linears(ck);
  if (prefixes.empty())
    fail(ErrorKind::format, "'", input.string(), "' has no quantized layers (no '*.qweight' tensors)");
  std::optional<io::Checkpoint> ref;
  if (reference) ref = io::Checkpoint::open(*reference);

  DequantizeSummary summary;
  io::SafetensorsWriter writer;
  std::set<std::string> consumed;
  int64_t done = 0;
  for (const std::string& prefix : prefixes) {
    const formats::QuantizedLinear layer = formats::unpack(read_packed_linear(ck, prefix, q));
    for (const char* part : {".qweight", ".qzeros", ".scales", ".g_idx"}) consumed.insert(prefix + part);
    const int64_t K = layer.K, N = layer.N;
    std::vector<float> w_kn(static_cast<size_t>(K * N));
    formats::dequantize_ref(layer, w_kn.data());

    // Back to torch.nn.Linear's [N, K] in the requested dtype.
    std::vector<int64_t> shape = {N, K};
    std::vector<std::byte> bytes(dtype_bytes(dtype, static_cast<size_t>(N * K)));
    parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const float v = w_kn[static_cast<size_t>(k * N + n)];
          const size_t i = static_cast<size_t>(n * K + k);
          if (dtype == DType::f32) reinterpret_cast<float*>(bytes.data())[i] = v;
          else if (dtype == DType::f16) reinterpret_cast<f16*>(bytes.data())[i] = float_to_f16(v);
          else reinterpret_cast<bf16*>(bytes.data())[i] = float_to_bf16(v);
        }
    });
    const std::string name = prefix + ".weight";
    writer.add_copy(name, dtype, shape, bytes);

    if (ref) {
      const io::CheckpointTensor* t = ref->find(name);
      if (t == nullptr)
        fail(ErrorKind::format, "the reference checkpoint '", reference->string(), "' has no tensor '", name, "'");
      const TensorView orig = ref->view(name);
      if (orig.rank != 2 || orig.shape[0] != N || orig.shape[1] != K)
        fail(ErrorKind::format, "reference tensor '", name, "' is ", orig.shape_string(),
             ": expected [", N, ", ", K, "] to match the quantized layer");
      LayerError err;
      err.name = name;
      double diff2 = 0, ref2 = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const double a = load_float(orig, n * K + k);
          const double d = a - w_kn[static_cast<size_t>(k * N + n)];
          diff2 += d * d;
          ref2 += a * a;
          err.max_abs = std::max(err.max_abs, std::fabs(d));
          const double s = std::fabs(f16_to_float(layer.scales[static_cast<size_t>(layer.group_of(k) * N + n)]));
          if (s > 0) err.max_in_scales = std::max(err.max_in_scales, std::fabs(d) / s);
        }
      err.relative_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
      summary.errors.push_back(err);
    }
    ++summary.dequantized_layers;
    if (progress) progress(++done, static_cast<int64_t>(prefixes.size()), name);
  }
  for (const std::string& name : ck.tensor_names()) {
    if (consumed.count(name)) continue;
    writer.add(name, ck.view(name));
    ++summary.copied_tensors;
  }
  writer.set_metadata({{"format", "pt"}});
  writer.write(output_file);
  return summary;
}

}  // namespace lowbit::checkpoint
