// Loading: GPTQ/AWQ checkpoints written by `lowbit quantize` (through the
// checkpoint module), config parsing, and clear errors on bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine_test_util.h"
#include "error_matchers.h"
#include "lowbit/checkpoint/quantized_checkpoint.h"
#include "lowbit/core/error.h"
#include "lowbit/cuda/device.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/kv_store.h"
#include "lowbit/engine/model_config.h"
#include "lowbit/engine/weights.h"
#include "lowbit/io/safetensors.h"
#include "tolerances.h"

namespace lowbit::test {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("lowbit_engine_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

std::vector<int32_t> golden_tokens(const std::string& model) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(golden_dir(model) / "golden.safetensors");
  const TensorView t = f.view("tokens");
  return std::vector<int32_t>(t.as<const int32_t>(), t.as<const int32_t>() + t.numel());
}

std::vector<float> logits_of(const engine::Model& model, const std::vector<int32_t>& tokens) {
  engine::CpuBackendOptions o;
  o.kv.k = o.kv.v = engine::KvStorage::fp32;
  o.kv.max_tokens = 64;
  auto b = engine::make_cpu_backend(model, o);
  return run_positions(*b, tokens, tokens.size() - 2);
}

class QuantizedCheckpoints : public ::testing::TestWithParam<checkpoint::QuantFormat> {};

// `lowbit quantize` output (RTN, group 32) loads into w4 matrices; the w4
// kernel path gives the same logits as (a) the same checkpoint loaded
// dequantized (--weights fp16: exact dense f32 of the same 4-bit weights), so
// GPTQ/AWQ unpacking and the w4 path agree, and (b) the original checkpoint
// quantized on load (--weights w4, group 32), which runs the same RTN.
TEST_P(QuantizedCheckpoints, W4PathEqualsDequantizedPathAndRtnOnLoad) {
  for (const std::string name : {"llama", "qwen3"}) {
    const fs::path out = temp_dir(std::string(checkpoint::quant_format_name(GetParam())) + "_" + name);
    checkpoint::QuantizeOptions q;
    q.format = GetParam();
    q.group_size = 32;
    checkpoint::quantize_checkpoint(golden_dir(name), out, q);
    const engine::Model w4 = engine::load_model(out);
    EXPECT_EQ(w4.source_format, GetParam() == checkpoint::QuantFormat::awq ? "awq" : "gptq");
    EXPECT_EQ(w4.weights.layers[0].wq.format, engine::MatrixFormat::w4);
    EXPECT_EQ(w4.weights.layers[1].w_down.group_size, 32);
    engine::LoadOptions dense;
    dense.weights = engine::WeightMode::dense;
    const engine::Model deq = engine::load_model(out, dense);
    EXPECT_EQ(deq.weights.layers[0].wq.format, engine::MatrixFormat::f32);
    engine::LoadOptions rtn;
    rtn.weights = engine::WeightMode::w4;
    rtn.w4_group_size = 32;
    engine::Model on_load = engine::load_model(golden_dir(name), rtn);
    // `lowbit quantize` leaves lm_head unquantized, as GPTQ/AWQ tools do.
    if (on_load.weights.lm_head) on_load.weights.lm_head = w4.weights.lm_head;
    const engine::Model original = engine::load_model(golden_dir(name));
    const std::vector<int32_t> tokens = golden_tokens(name);
    const std::vector<float> a = logits_of(w4, tokens);
    EXPECT_LE(max_relative_error(a, logits_of(deq, tokens)), kEngineLogitsMaxRelError) << name;
    EXPECT_LE(max_relative_error(a, logits_of(on_load, tokens)), kEngineLogitsMaxRelError) << name;
    // Not vacuous: 4-bit weights do move these tiny random models' logits.
    EXPECT_GT(max_relative_error(a, logits_of(original, tokens)), 100 * kEngineLogitsMaxRelError) << name;
    fs::remove_all(out);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedCheckpoints,
                         ::testing::Values(checkpoint::QuantFormat::gptq, checkpoint::QuantFormat::gptq_v2,
                                           checkpoint::QuantFormat::awq),
                         [](const auto& param_info) { return std::string(checkpoint::quant_format_name(param_info.param)); });

io::HfConfig hf(const std::string& json_text) { return io::parse_hf_config(nlohmann::json::parse(json_text)); }

const char* kBase =
    R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256 %s})";

std::string with(const std::string& extra) {
  std::string s = kBase;
  s.replace(s.find("%s"), 2, extra);
  return s;
}

TEST(ModelConfig, ReadsLlamaAndRejectsWhatItCannotRun) {
  const engine::ModelConfig c = engine::config_from_hf(hf(with("")));
  EXPECT_EQ(c.arch, engine::Architecture::llama);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.rope_scaling.llama3);
  EXPECT_TRUE(throws_error([&] { (void)engine::config_from_hf(hf(R"({"model_type": "gpt2", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256})")); }, ErrorKind::unsupported, "gpt2"));
  EXPECT_TRUE(throws_error([&] { (void)engine::config_from_hf(hf(with(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})"))); }, ErrorKind::unsupported, "yarn"));
  EXPECT_TRUE(throws_error([&] { (void)engine::config_from_hf(hf(with(R"(, "sliding_window": 4096)"))); }, ErrorKind::unsupported, "sliding"));
  EXPECT_TRUE(throws_error([&] { (void)engine::config_from_hf(hf(with(R"(, "mlp_bias": true)"))); }, ErrorKind::unsupported, "mlp_bias"));
}

TEST(ModelConfig, Llama3ScalingKeepsHighFrequenciesAndDividesLowOnes) {
  engine::ModelConfig c = engine::config_from_hf(hf(with(
      R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})")));
  const std::vector<float> scaled = engine::rope_inv_freq(c);
  c.rope_scaling = {};
  const std::vector<float> plain = engine::rope_inv_freq(c);
  EXPECT_EQ(scaled.front(), plain.front());  // wavelength 2 pi < 64 / 4: untouched
  EXPECT_FLOAT_EQ(scaled.back(), plain.back() / 8.0f);  // wavelength > 64: divided by factor
}

TEST(Loading, MissingTensorsAndFilesGiveClearErrors) {
  const fs::path dir = temp_dir("broken");
  fs::create_directories(dir);
  fs::copy_file(golden_dir("llama") / "config.json", dir / "config.json");
  {
    // A checkpoint with only the embedding.
    const io::SafetensorsFile f = io::SafetensorsFile::open(golden_dir("llama") / "model.safetensors");
    io::SafetensorsWriter w;
    const auto bytes = f.bytes("model.embed_tokens.weight");
    w.add("model.embed_tokens.weight", DType::f32, {256, 64}, bytes);
    w.write(dir / "model.safetensors");
  }
  EXPECT_TRUE(throws_error([&] { (void)engine::load_model(dir); }, ErrorKind::format, "model.layers.0.input_layernorm.weight"));
  fs::remove_all(dir);
  EXPECT_THROW(engine::load_model(dir), Error);
  EXPECT_THROW(engine::load_model(dir / "missing.gguf"), Error);
}

TEST(Backend, RejectsBadTokensSequencesAndOverflow) {
  const engine::Model model = engine::load_model(golden_dir("llama"));
  engine::CpuBackendOptions o;
  o.kv.max_tokens = 4;
  auto b = engine::make_cpu_backend(model, o);
  const int seq = b->add_sequence();
  std::vector<float> logits;
  const std::vector<int32_t> bad = {1, 256};
  engine::StepInput in{seq, bad};
  EXPECT_TRUE(throws_error([&] { (void)b->forward(std::span<const engine::StepInput>(&in, 1), engine::LogitsWanted::last, logits); }, ErrorKind::invalid_argument, "256"));
  const std::vector<int32_t> ok = {1, 2, 3};
  in = {seq + 7, ok};
  EXPECT_THROW(b->forward(std::span<const engine::StepInput>(&in, 1), engine::LogitsWanted::last, logits), Error);
  in = {seq, ok};
  b->forward(std::span<const engine::StepInput>(&in, 1), engine::LogitsWanted::last, logits);
  EXPECT_EQ(logits.size(), 256u);
  EXPECT_TRUE(throws_error([&] { (void)b->forward(std::span<const engine::StepInput>(&in, 1), engine::LogitsWanted::last, logits); }, ErrorKind::invalid_argument, "max_tokens"));
  // Without a GPU (or in a build without CUDA) "cuda" is refused; on a GPU this
  // model's head_dim is one the CUDA kernels do not cover: refused as well.
  EXPECT_TRUE(throws_error([&] { (void)engine::make_backend("cuda", model, o); }, ErrorKind::unsupported, "CUDA"));
  // "auto" runs it on the CPU either way, and says why when a GPU was there
  // and refused it (the head_dim); with no GPU there is nothing to explain.
  std::string why_cpu = "left from before";
  EXPECT_EQ(engine::make_backend("auto", model, o, &why_cpu)->name().rfind("cpu", 0), 0u);
  if (cuda_device_count() == 0)
    EXPECT_EQ(why_cpu, "");
  else
    EXPECT_NE(why_cpu.find("head_dim"), std::string::npos) << why_cpu;
  o.kv.k = engine::KvStorage::fp32;
  o.kv.v = engine::KvStorage::tq4;
  EXPECT_THROW(engine::make_cpu_backend(model, o), Error);
}

}  // namespace
}  // namespace lowbit::test

namespace lowbit::test {
namespace {

// The golden Llama re-saved in f16 and in bf16: f16 tensors stay f16 (the
// AVX2 F16C kernels run them), bf16 ones widen to f32 exactly; both give
// transformers' logits up to the rounding of the weights themselves.
TEST(Loading, F16AndBf16CheckpointsLoadAndRun) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(golden_dir("llama") / "model.safetensors");
  const io::SafetensorsFile g = io::SafetensorsFile::open(golden_dir("llama") / "golden.safetensors");
  const TensorView gl = g.view("logits");
  const std::vector<float> golden(gl.as<const float>(), gl.as<const float>() + gl.numel());
  for (const DType dtype : {DType::f16, DType::bf16}) {
    const fs::path dir = temp_dir(std::string("half_") + dtype_name(dtype));
    fs::create_directories(dir);
    fs::copy_file(golden_dir("llama") / "config.json", dir / "config.json");
    io::SafetensorsWriter w;
    for (const io::SafetensorsTensor& t : f.tensors()) {
      const TensorView v = f.view(t);
      std::vector<uint16_t> half(static_cast<size_t>(v.numel()));
      for (size_t i = 0; i < half.size(); ++i)
        half[i] = dtype == DType::f16 ? float_to_f16(v.as<const float>()[i]).bits : float_to_bf16(v.as<const float>()[i]).bits;
      w.add_copy(t.name, dtype, t.shape,
                 std::span<const std::byte>(reinterpret_cast<const std::byte*>(half.data()), half.size() * 2));
    }
    w.write(dir / "model.safetensors");
    const engine::Model m = engine::load_model(dir);
    EXPECT_EQ(m.weights.layers[0].wq.format, dtype == DType::f16 ? engine::MatrixFormat::f16 : engine::MatrixFormat::f32);
    const std::vector<float> logits = logits_of(m, golden_tokens("llama"));
    // Weights rounded to 11 (f16) or 8 (bf16) significant bits move these
    // logits by ~1e-3 / ~1e-2 of their scale; a wrong conversion moves them by O(1).
    const double err = max_relative_error(logits, golden);
    EXPECT_LT(err, dtype == DType::f16 ? 5e-3 : 5e-2) << dtype_name(dtype);
    EXPECT_GT(err, 0.0);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace lowbit::test
