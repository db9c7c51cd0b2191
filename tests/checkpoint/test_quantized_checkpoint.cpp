// Quantized layers in checkpoints: which weights are quantized, reading GPTQ
// and AWQ layers back (shapes cross-checked against the config), and the
// errors for checkpoints that do not add up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "error_matchers.h"
#include "lowbit/checkpoint/quantized_checkpoint.h"
#include "lowbit/core/error.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/formats/rtn.h"

namespace fs = std::filesystem;
using namespace lowbit;

namespace {

// The model fields every config.json has; tests append "quantization_config".
constexpr const char* kModelFields =
    R"("model_type": "llama", "hidden_size": 256, "intermediate_size": 64, "num_hidden_layers": 1,
       "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 32)";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lowbit-ckpt-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a quantized checkpoint holding one layer `L` packed in `layout`.
  void write_quantized(const formats::QuantizedLinear& layer, const std::string& layout,
                       const std::string& qconfig) {
    io::SafetensorsWriter writer;
    checkpoint::add_packed_linear(writer, "model.layers.0.mlp.up_proj", formats::pack(layer, layout));
    writer.write(dir_ / "model.safetensors");
    std::ofstream(dir_ / "config.json")
        << "{" << kModelFields << R"(, "quantization_config": )" << qconfig << "}";
  }

  static formats::QuantizedLinear random_layer(int64_t K, int64_t N, int group_size) {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(K * N));
    for (float& v : w) v = normal(rng);
    formats::RtnOptions options;
    options.group_size = group_size;
    options.min_zero = 1;
    return formats::quantize_rtn(TensorView::contiguous(w.data(), DType::f32, {K, N}),
                                 formats::WeightOrientation::in_out, options);
  }

  fs::path dir_;
};

TEST(QuantizableLinear, PicksBlockLinearWeightsOnly) {
  using checkpoint::is_quantizable_linear;
  EXPECT_TRUE(is_quantizable_linear("model.layers.3.self_attn.q_proj.weight", {4096, 4096}));
  EXPECT_TRUE(is_quantizable_linear("model.layers.0.mlp.down_proj.weight", {4096, 11008}));
  EXPECT_TRUE(is_quantizable_linear("transformer.h.0.mlp.c_fc.weight", {3072, 768}));
  EXPECT_FALSE(is_quantizable_linear("model.layers.0.mlp.down_proj.bias", {4096}));
  EXPECT_FALSE(is_quantizable_linear("model.layers.0.input_layernorm.weight", {4096}));
  EXPECT_FALSE(is_quantizable_linear("model.layers.0.self_attn.q_norm.weight", {128, 1}));
  EXPECT_FALSE(is_quantizable_linear("model.embed_tokens.weight", {32000, 4096}));
  EXPECT_FALSE(is_quantizable_linear("lm_head.weight", {32000, 4096}));
}

TEST(QuantFormat, NamesRoundTrip) {
  for (auto f :
       {checkpoint::QuantFormat::gptq, checkpoint::QuantFormat::gptq_v2, checkpoint::QuantFormat::awq})
    EXPECT_EQ(checkpoint::parse_quant_format(checkpoint::quant_format_name(f)), f);
  EXPECT_FALSE(checkpoint::parse_quant_format("marlin").has_value());
}

TEST_F(CheckpointTest, ReadsGptqAndAwqLayersBackExactly) {
  const formats::QuantizedLinear layer = random_layer(256, 64, 64);
  struct Case {
    const char* layout;
    const char* config;
  };
  for (const Case& c :
       {Case{"gptq", R"({"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": false})"},
        Case{"gptq_v2", R"({"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": false,
                                            "checkpoint_format": "gptq_v2"})"},
        Case{"awq", R"({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": true,
                                        "version": "gemm"})"}}) {
    SCOPED_TRACE(c.layout);
    write_quantized(layer, c.layout, c.config);
    const io::Checkpoint ck = io::Checkpoint::open(dir_);
    ASSERT_EQ(checkpoint::find_quantized_linears(ck), std::vector<std::string>{"model.layers.0.mlp.up_proj"});
    const formats::PackedLinear packed =
        checkpoint::read_packed_linear(ck, "model.layers.0.mlp.up_proj", ck.quantization());
    EXPECT_EQ(packed.layout, c.layout);
    EXPECT_EQ(packed.K, 256);
    EXPECT_EQ(packed.N, 64);
    EXPECT_EQ(packed.group_size, 64);
    EXPECT_EQ(formats::unpack(packed), layer);
  }
}

TEST_F(CheckpointTest, GroupSizeThatContradictsTheShapesIsAnError) {
  write_quantized(random_layer(256, 64, 64), "gptq",
                  R"({"quant_method": "gptq", "bits": 4, "group_size": 128})");
  const io::Checkpoint ck = io::Checkpoint::open(dir_);
  EXPECT_TRUE(test::throws_error(
      [&] { checkpoint::read_packed_linear(ck, "model.layers.0.mlp.up_proj", ck.quantization()); },
      ErrorKind::format, {"group_size = 128", "up_proj"}));
}

TEST_F(CheckpointTest, UnsupportedBitsAndAwqVersionsAreNamed) {
  write_quantized(random_layer(256, 64, 64), "gptq",
                  R"({"quant_method": "gptq", "bits": 8, "group_size": 64})");
  {
    const io::Checkpoint ck = io::Checkpoint::open(dir_);
    EXPECT_TRUE(test::throws_error(
        [&] { checkpoint::read_packed_linear(ck, "model.layers.0.mlp.up_proj", ck.quantization()); },
        ErrorKind::unsupported, {"8-bit"}));
  }
  write_quantized(random_layer(256, 64, 64), "awq",
                  R"({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemv"})");
  const io::Checkpoint ck = io::Checkpoint::open(dir_);
  EXPECT_TRUE(test::throws_error(
      [&] { checkpoint::read_packed_linear(ck, "model.layers.0.mlp.up_proj", ck.quantization()); },
      ErrorKind::unsupported, {"gemv"}));
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
  const formats::PackedLinear packed = formats::pack(random_layer(256, 64, 64), "gptq");
  io::SafetensorsWriter writer;
  for (const char* name : {"qweight", "scales"}) {
    const auto& t = packed.tensor(name);
    writer.add_copy(std::string("blk.layers.0.fc.") + name, t.dtype, t.shape, t.bytes);
  }
  writer.write(dir_ / "model.safetensors");
  std::ofstream(dir_ / "config.json")
      << "{" << kModelFields
      << R"(, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64}})";
  const io::Checkpoint ck = io::Checkpoint::open(dir_);
  EXPECT_TRUE(
      test::throws_error([&] { checkpoint::read_packed_linear(ck, "blk.layers.0.fc", ck.quantization()); },
                         ErrorKind::format, {"blk.layers.0.fc.qzeros"}));
}

TEST_F(CheckpointTest, QuantizingAQuantizedCheckpointIsRefused) {
  write_quantized(random_layer(256, 64, 64), "gptq",
                  R"({"quant_method": "gptq", "bits": 4, "group_size": 64})");
  EXPECT_TRUE(test::throws_error([&] { checkpoint::quantize_checkpoint(dir_, dir_.string() + "-out", {}); },
                                 ErrorKind::invalid_argument, {"already quantized"}));
  EXPECT_FALSE(fs::exists(dir_.string() + "-out"));
}

}  // namespace
