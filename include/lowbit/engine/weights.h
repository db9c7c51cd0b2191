// The weight set of a model, device-agnostic: plain host arrays in a few
// formats that every backend can read or repack (the CPU kernels read them as
// they are; a CUDA backend uploads / repacks them into its own tiled layout).
//
// A WeightMatrix is W [rows][cols] in torch.nn.Linear orientation: a linear
// layer computes y = x W^T (rows = out_features N, cols = in_features K); an
// embedding table is [vocab][hidden] (row = token). Formats:
//   f32, f16 : dense, row-major.
//   w4       : 4-bit codes with a float scale and min per group of
//              `group_size` consecutive columns of a row: w = s*q + m
//              (formats/quantized_linear.h's float_min convention; integer
//              zero points convert exactly with m = -(s*z)). codes: cols/2
//              bytes per row, in blocks of 32 columns of 16 bytes; column j of
//              a block is the LOW nibble of byte j for j < 16 and the HIGH
//              nibble of byte j - 16 for j >= 16 (GGUF Q4_1's order, so a Q4_1
//              tensor loads by copying its bytes). scales, mins: f32
//              [rows][cols/group_size]. group_size is a multiple of 32.
//   q8       : int8 codes [rows][cols] with an f32 scale per 32 columns:
//              w = s*q (GGUF Q8_0, loaded exactly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/half.h"
#include "lowbit/core/tensor.h"
#include "lowbit/engine/model_config.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::engine {

enum class MatrixFormat : uint8_t { f32, f16, w4, q8 };
const char* matrix_format_name(MatrixFormat f);  // "f32", "f16", "w4", "q8"

inline constexpr int kW4BlockCols = 32;  // columns per 16-byte code block
inline constexpr int kQ8BlockCols = 32;  // columns per q8 scale

struct WeightMatrix {
  MatrixFormat format = MatrixFormat::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  int group_size = 0;  // w4: columns per scale/min (multiple of 32); q8: 32; dense: 0
  std::vector<float> f32;       // f32: [rows][cols]
  std::vector<f16> f16v;        // f16: [rows][cols]
  std::vector<uint8_t> codes;   // w4: [rows][cols/2]; q8: [rows][cols] (int8 bit patterns)
  std::vector<float> scales;    // w4: [rows][groups]; q8: [rows][cols/32]
  std::vector<float> mins;      // w4: [rows][groups]

  int64_t groups_per_row() const { return group_size > 0 ? cols / group_size : 0; }
  // Bytes of the arrays a matrix-vector product streams.
  size_t nbytes() const;
  // Row r as fp32 (exact for every format). out: cols floats.
  void dequant_row(int64_t r, float* out) const;
  // Throws Error(internal) when array sizes do not match the shape.
  void check() const;
  std::string describe() const;  // "w4 [576 x 1536] g32"

  // Dense from a 2-D f32/f16/bf16 CPU view [rows][cols] (any strides). f32
  // and bf16 sources are stored f32 (exact), f16 sources as f16 unless
  // `widen` (then f32).
  static WeightMatrix from_dense(const TensorView& w, bool widen = false);
  static WeightMatrix from_floats(int64_t rows, int64_t cols, std::vector<float> values);
  // From the canonical 4-bit layer (y = x W, codes [K, N]): transposes into
  // [N][K] rows. Needs K % 32 == 0, group_size a multiple of 32 (or -1: one
  // group per row) and a trivial g_idx; act-order layers: Error(unsupported)
  // (the loader dequantizes those instead).
  static WeightMatrix from_quantized(const formats::QuantizedLinear& layer);
  // RTN 4-bit on load (formats/rtn.h, integer zero points, AutoGPTQ's
  // min-max), group size `group_size` (128 by default), or the largest of
  // 128/64/32 that divides cols when it does not. Dense input only.
  static WeightMatrix quantize_w4(const TensorView& w, int group_size = 128);
  // The layer back in canonical form (w4 only; float_min zero points).
  formats::QuantizedLinear to_quantized() const;
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]
  std::vector<float> q_norm, k_norm;       // [head_dim], Qwen3 only
  std::vector<float> q_bias, k_bias, v_bias;  // when attention_bias
  WeightMatrix wq, wk, wv, wo;             // [q_dim][hidden], [kv_dim][hidden] x2, [hidden][q_dim]
  WeightMatrix w_gate, w_up, w_down;       // [ffn][hidden] x2, [hidden][ffn]
};

struct ModelWeights {
  WeightMatrix embed;                  // [vocab][hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;       // [hidden]
  std::optional<WeightMatrix> lm_head; // [vocab][hidden]; empty: tied to embed

  const WeightMatrix& output() const { return lm_head ? *lm_head : embed; }
  // Bytes of every array (the embedding counted once when tied).
  size_t nbytes() const;
  // Bytes one decode token streams: every linear + the output matrix + norms
  // (the embedding lookup reads one row: not counted).
  size_t bytes_per_token() const;
  // Checks every shape against the config; Error(format) naming the tensor.
  void check(const ModelConfig& config) const;
  // "w4 g32: 210 matrices, q8: 1, ..." count of matrices per format.
  std::string format_summary() const;
};

// What --weights asks for.
enum class WeightMode : uint8_t {
  as_stored,  // "auto": quantized layers stay quantized, dense layers dense
  dense,      // "fp16": every linear unquantized (dequantized layers stored f32)
  w4,         // "w4": dense linears RTN-quantized to 4 bits on load
};
const char* weight_mode_name(WeightMode m);  // "auto", "fp16", "w4"
std::optional<WeightMode> parse_weight_mode(std::string_view name);

// Called during loading: (done, total, what).
using LoadProgress = std::function<void(int64_t done, int64_t total, const std::string& item)>;

struct LoadOptions {
  WeightMode weights = WeightMode::as_stored;
  int w4_group_size = 128;
  LoadProgress progress;
};

struct Model {
  ModelConfig config;
  ModelWeights weights;
  std::filesystem::path source;
  std::string source_format;  // "safetensors", "gptq", "awq", "gguf"
};

// A Hugging Face folder (config.json + safetensors, plain or GPTQ/AWQ
// quantized, e.g. written by `lowbit quantize`) or a .gguf file (by
// extension). Throws Error naming the file/tensor on problems.
Model load_model(const std::filesystem::path& path, const LoadOptions& options = {});
Model load_hf_model(const std::filesystem::path& path, const LoadOptions& options = {});
Model load_gguf_model(const std::filesystem::path& path, const LoadOptions& options = {});

// A model with random weights (normal, std `scale`, norms 1 + small noise),
// dense f32 or RTN w4 linears; for tests and benchmarks.
Model make_random_model(const ModelConfig& config, uint64_t seed, WeightMode weights = WeightMode::dense,
                        float scale = 0.02f);

}  // namespace lowbit::engine
