// The engine's logits against Hugging Face transformers on tiny
// random-initialized Llama and Qwen3 models (tests/engine/make_golden.py wrote
// the checkpoints and the reference logits; see its header for the models:
// llama and qwen3 in fp32, llama_d64 and qwen3_d128 in fp16 with the head
// dimensions of the CUDA kernels, which tests/cuda/test_cuda_golden.cu runs).
// The test prefills the first 10 tokens (logits of every position) and then
// decodes the remaining 4 one at a time, teacher-forced with the tokens
// transformers chose greedily, so every position's logits are compared.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "engine_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/sampler.h"
#include "lowbit/engine/weights.h"
#include "lowbit/io/safetensors.h"
#include "tolerances.h"

namespace lowbit::test {
namespace {

using engine::KvStorage;

constexpr size_t kPrefill = kGoldenPrefill;

engine::CpuBackendOptions fp32_kv() {
  engine::CpuBackendOptions o;
  o.kv.k = KvStorage::fp32;
  o.kv.v = KvStorage::fp32;
  o.kv.max_tokens = 64;
  o.kv.max_sequences = 4;
  return o;
}

class GoldenLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenLogits, Fp32MatchesTransformers) {
  const Golden g = read_golden(GetParam());
  const engine::Model model = engine::load_model(golden_dir(GetParam()));
  EXPECT_EQ(model.weights.embed.format,
            GetParam().find("_d") == std::string::npos ? engine::MatrixFormat::f32 : engine::MatrixFormat::f16);
  auto backend = engine::make_cpu_backend(model, fp32_kv());
  const std::vector<float> ours = run_positions(*backend, g.tokens, kPrefill);
  ASSERT_EQ(ours.size(), g.logits.size());
  const double err = max_relative_error(ours, g.logits);
  EXPECT_LE(err, kEngineLogitsMaxRelError) << GetParam();
  // The greedy choices transformers made are ours too.
  const size_t V = static_cast<size_t>(model.config.vocab);
  for (size_t i = kPrefill - 1; i + 1 < g.tokens.size(); ++i)
    EXPECT_EQ(engine::argmax(std::span<const float>(ours).subspan(i * V, V)), g.tokens[i + 1]) << "position " << i;
  RecordProperty("max_rel_error", std::to_string(err));
}

TEST_P(GoldenLogits, W4MatchesTransformersOnFakeQuantizedWeights) {
  const Golden g = read_golden(GetParam());
  engine::LoadOptions lo;
  lo.weights = engine::WeightMode::w4;
  const engine::Model model = engine::load_model(golden_dir(GetParam()), lo);
  // Our RTN dequantizes to exactly the weights transformers ran (the fp16
  // models' golden files leave those out to stay small: logits only).
  const io::SafetensorsFile f = io::SafetensorsFile::open(golden_dir(GetParam()) / "golden.safetensors");
  const auto check_matrix = [&](const engine::WeightMatrix& m, const std::string& name) {
    ASSERT_EQ(m.format, engine::MatrixFormat::w4) << name;
    if (!f.contains("w4." + name)) return;
    const TensorView ref = f.view("w4." + name);
    std::vector<float> row(static_cast<size_t>(m.cols));
    for (int64_t r = 0; r < m.rows; ++r) {
      m.dequant_row(r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), ref.as<const float>() + r * m.cols, row.size() * sizeof(float)), 0)
          << name << " row " << r;
    }
  };
  for (size_t l = 0; l < model.weights.layers.size(); ++l) {
    const engine::LayerWeights& L = model.weights.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    check_matrix(L.wq, p + "self_attn.q_proj.weight");
    check_matrix(L.wk, p + "self_attn.k_proj.weight");
    check_matrix(L.wv, p + "self_attn.v_proj.weight");
    check_matrix(L.wo, p + "self_attn.o_proj.weight");
    check_matrix(L.w_gate, p + "mlp.gate_proj.weight");
    check_matrix(L.w_up, p + "mlp.up_proj.weight");
    check_matrix(L.w_down, p + "mlp.down_proj.weight");
  }
  if (model.weights.lm_head) check_matrix(*model.weights.lm_head, "lm_head.weight");
  auto backend = engine::make_cpu_backend(model, fp32_kv());
  const std::vector<float> ours = run_positions(*backend, g.tokens, kPrefill);
  const double err = max_relative_error(ours, g.logits_w4);
  EXPECT_LE(err, kEngineW4LogitsMaxRelError) << GetParam();
  // Not vacuous: the quantization itself moves the logits far more than that.
  EXPECT_GT(max_relative_error(g.logits_w4, g.logits), 100 * kEngineW4LogitsMaxRelError);
}

TEST_P(GoldenLogits, BatchedForwardEqualsOneSequenceAtATime) {
  const Golden g = read_golden(GetParam());
  const engine::Model model = engine::load_model(golden_dir(GetParam()));
  auto backend = engine::make_cpu_backend(model, fp32_kv());
  // Three sequences: the golden prompt, its tail, and its reverse, prefilled
  // together, then decoded together for four steps.
  std::vector<std::vector<int32_t>> prompts = {
      std::vector<int32_t>(g.tokens.begin(), g.tokens.begin() + kPrefill),
      std::vector<int32_t>(g.tokens.begin() + 3, g.tokens.begin() + kPrefill),
      std::vector<int32_t>(g.tokens.rbegin(), g.tokens.rbegin() + 5)};
  const std::vector<int32_t> next = {g.tokens[kPrefill], 5, 7, 11};
  std::vector<std::vector<float>> single;
  for (const auto& p : prompts) {
    std::vector<int32_t> seq = p;
    seq.insert(seq.end(), next.begin(), next.end());
    single.push_back(run_positions(*backend, seq, p.size()));
  }
  std::vector<int> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(backend->add_sequence());
  std::vector<engine::StepInput> in;
  for (size_t i = 0; i < prompts.size(); ++i) in.push_back({ids[i], prompts[i]});
  std::vector<float> logits;
  backend->forward(in, engine::LogitsWanted::last, logits);
  const size_t V = static_cast<size_t>(model.config.vocab);
  const auto expect_row = [&](size_t i, size_t position, std::span<const float> row) {
    const std::span<const float> want = std::span<const float>(single[i]).subspan(position * V, V);
    EXPECT_LE(max_relative_error(row, want), kEngineBatchMaxRelError) << "sequence " << i << " position " << position;
  };
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_row(i, prompts[i].size() - 1, std::span<const float>(logits).subspan(i * V, V));
  for (size_t s = 0; s < next.size(); ++s) {
    in.clear();
    for (size_t i = 0; i < prompts.size(); ++i) in.push_back({ids[i], std::span<const int32_t>(&next[s], 1)});
    backend->forward(in, engine::LogitsWanted::last, logits);
    for (size_t i = 0; i < prompts.size(); ++i)
      expect_row(i, prompts[i].size() + s, std::span<const float>(logits).subspan(i * V, V));
  }
}

TEST_P(GoldenLogits, Fp16KvStaysCloseToFp32Kv) {
  const Golden g = read_golden(GetParam());
  const engine::Model model = engine::load_model(golden_dir(GetParam()));
  engine::CpuBackendOptions o = fp32_kv();
  o.kv.k = o.kv.v = KvStorage::fp16;
  auto backend = engine::make_cpu_backend(model, o);
  const std::vector<float> ours = run_positions(*backend, g.tokens, kPrefill);
  // fp16 K/V: relative rounding 2^-11 per value; through two layers the logits
  // move by about that much of their scale. Not the fp32 bound, but close.
  const double err = max_relative_error(ours, g.logits);
  EXPECT_LE(err, 1e-2);
  EXPECT_GT(err, 0.0);  // it really stored fp16
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenLogits, ::testing::Values("llama", "qwen3", "llama_d64", "qwen3_d128"),
                         [](const auto& param_info) { return std::string(param_info.param); });

TEST(GoldenModels, ConfigsAreReadAsWritten) {
  const engine::Model llama = engine::load_model(golden_dir("llama"));
  EXPECT_EQ(llama.config.arch, engine::Architecture::llama);
  EXPECT_TRUE(llama.config.rope_scaling.llama3);
  EXPECT_FALSE(llama.config.tied_embeddings);
  EXPECT_TRUE(llama.weights.lm_head.has_value());
  EXPECT_EQ(llama.config.head_dim, 16);
  const engine::Model qwen = engine::load_model(golden_dir("qwen3"));
  EXPECT_EQ(qwen.config.arch, engine::Architecture::qwen3);
  EXPECT_TRUE(qwen.config.qk_norm);
  EXPECT_TRUE(qwen.config.tied_embeddings);
  EXPECT_FALSE(qwen.weights.lm_head.has_value());
  EXPECT_EQ(qwen.config.q_dim(), 128);
  EXPECT_EQ(qwen.config.hidden, 64);
  EXPECT_EQ(engine::load_model(golden_dir("llama_d64")).config.head_dim, 64);
  const engine::Model q128 = engine::load_model(golden_dir("qwen3_d128"));
  EXPECT_EQ(q128.config.head_dim, 128);
  EXPECT_EQ(q128.config.q_dim(), 256);
  EXPECT_EQ(q128.config.num_heads / q128.config.num_kv_heads, 2);
}

}  // namespace
}  // namespace lowbit::test
