// The CUDA backend against Hugging Face transformers directly: the golden
// models with the CUDA attention kernels' head dimensions (llama_d64: head_dim
// 64, untied lm_head; qwen3_d128: head_dim 128, per-head q/k norm, q_dim !=
// hidden, tied embeddings; tests/engine/make_golden.py wrote them and the
// reference logits in fp32 on their fp16 weights). The first 10 tokens are
// prefilled (logits of every position), the last 4 decoded one at a time,
// teacher-forced with transformers' greedy tokens. tests/engine checks the CPU
// backend against the same files to 1e-4. With a TurboQuant cache there is no
// transformers reference (it would measure the 4-bit K/V error itself,
// 0.22-0.24 of the logits' range here): those cases compare with the CPU
// backend using the same cache format instead.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "gpu_test_util.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/sampler.h"
#include "lowbit/engine/weights.h"
#include "tolerances.h"

namespace lowbit::test {
namespace {

using engine::KvStorage;

struct Case {
  const char* model;
  KvStorage kv;
  bool w4;  // linears quantized on load (RTN, as make_golden.py fake-quantized them)
  std::string name() const {
    return std::string(model) + "_" + engine::kv_storage_name(kv) + (w4 ? "_w4" : "_fp16");
  }
};

class CudaGoldenLogits : public ::testing::TestWithParam<Case> {};

// The GPU keeps activations (and fp16 K/V) in fp16: the bound is the CUDA
// engine's (tolerances.h), and its tq4 bound with a TurboQuant cache.
TEST_P(CudaGoldenLogits, MatchTransformers) {
  LOWBIT_REQUIRE_GPU();
  const Case& c = GetParam();
  const Golden g = read_golden(c.model);
  engine::LoadOptions lo;
  lo.weights = c.w4 ? engine::WeightMode::w4 : engine::WeightMode::as_stored;
  const engine::Model model = engine::load_model(golden_dir(c.model), lo);
  engine::KvOptions kv;
  kv.k = kv.v = c.kv;
  kv.max_tokens = 64;
  kv.page_size = 16;
  auto gpu = engine::make_cuda_backend(model, kv);
  const std::vector<float> ours = run_positions(*gpu, g.tokens, kGoldenPrefill);
  std::vector<float> want = c.w4 ? g.logits_w4 : g.logits;
  if (c.kv != KvStorage::fp16) {
    engine::CpuBackendOptions o;
    o.kv = kv;
    auto cpu = engine::make_cpu_backend(model, o);
    want = run_positions(*cpu, g.tokens, kGoldenPrefill);
  }
  ASSERT_EQ(ours.size(), want.size());
  const double err = max_relative_error(ours, want);
  const double bound = c.kv == KvStorage::fp16 ? kCudaEngineLogitsRelError : kCudaEngineLogitsRelErrorTq4;
  EXPECT_LE(err, bound) << c.name();
  RecordProperty("max_rel_error", std::to_string(err));
  // Transformers' greedy continuation (made with the fp32 weights) is ours
  // too with fp16 weights and fp16 K/V.
  if (!c.w4 && c.kv == KvStorage::fp16) {
    const size_t V = static_cast<size_t>(model.config.vocab);
    for (size_t i = kGoldenPrefill - 1; i + 1 < g.tokens.size(); ++i)
      EXPECT_EQ(engine::argmax(std::span<const float>(ours).subspan(i * V, V)), g.tokens[i + 1]) << "position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGoldenLogits,
                         ::testing::Values(Case{"llama_d64", KvStorage::fp16, false},
                                           Case{"qwen3_d128", KvStorage::fp16, false},
                                           Case{"llama_d64", KvStorage::fp16, true},
                                           Case{"qwen3_d128", KvStorage::fp16, true},
                                           Case{"llama_d64", KvStorage::tq4, false},
                                           Case{"qwen3_d128", KvStorage::tq4, true}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

}  // namespace
}  // namespace lowbit::test
