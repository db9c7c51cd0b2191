#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "error_matchers.h"
#include "io/io_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/io/hf_config.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::io {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::write_file;

using lowbit::test::expect_error;

void write_json(const std::filesystem::path& p, const json& j) { write_file(p, j.dump(2)); }

json llama_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "float16",
    "tie_word_embeddings": false,
    "rope_scaling": null
  })");
}

// ---- read_json_file ---------------------------------------------------------------------

TEST(ReadJsonFile, ParsesAndReportsPosition) {
  TempDir dir;
  write_file(dir / "ok.json", R"({"a": [1, 2]})");
  EXPECT_EQ(read_json_file(dir / "ok.json")["a"][1], 2);
  write_file(dir / "bad.json", "{\n  \"a\": 1,\n  \"b\": tru\n}\n");
  expect_error([&] { (void)read_json_file(dir / "bad.json"); }, ErrorKind::format,
               {"bad.json", "line 3", "not valid JSON"});
  expect_error([&] { (void)read_json_file(dir / "absent.json"); }, ErrorKind::io,
               {"absent.json"});
  expect_error([&] { (void)read_json_file(dir.path()); }, ErrorKind::io, {"directory"});
}

// ---- config.json ----------------------------------------------------------------------------

TEST(HfConfig, ParsesLlamaFields) {
  const HfConfig c = parse_hf_config(llama_config());
  EXPECT_EQ(c.model_type, "llama");
  ASSERT_EQ(c.architectures.size(), 1u);
  EXPECT_EQ(c.architectures[0], "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.head_dim, 128);  // derived
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.torch_dtype, "float16");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.raw["rope_scaling"], nullptr);
}

TEST(HfConfig, DefaultsForOptionalFields) {
  json j = {{"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"vocab_size", 100}, {"num_key_value_heads", nullptr}};
  const HfConfig c = parse_hf_config(j);
  EXPECT_EQ(c.model_type, "");
  EXPECT_TRUE(c.architectures.empty());
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.torch_dtype, "");
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HfConfig, ExplicitHeadDimNewFieldNamesAndTiedEmbeddings) {
  json j = llama_config();
  j["head_dim"] = 256;  // Gemma-style: head_dim != hidden_size / heads
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
  j["tie_word_embeddings"] = true;
  j["hidden_size"] = 4096.0;  // integral floats are accepted
  const HfConfig c = parse_hf_config(j);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(HfConfig, ErrorsNameTheField) {
  auto with = [](const char* key, json value) {
    json j = llama_config();
    j[key] = std::move(value);
    return j;
  };
  expect_error([&] { parse_hf_config(with("hidden_size", "4096")); }, ErrorKind::format,
               {"'hidden_size'", "\"4096\"", "expected an integer"});
  expect_error([&] { parse_hf_config(with("num_hidden_layers", 2.5)); }, ErrorKind::format,
               {"'num_hidden_layers'", "2.5"});
  expect_error([&] { parse_hf_config(with("vocab_size", -3)); }, ErrorKind::format,
               {"'vocab_size'", "-3", "positive"});
  expect_error([&] { parse_hf_config(with("rms_norm_eps", "1e-5")); }, ErrorKind::format,
               {"'rms_norm_eps'", "expected a number"});
  expect_error([&] { parse_hf_config(with("tie_word_embeddings", 1)); }, ErrorKind::format,
               {"'tie_word_embeddings'", "true or false"});
  expect_error([&] { parse_hf_config(with("model_type", 3)); }, ErrorKind::format,
               {"'model_type'", "expected a string"});
  expect_error([&] { parse_hf_config(with("architectures", "Llama")); }, ErrorKind::format,
               {"'architectures'", "array"});
  expect_error([&] { parse_hf_config(with("architectures", json::array({1}))); },
               ErrorKind::format, {"'architectures[0]'"});
  expect_error([&] { parse_hf_config(with("num_key_value_heads", 5)); }, ErrorKind::format,
               {"num_attention_heads = 32", "num_key_value_heads = 5"});
  json j = llama_config();
  j.erase("vocab_size");
  expect_error([&] { parse_hf_config(j); }, ErrorKind::format,
               {"missing required field 'vocab_size'"});
  j = llama_config();
  j["num_attention_heads"] = 24;
  j["num_key_value_heads"] = 8;
  j["hidden_size"] = 4000;  // not a multiple of 24
  expect_error([&] { parse_hf_config(j); }, ErrorKind::format, {"head_dim", "4000", "24"});
  expect_error([&] { parse_hf_config(json::array()); }, ErrorKind::format, {"expected an object"});
}

TEST(HfConfig, LoadNamesTheFile) {
  TempDir dir;
  json j = llama_config();
  j["hidden_size"] = "big";
  write_json(dir / "config.json", j);
  expect_error([&] { (void)load_hf_config(dir.path()); }, ErrorKind::format,
               {"config.json", "'hidden_size'"});
  write_json(dir / "config.json", llama_config());
  EXPECT_EQ(load_hf_config(dir.path()).num_key_value_heads, 8);
}

// ---- quantization detection -------------------------------------------------------------

class Quantization : public ::testing::Test {
 protected:
  void config_with(const json& quantization_config) {
    json j = llama_config();
    j["quantization_config"] = quantization_config;
    write_json(dir_ / "config.json", j);
  }
  TempDir dir_;
};

TEST_F(Quantization, NoneWithoutConfigs) {
  write_json(dir_ / "config.json", llama_config());
  const auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.method, QuantMethod::none);
  EXPECT_EQ(q.source, "");
  EXPECT_TRUE(q.raw.is_null());
  TempDir empty;
  EXPECT_EQ(detect_quantization(empty.path()).method, QuantMethod::none);
  expect_error([&] { (void)detect_quantization(dir_ / "nope"); }, ErrorKind::io, {"not a folder"});
}

TEST_F(Quantization, GptqInConfigJsonV1) {
  // As transformers' GPTQConfig writes it (no checkpoint_format: v1).
  config_with({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"desc_act", true},
               {"sym", false}, {"damp_percent", 0.01}, {"true_sequential", true}});
  const auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.method, QuantMethod::gptq);
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_FALSE(q.sym);
  EXPECT_TRUE(q.desc_act);
  EXPECT_EQ(q.checkpoint_format, "gptq");
  EXPECT_TRUE(q.zero_point);
  EXPECT_EQ(q.source, "config.json:quantization_config");
  EXPECT_EQ(q.raw["damp_percent"], 0.01);
}

TEST_F(Quantization, GptqInConfigJsonV2PerChannel) {
  config_with({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1},
               {"checkpoint_format", "gptq_v2"}});
  const auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.method, QuantMethod::gptq);
  EXPECT_EQ(q.bits, 8);
  EXPECT_EQ(q.group_size, -1);
  EXPECT_TRUE(q.sym);  // default
  EXPECT_FALSE(q.desc_act);  // default
  EXPECT_EQ(q.checkpoint_format, "gptq_v2");
}

TEST_F(Quantization, GptqQuantizeConfigJsonAutoGptq) {
  write_json(dir_ / "config.json", llama_config());
  // AutoGPTQ's quantize_config.json: no quant_method, no checkpoint_format.
  write_json(dir_ / "quantize_config.json",
             {{"bits", 4}, {"group_size", 32}, {"desc_act", false}, {"sym", true},
              {"true_sequential", true}, {"model_name_or_path", nullptr},
              {"model_file_base_name", "model"}});
  const auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.method, QuantMethod::gptq);
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 32);
  EXPECT_TRUE(q.sym);
  EXPECT_EQ(q.checkpoint_format, "gptq");
  EXPECT_EQ(q.source, "quantize_config.json");
}

TEST_F(Quantization, GptqQuantizeConfigJsonV2) {
  write_json(dir_ / "quantize_config.json",
             {{"bits", 4}, {"group_size", 128}, {"desc_act", true}, {"sym", true},
              {"quant_method", "gptq"}, {"checkpoint_format", "gptq_v2"}});
  auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.checkpoint_format, "gptq_v2");
  EXPECT_TRUE(q.desc_act);
  // GPTQModel's spelling.
  write_json(dir_ / "quantize_config.json",
             {{"bits", 4}, {"group_size", 128}, {"quant_method", "gptq"}, {"format", "GPTQ_V2"}});
  q = detect_quantization(dir_.path());
  EXPECT_EQ(q.checkpoint_format, "gptq_v2");
}

TEST_F(Quantization, ConfigJsonWinsAndBorrowsFormatFromQuantizeConfig) {
  config_with({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}});
  write_json(dir_ / "quantize_config.json",
             {{"bits", 4}, {"group_size", 128}, {"checkpoint_format", "gptq_v2"}});
  const auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.source, "config.json:quantization_config");
  EXPECT_EQ(q.checkpoint_format, "gptq_v2");
  write_json(dir_ / "quantize_config.json", {{"bits", 8}, {"group_size", 128}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"disagree", "bits 4", "bits 8"});
}

TEST_F(Quantization, AwqNewFieldNames) {
  config_with({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"version", "gemm"},
               {"zero_point", true}, {"modules_to_not_convert", nullptr}});
  const auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.method, QuantMethod::awq);
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_EQ(q.awq_version, "gemm");
  EXPECT_TRUE(q.zero_point);
  EXPECT_FALSE(q.sym);
  EXPECT_FALSE(q.desc_act);
  EXPECT_EQ(q.checkpoint_format, "");
}

TEST_F(Quantization, AwqOldFieldNames) {
  config_with({{"quant_method", "awq"}, {"w_bit", 4}, {"q_group_size", 64}, {"version", "GEMV"},
               {"zero_point", false}});
  auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.method, QuantMethod::awq);
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 64);
  EXPECT_EQ(q.awq_version, "gemv");
  EXPECT_FALSE(q.zero_point);
  EXPECT_TRUE(q.sym);
}

TEST_F(Quantization, AwqQuantConfigJson) {
  // AutoAWQ's own quant_config.json: no quant_method.
  write_json(dir_ / "config.json", llama_config());
  write_json(dir_ / "quant_config.json",
             {{"zero_point", true}, {"q_group_size", 128}, {"w_bit", 4}, {"version", "GEMM"}});
  const auto q = detect_quantization(dir_.path());
  EXPECT_EQ(q.method, QuantMethod::awq);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_EQ(q.awq_version, "gemm");
  EXPECT_EQ(q.source, "quant_config.json");
}

TEST_F(Quantization, UnknownMethodIsUnsupported) {
  config_with({{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::unsupported,
               {"bitsandbytes", "config.json"});
  config_with({{"quant_method", "gptq"}, {"bits", 4}, {"checkpoint_format", "marlin"}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::unsupported,
               {"'marlin'", "gptq_v2"});
  config_with({{"quant_method", "gptq"}, {"bits", 4}, {"is_marlin_format", true}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::unsupported,
               {"is_marlin_format"});
}

TEST_F(Quantization, MalformedFields) {
  config_with({{"quant_method", "gptq"}, {"group_size", 128}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"missing 'bits'"});
  config_with({{"quant_method", "gptq"}, {"bits", "4"}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"'bits'", "\"4\"", "integer"});
  config_with({{"quant_method", "gptq"}, {"bits", 16}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"'bits' = 16", "1 to 8"});
  config_with({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 0}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"'group_size' = 0", "-1"});
  config_with({{"quant_method", "gptq"}, {"bits", 4}, {"desc_act", "yes"}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"'desc_act'", "true or false"});
  config_with({{"quant_method", 4}});
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"'quant_method'", "expected a string"});
  config_with(json::array());
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"config.json", "expected an object"});
  config_with(json::object());
  expect_error([&] { (void)detect_quantization(dir_.path()); }, ErrorKind::format,
               {"no 'quant_method'"});
}

// ---- Checkpoint -----------------------------------------------------------------------------

std::vector<std::byte> bytes_of(std::initializer_list<uint8_t> v) {
  std::vector<std::byte> out;
  for (auto b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

void write_shard(const std::filesystem::path& p,
                 std::initializer_list<std::pair<const char*, std::vector<std::byte>>> tensors) {
  SafetensorsWriter w;
  for (const auto& [name, data] : tensors)
    w.add_copy(name, DType::u8, {static_cast<int64_t>(data.size())}, data);
  w.write(p);
}

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir;
  write_shard(dir / "model-00001-of-00002.safetensors",
              {{"model.embed_tokens.weight", bytes_of({1, 2})}, {"model.norm.weight", bytes_of({3})}});
  write_shard(dir / "model-00002-of-00002.safetensors", {{"lm_head.weight", bytes_of({4, 5, 6})}});
  // A stray consolidated file duplicating names: ignored because the index rules.
  write_shard(dir / "consolidated.safetensors", {{"lm_head.weight", bytes_of({9})}});
  write_json(dir / "model.safetensors.index.json",
             {{"metadata", {{"total_size", 6}}},
              {"weight_map",
               {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                {"model.norm.weight", "./model-00001-of-00002.safetensors"},
                {"lm_head.weight", "model-00002-of-00002.safetensors"}}}});
  json cfg = llama_config();
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
  write_json(dir / "config.json", cfg);

  auto ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(ck.size(), 3u);
  EXPECT_EQ(ck.tensor_names(),
            (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                      "model.norm.weight"}));
  const auto* t = ck.find("lm_head.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->file->path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(t->info->shape, std::vector<int64_t>{3});
  EXPECT_EQ(ck.find("nope"), nullptr);
  const TensorView v = ck.view("lm_head.weight");
  EXPECT_EQ(v.as<const uint8_t>()[2], 6);
  EXPECT_EQ(ck.bytes("model.norm.weight")[0], std::byte{3});
  ASSERT_TRUE(ck.config().has_value());
  EXPECT_EQ(ck.config()->hidden_size, 4096);
  EXPECT_EQ(ck.quantization().method, QuantMethod::gptq);
  expect_error([&] { (void)ck.view("model.embed.weight"); }, ErrorKind::format,
               {"no tensor 'model.embed.weight'", "'lm_head.weight'"});
  // Moving keeps pointers and views valid.
  Checkpoint moved = std::move(ck);
  EXPECT_EQ(moved.find("lm_head.weight")->info, t->info);
  EXPECT_EQ(v.as<const uint8_t>()[0], 4);
}

TEST(Checkpoint, IndexNamingMissingShard) {
  TempDir dir;
  write_shard(dir / "a.safetensors", {{"x", bytes_of({1})}});
  write_json(dir / "model.safetensors.index.json",
             {{"weight_map", {{"x", "a.safetensors"}, {"y", "b.safetensors"}}}});
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"model.safetensors.index.json", "'b.safetensors'", "'y'", "does not exist"});
}

TEST(Checkpoint, IndexWrongShardOrMissingTensor) {
  TempDir dir;
  write_shard(dir / "a.safetensors", {{"x", bytes_of({1})}});
  write_shard(dir / "b.safetensors", {{"y", bytes_of({2})}});
  write_json(dir / "model.safetensors.index.json",
             {{"weight_map", {{"x", "b.safetensors"}, {"y", "b.safetensors"}, {"w", "a.safetensors"}}}});
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"tensor 'w'", "'a.safetensors'", "no such tensor"});
  write_json(dir / "model.safetensors.index.json",
             {{"weight_map", {{"x", "b.safetensors"}, {"y", "b.safetensors"}, {"z", "a.safetensors"}}}});
  write_shard(dir / "a.safetensors", {{"x", bytes_of({1})}, {"z", bytes_of({1})}});
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"tensor 'x'", "'b.safetensors'", "but it is in 'a.safetensors'"});
}

TEST(Checkpoint, IndexMalformed) {
  TempDir dir;
  write_shard(dir / "a.safetensors", {{"x", bytes_of({1})}});
  write_json(dir / "model.safetensors.index.json", {{"weight_map", {{"x", 3}}}});
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format, {"weight_map['x']"});
  write_json(dir / "model.safetensors.index.json", {{"weight_map", {{"x", "../a.safetensors"}}}});
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"inside the checkpoint folder"});
  write_json(dir / "model.safetensors.index.json", {{"metadata", json::object()}});
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"missing 'weight_map'"});
}

TEST(Checkpoint, NoIndexOpensEveryShardAndRejectsDuplicates) {
  TempDir dir;
  write_shard(dir / "part1.safetensors", {{"x", bytes_of({1})}});
  write_shard(dir / "part2.safetensors", {{"y", bytes_of({2})}});
  write_file(dir / "README.md", "not a shard");
  auto ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.size(), 2u);
  EXPECT_FALSE(ck.config().has_value());
  EXPECT_EQ(ck.quantization().method, QuantMethod::none);
  write_shard(dir / "part3.safetensors", {{"x", bytes_of({3})}});
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"tensor 'x'", "two shards", "'part1.safetensors'", "'part3.safetensors'"});
}

TEST(Checkpoint, SingleFileHasNoConfig) {
  TempDir dir;
  write_json(dir / "config.json", llama_config());  // ignored for a lone file
  write_shard(dir / "one.safetensors", {{"x", bytes_of({7})}});
  const auto ck = Checkpoint::open(dir / "one.safetensors");
  EXPECT_EQ(ck.files().size(), 1u);
  EXPECT_FALSE(ck.config().has_value());
  EXPECT_EQ(ck.quantization().method, QuantMethod::none);
  EXPECT_EQ(ck.bytes("x")[0], std::byte{7});
}

TEST(Checkpoint, EmptyOrMissingFolderAndBadShard) {
  TempDir dir;
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"no .safetensors files"});
  expect_error([&] { (void)Checkpoint::open(dir / "absent"); }, ErrorKind::io,
               {"absent", "no such file or folder"});
  write_file(dir / "broken.safetensors", "1234");
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"broken.safetensors", "at least 8"});
}

TEST(Checkpoint, BadConfigFailsTheOpen) {
  TempDir dir;
  write_shard(dir / "model.safetensors", {{"x", bytes_of({1})}});
  write_file(dir / "config.json", "{\"hidden_size\": }");
  expect_error([&] { (void)Checkpoint::open(dir.path()); }, ErrorKind::format,
               {"config.json", "line 1"});
}

}  // namespace
}  // namespace lowbit::io
