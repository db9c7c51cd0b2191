// Quantized linear layers inside Hugging Face checkpoints: which weights get
// quantized, how GPTQ/AWQ tensors are named and read back, what goes into
// config.json, and the two whole-checkpoint jobs behind `lowbit quantize` and
// `lowbit dequantize`. The CLI is a thin shell over this file; the model
// engine reads quantized layers through read_packed_linear().
//
// Checkpoint facts this code relies on:
//  - A linear layer `P` of an fp16/bf16/fp32 checkpoint is the tensor
//    `P.weight` of shape [out_features N, in_features K] (torch.nn.Linear),
//    with an optional `P.bias` [N].
//  - A quantized layer replaces `P.weight` with `P.qweight`, `P.qzeros`,
//    `P.scales` (and, for GPTQ, `P.g_idx`); `P.bias` stays fp16. Shapes:
//      GPTQ ("gptq" v1 zeros stored minus one, "gptq_v2" plain): qweight
//        i32 [K/8, N], qzeros i32 [G, N/8], scales f16 [G, N], g_idx i32 [K];
//      AWQ (AutoAWQ "gemm"): qweight i32 [K, N/8], qzeros i32 [G, N/8],
//        scales f16 [G, N];   G = K / group_size (1 for per channel).
//  - The quantization parameters live in config.json "quantization_config"
//    (transformers) and, for GPTQ, also in quantize_config.json (AutoGPTQ).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lowbit/core/dtype.h"
#include "lowbit/formats/layout_registry.h"
#include "lowbit/io/hf_config.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::checkpoint {

enum class QuantFormat : uint8_t {
  gptq,     // AutoGPTQ layout, zeros stored minus one (checkpoint_format "gptq")
  gptq_v2,  // GPTQModel's v2: zeros stored as they are
  awq,      // AutoAWQ GEMM layout
};
const char* quant_format_name(QuantFormat format);  // "gptq", "gptq_v2", "awq"
std::optional<QuantFormat> parse_quant_format(std::string_view name);
// The formats registry layout that stores this format ("gptq", "gptq_v2", "awq").
const char* layout_name(QuantFormat format);

struct QuantizeOptions {
  QuantFormat format = QuantFormat::gptq;
  int bits = 4;          // only 4 is supported
  int group_size = 128;  // 32, 64, 128, 256, or -1 (per channel)
  bool sym = false;      // symmetric (z = 8) instead of min-max asymmetric
  bool overwrite = false;  // replace an existing, non-empty output folder
};

// True for the weights `lowbit quantize` quantizes: 2-D tensors named
// `*.weight` inside the transformer blocks (a `.layers.` or `.h.` or
// `.blocks.` path component), except embeddings and norms. lm_head and the
// embeddings stay in full precision, as AutoGPTQ and AutoAWQ leave them.
bool is_quantizable_linear(std::string_view name, const std::vector<int64_t>& shape);

// The prefixes P that have a `P.qweight` tensor, sorted.
std::vector<std::string> find_quantized_linears(const io::Checkpoint& checkpoint);

// Reads layer `prefix` of a quantized checkpoint into a PackedLinear of the
// layout its quantization config names, with K, N and group size derived from
// the tensor shapes and cross-checked against the config. Throws Error(format)
// naming the tensor on missing tensors or inconsistent shapes, and
// Error(unsupported) for bits other than 4 or an AWQ version other than gemm.
formats::PackedLinear read_packed_linear(const io::Checkpoint& checkpoint, const std::string& prefix,
                                         const io::QuantizationInfo& quantization);

// Adds `P.qweight`, `P.qzeros`, `P.scales` (and `P.g_idx`) to a writer (copies).
void add_packed_linear(io::SafetensorsWriter& writer, const std::string& prefix,
                       const formats::PackedLinear& packed);

// The "quantization_config" object for config.json.
nlohmann::json make_quantization_config(const QuantizeOptions& options);

// Called after each unit of work: (done, total, what was just done).
using ProgressFn = std::function<void(int64_t done, int64_t total, const std::string& item)>;

struct QuantizeSummary {
  int64_t quantized_layers = 0;
  int64_t copied_tensors = 0;
  std::vector<std::string> copied_files;  // other files of the input folder (tokenizer, ...)
  uint64_t input_tensor_bytes = 0;
  uint64_t output_tensor_bytes = 0;
  std::filesystem::path output_file;
};

// RTN-quantizes every linear weight of the checkpoint folder `input` and writes
// a checkpoint folder `output` (model.safetensors, config.json with
// quantization_config, quantize_config.json for GPTQ, and the input's other
// files). The output is built in a temporary folder beside `output` and moved
// into place only when complete; an existing non-empty `output` is an error
// unless options.overwrite. Throws Error naming the layer when one cannot be
// quantized (e.g. in_features not a multiple of the group size).
QuantizeSummary quantize_checkpoint(const std::filesystem::path& input,
                                    const std::filesystem::path& output,
                                    const QuantizeOptions& options, const ProgressFn& progress = {});

struct LayerError {
  std::string name;        // P.weight
  double relative_l2 = 0;  // ||W - W'|| / ||W||
  double max_abs = 0;      // max |W - W'|
  double max_in_scales = 0;  // max |W - W'| / s over elements (RTN promises <= 0.5 + slack)
};

struct DequantizeSummary {
  int64_t dequantized_layers = 0;
  int64_t copied_tensors = 0;
  std::vector<LayerError> errors;  // one per layer when a reference was given
};

// Writes every tensor of the quantized checkpoint `input` (folder, or file with
// config.json beside it) to one safetensors file, the quantized layers as
// `P.weight` [N, K] in `dtype` (f16, bf16 or f32). With `reference` (the
// original full-precision checkpoint) it also measures each layer's error.
DequantizeSummary dequantize_checkpoint(const std::filesystem::path& input,
                                        const std::filesystem::path& output_file, DType dtype,
                                        const std::optional<std::filesystem::path>& reference,
                                        const ProgressFn& progress = {});

}  // namespace lowbit::checkpoint
