// Reading a Hugging Face checkpoint folder: config.json, the quantization
// settings of GPTQ and AWQ checkpoints, and the (possibly sharded) safetensors
// weights.
//
// Format facts this code relies on:
//   * config.json is one JSON object (transformers' PretrainedConfig.to_dict());
//     Llama-family models name their sizes hidden_size, intermediate_size,
//     num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size,
//     head_dim; newer transformers write "dtype" where older ones wrote
//     "torch_dtype", and may move rope_theta into "rope_parameters";
//   * quantized checkpoints describe themselves in config.json under
//     "quantization_config" ({"quant_method": "gptq"|"awq", "bits", "group_size",
//     ...}), or in AutoGPTQ's quantize_config.json (bits, group_size, desc_act,
//     sym, optionally quant_method and checkpoint_format, or GPTQModel's
//     "format"), or in AutoAWQ's quant_config.json (w_bit, q_group_size,
//     zero_point, version). GPTQ "checkpoint_format" "gptq" (v1) stores zero
//     points minus one; "gptq_v2" stores them as they are;
//   * a sharded checkpoint has model.safetensors.index.json:
//     {"metadata": {...}, "weight_map": {tensor name: shard file name}}; only the
//     shards it names belong to the model (folders often hold other
//     .safetensors files, e.g. Mistral's consolidated.safetensors).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/core/tensor.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::io {

// Reads and parses a JSON file. Throws Error(io) when it cannot be read and
// Error(format) naming the file, line, column and byte of a syntax error.
nlohmann::json read_json_file(const std::filesystem::path& path);

// The fields of config.json that lowbit uses. Required (Error(format) when
// absent): hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, vocab_size. Optional, with these defaults:
//   model_type          ""
//   architectures       {}
//   num_key_value_heads num_attention_heads (no grouped-query attention)
//   head_dim            hidden_size / num_attention_heads (must divide)
//   rms_norm_eps        1e-6 (LlamaConfig's default)
//   rope_theta          10000.0 (also read from rope_parameters.rope_theta)
//   torch_dtype         "" (also read from "dtype")
//   tie_word_embeddings false (LlamaConfig's default; PretrainedConfig's is true,
//                       so when it matters check whether lm_head.weight exists)
// A JSON null counts as absent. Integers must be positive, and
// num_attention_heads a multiple of num_key_value_heads. Wrong JSON types give
// Error(format) naming the field.
struct HfConfig {
  std::string model_type;
  std::vector<std::string> architectures;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t vocab_size = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::string torch_dtype;
  bool tie_word_embeddings = false;
  nlohmann::json raw;  // the whole config object
};

HfConfig parse_hf_config(const nlohmann::json& config);
// Reads dir/config.json; errors name the file.
HfConfig load_hf_config(const std::filesystem::path& dir);

enum class QuantMethod { none, gptq, awq };
const char* quant_method_name(QuantMethod m);  // "none", "gptq", "awq"

// How a checkpoint's weights are quantized. For method none, the other fields
// keep the defaults below.
struct QuantizationInfo {
  QuantMethod method = QuantMethod::none;
  int bits = 0;             // 1..8; required in every quantization config
  int group_size = 0;       // -1 = one group per output channel; default 128 when absent
  bool sym = true;          // GPTQ: "sym" (default true); AWQ: !zero_point
  bool desc_act = false;    // GPTQ act-order (g_idx permutes groups); AWQ: false
  std::string checkpoint_format;  // GPTQ: "gptq" (v1, zeros stored minus one; the
                                  // default) or "gptq_v2"; AWQ: ""
  std::string awq_version;  // AWQ: "version" lower-cased ("gemm" default, "gemv", ...)
  bool zero_point = false;  // the checkpoint stores zero points (qzeros): always for
                            // GPTQ, the "zero_point" field (default true) for AWQ
  std::string source;       // "config.json:quantization_config", "quantize_config.json",
                            // "quant_config.json", or "" for none
  nlohmann::json raw;       // the config object it was read from (null for none)
};

// Parses one quantization config object (as found in any of the three places
// above); `source` names it in error messages and in the result. Field names:
// quant_method (lower-cased; when absent: "awq" if AutoAWQ's w_bit, q_group_size
// or zero_point appear, else "gptq" if bits does, as old AutoGPTQ files omit it),
// bits or w_bit, group_size or q_group_size, sym, desc_act, checkpoint_format or
// format (GPTQ), zero_point and version (AWQ).
// Throws Error(unsupported) for a quant_method other than gptq/awq (naming it),
// or for GPTQ checkpoint formats other than gptq/gptq_v2 (e.g. marlin);
// Error(format) for missing or mistyped fields.
QuantizationInfo parse_quantization_config(const nlohmann::json& config, std::string_view source);

// Looks, in order, at dir/config.json's "quantization_config",
// dir/quantize_config.json and dir/quant_config.json; the first found wins
// (when config.json has no checkpoint_format, quantize_config.json's is used;
// if both give bits or group_size and they differ, Error(format)). None of
// them: method none.
QuantizationInfo detect_quantization(const std::filesystem::path& dir);

// Where a tensor of a Checkpoint lives.
struct CheckpointTensor {
  const SafetensorsFile* file = nullptr;
  const SafetensorsTensor* info = nullptr;
};

// A Hugging Face checkpoint: a folder with config.json (optional) and one or
// more .safetensors shards, or a single .safetensors file (no config; method
// none). In a folder, model.safetensors.index.json's weight_map decides the
// shards when present (every shard it names must exist and hold the tensors it
// lists); otherwise every *.safetensors file in the folder is a shard.
// A tensor name found in two shards is Error(format). Move-only; pointers and
// views it hands out stay valid while it (or the object it moved into) lives.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const std::optional<HfConfig>& config() const { return config_; }
  const QuantizationInfo& quantization() const { return quantization_; }

  size_t size() const { return index_.size(); }
  // nullptr when no shard holds `name`.
  const CheckpointTensor* find(std::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> tensor_names() const;
  // As SafetensorsFile::view/bytes; a missing name is Error(format) naming the
  // checkpoint and a few names it does have.
  TensorView view(std::string_view name) const;
  std::span<const std::byte> bytes(std::string_view name) const;

 private:
  Checkpoint() = default;
  const CheckpointTensor& get(std::string_view name) const;

  std::filesystem::path path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, CheckpointTensor, std::less<>> index_;
  std::optional<HfConfig> config_;
  QuantizationInfo quantization_;
};

}  // namespace lowbit::io
