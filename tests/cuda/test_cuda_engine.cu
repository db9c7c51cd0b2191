// The CUDA engine (lowbit/engine/cuda_engine.h) against the CPU backend on the
// same random models: prefill logits of every prompt token and a few greedy
// decode steps, for Llama and Qwen3 (per-head q/k norm), dense and w4
// weights, fp16 and tq4 KV. The CPU backend is itself tested against
// transformers (tests/engine), so agreement here ties the GPU path to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "error_matchers.h"
#include "gpu_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/cuda/check.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/cuda_engine.h"
#include "lowbit/engine/generate.h"
#include "lowbit/engine/weights.h"
#include "tolerances.h"

namespace lowbit::engine {
namespace {

// head_dim 128 (Llama, Qwen3) or 64 (SmolLM2), the CUDA attention kernels' head dimensions.
ModelConfig tiny_config(Architecture arch, int64_t head_dim = 128) {
  ModelConfig c;
  c.arch = arch;
  c.hidden = 256;
  c.intermediate = 512;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = head_dim;
  c.vocab = 384;
  c.rms_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.qk_norm = arch == Architecture::qwen3;
  return c;
}

// max |a - b| / max |b| over the whole array.
double max_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? err / scale : err;
}

struct Case {
  Architecture arch;
  WeightMode weights;
  KvStorage kv;
  int64_t head_dim = 128;
  kv::RotationKind rotation = kv::RotationKind::haar;
  std::string name() const {
    return std::string(architecture_name(arch)) + "_" + weight_mode_name(weights) + "_" + kv_storage_name(kv) + "_d" +
           std::to_string(head_dim) + (rotation == kv::RotationKind::haar ? "" : "_hadamard");
  }
};

class CudaEngineVsCpu : public ::testing::TestWithParam<Case> {};

double logits_tolerance(KvStorage kv) {
  switch (kv) {
    case KvStorage::tq4: return test::kCudaEngineLogitsRelErrorTq4;
    case KvStorage::tq3: case KvStorage::tq2: return test::kCudaEngineLogitsRelErrorTq3;
    default: return test::kCudaEngineLogitsRelError;
  }
}

TEST_P(CudaEngineVsCpu, PrefillAndDecodeLogitsAgree) {
  LOWBIT_REQUIRE_GPU();
  const Case& tc = GetParam();
  const Model model = make_random_model(tiny_config(tc.arch, tc.head_dim), 99, tc.weights, 0.08f);
  CpuBackendOptions cpu_options;
  cpu_options.kv.k = cpu_options.kv.v = tc.kv;
  cpu_options.kv.max_tokens = 64;
  cpu_options.kv.page_size = 16;
  cpu_options.kv.rotation = tc.rotation;
  auto cpu = make_cpu_backend(model, cpu_options);
  auto gpu = make_cuda_backend(model, cpu_options.kv, false);
  const int cs = cpu->add_sequence(), gs = gpu->add_sequence();

  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 5) % model.config.vocab));
  std::vector<float> want, got;
  cpu->forward(std::vector<StepInput>{{cs, prompt}}, LogitsWanted::all, want);
  gpu->forward(std::vector<StepInput>{{gs, prompt}}, LogitsWanted::all, got);
  ASSERT_EQ(got.size(), want.size());
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  const double tolerance = logits_tolerance(tc.kv);
  EXPECT_LE(max_rel_error(got, want), tolerance) << "prefill";

  // Greedy decode, both fed the CPU's choice so they see the same tokens.
  std::vector<float> last(want.end() - model.config.vocab, want.end());
  for (int step = 0; step < 6; ++step) {
    const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    const std::vector<int32_t> token = {next};
    cpu->forward(std::vector<StepInput>{{cs, token}}, LogitsWanted::last, want);
    gpu->forward(std::vector<StepInput>{{gs, token}}, LogitsWanted::last, got);
    EXPECT_LE(max_rel_error(got, want), tolerance) << "decode step " << step;
    last = want;
  }
  EXPECT_EQ(gpu->length(gs), 27);
  EXPECT_GT(gpu->kv().bytes_used(), 0);
}

// Three prompts prefilled and then decoded in one batch against the same
// prompts one at a time in another engine: each row's logits within `bound`.
void expect_batched_equals_alone(KvStorage storage, double bound) {
  const Model model = make_random_model(tiny_config(Architecture::qwen3), 5, WeightMode::w4, 0.08f);
  KvOptions kv;
  kv.k = kv.v = storage;
  kv.max_tokens = 80;
  kv.max_sequences = 3;
  kv.page_size = 16;
  auto batched = make_cuda_backend(model, kv, false);
  auto single = make_cuda_backend(model, kv, false);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3}, {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}, {300}};
  std::vector<int> bseq, sseq;
  std::vector<float> logits;
  for (const auto& p : prompts) {
    bseq.push_back(batched->add_sequence());
    sseq.push_back(single->add_sequence());
  }
  std::vector<StepInput> inputs;
  for (size_t i = 0; i < prompts.size(); ++i) inputs.push_back({bseq[i], prompts[i]});
  batched->forward(inputs, LogitsWanted::last, logits);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<float> one;
    single->forward(std::vector<StepInput>{{sseq[i], prompts[i]}}, LogitsWanted::last, one);
    const std::vector<float> row(logits.begin() + static_cast<int64_t>(i) * model.config.vocab,
                                 logits.begin() + static_cast<int64_t>(i + 1) * model.config.vocab);
    // The GEMMs see different M: other summation orders, and at 1-4 rows
    // another kernel (kCudaEngineAcrossRowCountsRelError).
    EXPECT_LE(max_rel_error(row, one), bound) << kv_storage_name(storage) << ", prompt " << i;
  }
  // A decode step of all three at once against one at a time.
  const std::vector<int32_t> next = {4, 5, 6};
  inputs.clear();
  for (size_t i = 0; i < prompts.size(); ++i) inputs.push_back({bseq[i], std::span(next).subspan(i, 1)});
  batched->forward(inputs, LogitsWanted::last, logits);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<float> one;
    single->forward(std::vector<StepInput>{{sseq[i], std::span(next).subspan(i, 1)}}, LogitsWanted::last,
                    one);
    const std::vector<float> row(logits.begin() + static_cast<int64_t>(i) * model.config.vocab,
                                 logits.begin() + static_cast<int64_t>(i + 1) * model.config.vocab);
    EXPECT_LE(max_rel_error(row, one), bound) << kv_storage_name(storage) << ", decode, sequence " << i;
  }
}

TEST(CudaEngine, BatchedDecodeEqualsOneSequenceAtATime) {
  LOWBIT_REQUIRE_GPU();
  // fp16 K/V: only the GEMMs' rounding differs between the two engines.
  expect_batched_equals_alone(KvStorage::fp16, test::kCudaEngineAcrossRowCountsRelError);
  // A 4-bit cache: the 3-token prompt alone now runs the gemv kernel, in the
  // batch (21 rows) wgmma, and the K/V they write differ by that rounding,
  // which moves some cache codes across a 4-bit boundary, as between the GPU
  // and the CPU; so the GPU-against-CPU bound of tq4 (measured: 0.037 in the
  // decode step, 0.031 after the prefill, where both engines ran wgmma for
  // every prefill until `auto` took gemv at 2-4 rows).
  expect_batched_equals_alone(KvStorage::tq4, test::kCudaEngineLogitsRelErrorTq4);
}

// One prompt prefilled beside another in the same step against the same
// prompt alone in a fresh engine, for prompt lengths around the 16-row wgmma
// tile and the 16-token page, fp16 and tq4 KV. (It found rows 9-16 of the
// 16-row wgmma tile left unwritten when K is split in 2.)
TEST(CudaEngine, PrefillBesideAnotherPromptEqualsAlone) {
  LOWBIT_REQUIRE_GPU();
  const Model model = make_random_model(tiny_config(Architecture::qwen3), 5, WeightMode::w4, 0.08f);
  const std::vector<int32_t> other = {40, 41, 42, 43, 44};
  for (KvStorage storage : {KvStorage::fp16, KvStorage::tq4})
    for (int length : {1, 2, 3, 7, 8, 9, 10, 11, 12, 15, 16, 17}) {
      KvOptions kv;
      kv.k = kv.v = storage;
      kv.max_tokens = 64;
      kv.max_sequences = 2;
      kv.page_size = 16;
      std::vector<int32_t> prompt(static_cast<size_t>(length));
      for (int i = 0; i < length; ++i) prompt[static_cast<size_t>(i)] = 300 + i;
      auto pair = make_cuda_backend(model, kv, false);
      auto alone = make_cuda_backend(model, kv, false);
      const int a = pair->add_sequence(), b = pair->add_sequence(), c = alone->add_sequence();
      std::vector<float> both, one;
      pair->forward(std::vector<StepInput>{{a, prompt}, {b, other}}, LogitsWanted::last, both);
      alone->forward(std::vector<StepInput>{{c, prompt}}, LogitsWanted::last, one);
      const std::vector<float> row(both.begin(), both.begin() + model.config.vocab);
      EXPECT_LE(max_rel_error(row, one), test::kCudaEngineAcrossRowCountsRelError)
          << kv_storage_name(storage) << " prompt of " << length << " tokens";
    }
}

// With tune_decode_gemms the single-row steps run the fastest W4A16 plan
// timed at construction: every w4 layer shape is listed, and a prefill plus
// decode steps agree with an untuned engine (fp16 KV; the plans differ only
// in rounding).
TEST(CudaEngine, TunedDecodeGemmsListTheirChoiceAndAgree) {
  LOWBIT_REQUIRE_GPU();
  const Model model = make_random_model(tiny_config(Architecture::llama), 9, WeightMode::w4, 0.08f);
  const DeviceModel device_model = DeviceModel::upload(model, false);
  CudaEngineOptions options;
  options.k_format = options.v_format = kv::KvFormat::fp16;
  options.max_tokens = 32;
  CudaEngine plain(device_model, options);
  options.tune_decode_gemms = true;
  CudaEngine tuned(device_model, options);
  EXPECT_TRUE(plain.decode_gemm_choices().empty());
  // qkv and gate/up 256 x 1024, o and down 512 x 256 (and the lm_head when it is w4).
  ASSERT_GE(tuned.decode_gemm_choices().size(), 2u);
  for (const std::string& line : tuned.decode_gemm_choices()) EXPECT_NE(line.find(" -> "), std::string::npos) << line;
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65};
  std::vector<std::vector<float>> out[2];
  CudaEngine* engines[2] = {&plain, &tuned};
  for (int k = 0; k < 2; ++k) {
    CudaEngine& e = *engines[k];
    const int seq = e.add_sequence();
    std::vector<int32_t> tokens = prompt;
    for (int step = 0; step < 4; ++step) {
      const int64_t n = static_cast<int64_t>(tokens.size());
      const std::vector<StepRow> rows = {{seq, e.extend(seq, n), n}};
      e.step(rows, tokens, false);
      LOWBIT_CUDA_CHECK(cudaStreamSynchronize(e.stream()));
      const TensorView logits = e.logits();
      std::vector<uint16_t> bits(static_cast<size_t>(model.config.vocab));
      Buffer::copy(bits.data(), Device::cpu, logits.data, Device::cuda, bits.size() * 2);
      std::vector<float> row(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) row[i] = f16_to_float(f16::from_bits(bits[i]));
      out[k].push_back(row);
      tokens = {static_cast<int32_t>(10 + step)};  // the same next token for both
    }
  }
  for (size_t step = 0; step < out[0].size(); ++step)
    EXPECT_LE(max_rel_error(out[1][step], out[0][step]), test::kCudaEngineBatchRelError) << "step " << step;
}

// The logits' f16 bits of `steps` steps of a new sequence of e: the prompt
// {3, 14, 15, 92, 65} (a prefill of 5 rows), then one token per step, the
// same tokens whatever the logits (20, 27, 34, ...), so that two engines
// can be compared step by step.
std::vector<std::vector<uint16_t>> prompt_and_decode_bits(CudaEngine& e, int steps) {
  std::vector<std::vector<uint16_t>> out;
  const int seq = e.add_sequence();
  std::vector<int32_t> tokens = {3, 14, 15, 92, 65};
  for (int step = 0; step < steps; ++step) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const std::vector<StepRow> rows = {{seq, e.extend(seq, n), n}};
    e.step(rows, tokens, false);
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(e.stream()));
    std::vector<uint16_t> bits(static_cast<size_t>(e.model().config.vocab));
    Buffer::copy(bits.data(), Device::cpu, e.logits().data, Device::cuda, bits.size() * 2);
    out.push_back(std::move(bits));
    tokens = {static_cast<int32_t>(20 + 7 * step)};
  }
  return out;
}

// decode_gemv_splits: single-row GEMMs of the named roles run gemv at the
// given split. Forcing the rule's own split must give the bits of the engine
// that names gemv with the rule's split (decode_gemm = gemv, split 0), since
// the kernel and its split are the same; other splits change only the order
// of the K split's sum. Each forced role is listed, with the split its plan
// takes (clamped to the k-iterations); bad roles, splits, and the tuner
// beside them are refused.
TEST(CudaEngine, ForcedDecodeGemvSplitsAreListedAgreeAndAreChecked) {
  LOWBIT_REQUIRE_GPU();
  const Model model = make_random_model(tiny_config(Architecture::qwen3), 23, WeightMode::w4, 0.08f);
  const DeviceModel device_model = DeviceModel::upload(model, false);
  const W4A16Options rule{W4A16Strategy::gemv, 0};
  const int qkv_rule = w4a16_plan(1, *device_model.layers.front().qkv.w4, rule).split_k;
  const int down_rule = w4a16_plan(1, *device_model.layers.front().down.w4, rule).split_k;
  const int down_iters = static_cast<int>(device_model.layers.front().down.K / 64);
  ASSERT_GE(down_iters, 3);
  CudaEngineOptions options;
  options.max_tokens = 32;
  options.decode_gemm = rule;
  CudaEngine named(device_model, options);
  // The roles not forced keep decode_gemm (gemv at the rule's split) in all
  // three engines, so that only the forced roles differ, on any device.
  options.decode_gemv_splits = {{"qkv", qkv_rule}, {"down", down_rule}};
  CudaEngine same(device_model, options);
  const int other_down = down_rule == 1 ? 2 : 1;
  options.decode_gemv_splits = {{"down", other_down}, {"lm_head", 1000}};
  CudaEngine other(device_model, options);

  ASSERT_EQ(same.decode_gemm_choices().size(), 2u);
  EXPECT_NE(same.decode_gemm_choices()[0].find("qkv: "), std::string::npos) << same.decode_gemm_choices()[0];
  EXPECT_NE(same.decode_gemm_choices()[0].find("gemv split " + std::to_string(qkv_rule) + " (forced)"),
            std::string::npos)
      << same.decode_gemm_choices()[0];
  ASSERT_EQ(other.decode_gemm_choices().size(), 2u);
  EXPECT_NE(other.decode_gemm_choices()[0].find("down: "), std::string::npos) << other.decode_gemm_choices()[0];
  // The tiny model's lm_head is dense unless it is w4; either way it is listed.
  EXPECT_NE(other.decode_gemm_choices()[1].find("lm_head: "), std::string::npos) << other.decode_gemm_choices()[1];
  if (device_model.lm_head.w4) {
    const int lm_iters = static_cast<int>(device_model.lm_head.K / 64);
    EXPECT_NE(other.decode_gemm_choices()[1].find("gemv split " + std::to_string(lm_iters)), std::string::npos)
        << other.decode_gemm_choices()[1];
  }
  EXPECT_TRUE(same.silu_fused_into_down());  // the fusions still see a gemv plan

  const auto a = prompt_and_decode_bits(named, 5), b = prompt_and_decode_bits(same, 5),
             c = prompt_and_decode_bits(other, 5);
  const auto as_floats = [](const std::vector<uint16_t>& bits) {
    std::vector<float> f(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) f[i] = f16_to_float(f16::from_bits(bits[i]));
    return f;
  };
  for (size_t step = 0; step < a.size(); ++step) {
    EXPECT_EQ(a[step], b[step]) << "step " << step;
    EXPECT_LE(max_rel_error(as_floats(c[step]), as_floats(a[step])), test::kCudaEngineBatchRelError)
        << "step " << step;
  }

  options.decode_gemv_splits = {{"attention", 2}};
  EXPECT_TRUE(test::throws_error([&] { CudaEngine e(device_model, options); }, ErrorKind::invalid_argument,
                                 {"unknown role 'attention'"}));
  options.decode_gemv_splits = {{"qkv", 0}};
  EXPECT_TRUE(test::throws_error([&] { CudaEngine e(device_model, options); }, ErrorKind::invalid_argument,
                                 {"qkv=0", "from 1 to"}));
  options.decode_gemv_splits = {{"qkv", 2}};
  options.tune_decode_gemms = true;
  EXPECT_TRUE(test::throws_error([&] { CudaEngine e(device_model, options); }, ErrorKind::invalid_argument,
                                 {"tune_decode_gemms"}));
}

// Single-row steps whose down projection runs the gemv strategy read the
// SiLU inside it (fuse_silu_into_down): the logits are the bits of the same
// engine with the SiLU kernel separate, at every decode step; a prefill (5
// rows) runs the separate kernel in both.
TEST(CudaEngine, SiluFusedIntoTheDownProjectionGivesTheSameBits) {
  LOWBIT_REQUIRE_GPU();
  for (Architecture arch : {Architecture::llama, Architecture::qwen3}) {
    const Model model = make_random_model(tiny_config(arch), 17, WeightMode::w4, 0.08f);
    const DeviceModel device_model = DeviceModel::upload(model, false);
    CudaEngineOptions options;
    options.max_tokens = 32;
    options.decode_gemm = W4A16Options{W4A16Strategy::gemv, 0};
    CudaEngine fused(device_model, options);
    options.fuse_silu_into_down = false;
    CudaEngine separate(device_model, options);
    EXPECT_TRUE(fused.silu_fused_into_down());
    EXPECT_FALSE(separate.silu_fused_into_down());
    const std::vector<std::vector<uint16_t>> out[2] = {prompt_and_decode_bits(fused, 5),
                                                       prompt_and_decode_bits(separate, 5)};
    for (size_t step = 0; step < out[0].size(); ++step)
      EXPECT_EQ(out[0][step], out[1][step]) << architecture_name(arch) << " step " << step;
  }
}

// Single-row steps whose GEMMs run the gemv strategy do the residual add +
// RMSNorm inside the GEMMs on either side of it (fuse_norms_into_gemms), the
// last one inside the last down GEMM and a w4 lm_head. At every decode step
// the logits must agree with the same engine running the add + RMSNorm
// kernels (the fused norm sums in another order: rounding only) and, with
// the lm_head as the checkpoint has it (dense), with the CPU backend; the
// prompt (5 rows) runs the kernels in both engines. fp16 KV, so that the CPU
// and GPU caches hold the same values.
TEST(CudaEngine, NormsFusedIntoTheGemmsAgreeWithTheNormKernels) {
  LOWBIT_REQUIRE_GPU();
  for (Architecture arch : {Architecture::llama, Architecture::qwen3})
    for (bool w4_head : {false, true}) {
      SCOPED_TRACE(std::string(architecture_name(arch)) + (w4_head ? ", w4 lm_head" : ", dense lm_head"));
      const Model model = make_random_model(tiny_config(arch), 23, WeightMode::w4, 0.08f);
      // quantize_dense_to_w4: the only dense linear of this model is the lm_head.
      const DeviceModel device_model = DeviceModel::upload(model, w4_head);
      ASSERT_EQ(device_model.lm_head.w4.has_value(), w4_head);
      CudaEngineOptions options;
      options.max_tokens = 32;
      options.k_format = options.v_format = kv::KvFormat::fp16;
      options.decode_gemm = W4A16Options{W4A16Strategy::gemv, 0};
      CudaEngine fused(device_model, options);
      options.fuse_norms_into_gemms = false;
      CudaEngine separate(device_model, options);
      EXPECT_TRUE(fused.norms_fused_into_gemms());
      EXPECT_EQ(fused.final_norm_fused_into_lm_head(), w4_head);
      EXPECT_FALSE(separate.norms_fused_into_gemms());
      EXPECT_FALSE(separate.final_norm_fused_into_lm_head());
      CpuBackendOptions cpu_options;
      cpu_options.kv.k = cpu_options.kv.v = KvStorage::fp16;
      cpu_options.kv.max_tokens = 32;
      auto cpu = make_cpu_backend(model, cpu_options);
      const int cs = cpu->add_sequence();
      std::vector<std::vector<float>> out[2];
      CudaEngine* engines[2] = {&fused, &separate};
      for (int k = 0; k < 2; ++k)
        for (const std::vector<uint16_t>& bits : prompt_and_decode_bits(*engines[k], 6)) {
          std::vector<float> row(bits.size());
          for (size_t i = 0; i < bits.size(); ++i) row[i] = f16_to_float(f16::from_bits(bits[i]));
          out[k].push_back(row);
        }
      std::vector<int32_t> tokens = {3, 14, 15, 92, 65};
      for (size_t step = 0; step < out[0].size(); ++step) {
        std::vector<float> want;
        cpu->forward(std::vector<StepInput>{{cs, tokens}}, LogitsWanted::last, want);
        for (float v : out[0][step]) ASSERT_TRUE(std::isfinite(v)) << "step " << step;
        EXPECT_LE(max_rel_error(out[0][step], out[1][step]), test::kCudaEngineBatchRelError) << "step " << step;
        if (!w4_head) EXPECT_LE(max_rel_error(out[0][step], want), test::kCudaEngineLogitsRelError) << "step " << step;
        tokens = {static_cast<int32_t>(20 + 7 * step)};
      }
    }
}

// An engine that neither tunes nor names a strategy (lowbit generate's
// default) gets `auto` for its single-row GEMMs. On sm_90a that plans the
// gemv kernel, and the engine then names it, so the fusions apply as in a
// tuned engine: the logits are those of an engine given the gemv strategy,
// bit for bit (the same plans). Elsewhere `auto` plans another kernel and
// nothing is fused.
TEST(CudaEngine, UntunedSingleRowStepsTakeTheGemvFusionsWhereAutoPlansGemv) {
  LOWBIT_REQUIRE_GPU();
  const Model model = make_random_model(tiny_config(Architecture::qwen3), 29, WeightMode::w4, 0.08f);
  const DeviceModel device_model = DeviceModel::upload(model, true);
  CudaEngineOptions options;
  options.max_tokens = 32;
  options.rotation = kv::RotationKind::hadamard;
  CudaEngine untuned(device_model, options);
  const bool gemv = w4a16_plan(1, *device_model.layers.front().down.w4).strategy == W4A16Strategy::gemv;
  EXPECT_EQ(gemv, w4a16_wgmma_available());
  EXPECT_EQ(untuned.silu_fused_into_down(), gemv);
  EXPECT_EQ(untuned.norms_fused_into_gemms(), gemv);
  EXPECT_EQ(untuned.final_norm_fused_into_lm_head(), gemv);
  EXPECT_EQ(untuned.attention_inputs_fused_into_qkv(), gemv);
  EXPECT_EQ(untuned.query_rotation_fused_into_qkv(), gemv);
  if (!gemv) return;  // nothing fused, as checked above
  options.decode_gemm = W4A16Options{W4A16Strategy::gemv, 0};
  CudaEngine named(device_model, options);
  EXPECT_EQ(prompt_and_decode_bits(untuned, 5), prompt_and_decode_bits(named, 5));
}

// Single-row steps whose QKV GEMM runs the gemv strategy make the attention
// inputs in its epilogue (fuse_attention_inputs_into_qkv): the logits are
// the bits of the same engine with the separate kernel, at every step, for
// head dimensions 128 (one head per block of 128 columns) and 64 (two), with
// the norms fused or not.
TEST(CudaEngine, AttentionInputsFromTheQkvGemmGiveTheSameBits) {
  LOWBIT_REQUIRE_GPU();
  for (Architecture arch : {Architecture::llama, Architecture::qwen3})
    for (const int64_t head_dim : {128, 64})
      for (const bool norms : {true, false}) {
        SCOPED_TRACE(testing::Message() << architecture_name(arch) << " head_dim " << head_dim << " norms fused "
                                        << norms);
        const Model model = make_random_model(tiny_config(arch, head_dim), 29, WeightMode::w4, 0.08f);
        const DeviceModel device_model = DeviceModel::upload(model, false);
        CudaEngineOptions options;
        options.max_tokens = 32;
        options.decode_gemm = W4A16Options{W4A16Strategy::gemv, 0};
        options.fuse_norms_into_gemms = norms;
        CudaEngine fused(device_model, options);
        options.fuse_attention_inputs_into_qkv = false;
        CudaEngine separate(device_model, options);
        EXPECT_TRUE(fused.attention_inputs_fused_into_qkv());
        EXPECT_FALSE(separate.attention_inputs_fused_into_qkv());
        const std::vector<std::vector<uint16_t>> out[2] = {prompt_and_decode_bits(fused, 5),
                                                           prompt_and_decode_bits(separate, 5)};
        for (size_t step = 0; step < out[0].size(); ++step) EXPECT_EQ(out[0][step], out[1][step]) << "step " << step;
      }
}

// The fusion tests below: for llama and qwen3 at head dimensions 128 and 64
// and each K/V format pair, a tiny random w4 model on the device and engine
// options with a Hadamard cache, 16-token pages and gemv decode GEMMs,
// handed to check(arch, K format, V format, model, options).
template <typename Check>
void for_each_hadamard_case(std::span<const std::pair<kv::KvFormat, kv::KvFormat>> formats, uint64_t seed,
                            Check&& check) {
  for (Architecture arch : {Architecture::llama, Architecture::qwen3})
    for (const int64_t head_dim : {128, 64})
      for (const auto& [kf, vf] : formats) {
        SCOPED_TRACE(testing::Message() << architecture_name(arch) << " head_dim " << head_dim << " K/V "
                                        << kv::kv_format_name(kf) << "/" << kv::kv_format_name(vf));
        const Model model = make_random_model(tiny_config(arch, head_dim), seed, WeightMode::w4, 0.08f);
        const DeviceModel device_model = DeviceModel::upload(model, false);
        CudaEngineOptions options;
        options.max_tokens = 32;
        options.page_size = 16;
        options.k_format = kf;
        options.v_format = vf;
        options.rotation = kv::RotationKind::hadamard;
        options.decode_gemm = W4A16Options{W4A16Strategy::gemv, 0};
        check(arch, kf, vf, device_model, options);
      }
}

// The logits of the prompt and of 20 decode steps (replayed from CUDA graphs
// after the first; the rows cross a page boundary at 16 tokens) are the same
// bits in both engines.
void expect_same_decode_bits(CudaEngine& a, CudaEngine& b) {
  const std::vector<std::vector<uint16_t>> out[2] = {prompt_and_decode_bits(a, 20), prompt_and_decode_bits(b, 20)};
  for (size_t step = 0; step < out[0].size(); ++step) EXPECT_EQ(out[0][step], out[1][step]) << "step " << step;
}

// With a Hadamard cache, single-row steps whose QKV GEMM makes the attention
// inputs also rotate the queries there (fuse_query_rotation_into_qkv): the
// logits are the bits of the same engine whose attention rotates them
// itself, at every decode step (replayed from CUDA graphs after the first),
// for K/V formats with and without quantized parts, both head dimensions,
// with the norms fused or not. With a Haar cache the fusion does not apply.
TEST(CudaEngine, QueryRotationFromTheQkvGemmGivesTheSameBits) {
  LOWBIT_REQUIRE_GPU();
  const std::pair<kv::KvFormat, kv::KvFormat> formats[] = {{kv::KvFormat::tq4, kv::KvFormat::tq4},
                                                           {kv::KvFormat::tq3, kv::KvFormat::fp16},
                                                           {kv::KvFormat::fp16, kv::KvFormat::tq4}};
  for_each_hadamard_case(formats, 31, [](Architecture arch, kv::KvFormat kf, kv::KvFormat, const DeviceModel& model,
                                         CudaEngineOptions options) {
    options.fuse_norms_into_gemms = arch == Architecture::qwen3;
    CudaEngine fused(model, options);
    options.fuse_query_rotation_into_qkv = false;
    CudaEngine separate(model, options);
    const bool quantized_k = kf != kv::KvFormat::fp16;
    EXPECT_EQ(fused.query_rotation_fused_into_qkv(), quantized_k);
    EXPECT_FALSE(separate.query_rotation_fused_into_qkv());
    EXPECT_TRUE(separate.attention_inputs_fused_into_qkv());
    expect_same_decode_bits(fused, separate);
    if (quantized_k) {
      CudaEngineOptions haar = options;
      haar.rotation = kv::RotationKind::haar;
      haar.fuse_query_rotation_into_qkv = true;
      EXPECT_FALSE(CudaEngine(model, haar).query_rotation_fused_into_qkv());
    }
  });
}

// Decode steps append the K/V inside the attention kernel
// (fuse_kv_append_into_attention) when the cache allows a warp's append
// (Hadamard rotations, or fp16 K and V): the logits are the bits of the same
// engine with the append kernel, at every step (replayed from CUDA graphs
// after the first; the rows cross a page boundary at 16 tokens), for K/V
// formats with and without quantized parts, both head dimensions, with the
// query rotation in the QKV GEMM (qwen3) or in the attention (llama). With
// a Haar cache the fusion does not apply.
TEST(CudaEngine, KvAppendInsideTheAttentionGivesTheSameBits) {
  LOWBIT_REQUIRE_GPU();
  const std::pair<kv::KvFormat, kv::KvFormat> formats[] = {{kv::KvFormat::tq4, kv::KvFormat::tq4},
                                                           {kv::KvFormat::tq3, kv::KvFormat::fp16},
                                                           {kv::KvFormat::fp16, kv::KvFormat::tq2},
                                                           {kv::KvFormat::fp16, kv::KvFormat::fp16}};
  for_each_hadamard_case(formats, 37, [](Architecture arch, kv::KvFormat kf, kv::KvFormat vf, const DeviceModel& model,
                                         CudaEngineOptions options) {
    options.fuse_query_rotation_into_qkv = arch == Architecture::qwen3;
    CudaEngine fused(model, options);
    options.fuse_kv_append_into_attention = false;
    CudaEngine separate(model, options);
    EXPECT_TRUE(fused.kv_append_fused_into_attention());
    EXPECT_FALSE(separate.kv_append_fused_into_attention());
    expect_same_decode_bits(fused, separate);
    CudaEngineOptions haar = options;
    haar.rotation = kv::RotationKind::haar;
    haar.fuse_kv_append_into_attention = true;
    const bool quantized = kf != kv::KvFormat::fp16 || vf != kv::KvFormat::fp16;
    EXPECT_EQ(CudaEngine(model, haar).kv_append_fused_into_attention(), !quantized);
  });
}

// Decode steps replayed from a CUDA graph give the bits of eager steps: two
// engines on one model, graphs on and off, fed the same tokens (and a third,
// graphs on, whose every gemv GEMM lets the next kernel launch before its
// own wait: CudaEngineOptions::gemv_early_dependents_bytes = 0). The plan
// length is 16 tokens, so the rows cross several plan lengths (a new capture
// each time); a prefill of a third sequence between decode steps drops the
// graph (it may grow the buffers the graph points to), a released sequence
// changes the rows. Every step's logits must be equal bit for bit, and the
// graph engine must have replayed most decode steps.
TEST(CudaEngine, DecodeGraphsGiveTheBitsOfEagerSteps) {
  LOWBIT_REQUIRE_GPU();
  const Model model = make_random_model(tiny_config(Architecture::qwen3), 21, WeightMode::w4, 0.08f);
  const DeviceModel device_model = DeviceModel::upload(model, false);
  CudaEngineOptions options;
  options.max_tokens = 96;
  options.max_sequences = 3;
  options.page_size = 16;
  options.decode_plan_tokens = 16;
  options.decode_graphs = false;
  CudaEngine eager(device_model, options);
  options.decode_graphs = true;
  CudaEngine graphed(device_model, options);
  // And every gemv GEMM letting the next kernel launch before its wait (the
  // large models' way; this model's GEMMs are below the default threshold):
  // the same bits, or a kernel reads before its inputs are complete.
  options.gemv_early_dependents_bytes = 0;
  CudaEngine graphed_early(device_model, options);
  CudaEngine* engines[3] = {&eager, &graphed, &graphed_early};
  const int64_t vocab = model.config.vocab;
  auto logit_bits = [&](CudaEngine& e) {
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(e.stream()));
    const TensorView logits = e.logits();
    std::vector<uint16_t> bits(static_cast<size_t>(logits.numel()));
    Buffer::copy(bits.data(), Device::cpu, logits.data, Device::cuda, bits.size() * 2);
    return bits;
  };
  // One step on both engines: rows of (sequence, new tokens); returns the
  // eager engine's greedy token per row.
  auto step_both = [&](const std::vector<std::pair<int, std::vector<int32_t>>>& inputs, int step) {
    std::vector<uint16_t> bits[3];
    for (int k = 0; k < 3; ++k) {
      CudaEngine& e = *engines[k];
      std::vector<StepRow> rows;
      std::vector<int32_t> tokens;
      for (const auto& [seq, ids] : inputs) {
        const int64_t n = static_cast<int64_t>(ids.size());
        rows.push_back({seq, e.extend(seq, n), n});
        tokens.insert(tokens.end(), ids.begin(), ids.end());
      }
      e.step(rows, tokens, false);
      bits[k] = logit_bits(e);
    }
    EXPECT_EQ(bits[0], bits[1]) << "step " << step;
    EXPECT_EQ(bits[0], bits[2]) << "step " << step << " (early dependents)";
    std::vector<int32_t> next;
    for (size_t r = 0; r < inputs.size(); ++r) {
      int32_t best = 0;
      float best_v = -INFINITY;
      for (int64_t t = 0; t < vocab; ++t) {
        const float v = f16_to_float(f16::from_bits(bits[0][r * static_cast<size_t>(vocab) + static_cast<size_t>(t)]));
        if (v > best_v) best_v = v, best = static_cast<int32_t>(t);
      }
      next.push_back(best);
    }
    return next;
  };
  int a[3], b[3];
  for (int k = 0; k < 3; ++k) a[k] = engines[k]->add_sequence(), b[k] = engines[k]->add_sequence();
  ASSERT_EQ(a[0], a[1]);
  ASSERT_EQ(b[0], b[1]);
  ASSERT_EQ(a[0], a[2]);
  ASSERT_EQ(b[0], b[2]);
  std::vector<int32_t> next = step_both({{a[0], {3, 14, 15, 92, 65}}}, 0);
  std::vector<int32_t> next_b = step_both({{b[0], {7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9}}}, 1);
  int step = 2;
  for (; step < 30; ++step) {  // a at 5..33 tokens, b at 12..40: plan lengths 16, 32, 48
    const std::vector<int32_t> both = step_both({{a[0], {next[0]}}, {b[0], {next_b[0]}}}, step);
    next = {both[0]};
    next_b = {both[1]};
  }
  // A prefill between decode steps, then the three rows decode together.
  int c[3];
  for (int k = 0; k < 3; ++k) c[k] = engines[k]->add_sequence();
  std::vector<int32_t> next_c = step_both({{c[0], {11, 12, 13}}}, step++);
  for (int i = 0; i < 12; ++i, ++step) {
    const std::vector<int32_t> all = step_both({{a[0], {next[0]}}, {b[0], {next_b[0]}}, {c[0], {next_c[0]}}}, step);
    next = {all[0]};
    next_b = {all[1]};
    next_c = {all[2]};
  }
  // b released: the rows change again.
  for (int k = 0; k < 3; ++k) engines[k]->release_sequence(b[k]);
  for (int i = 0; i < 8; ++i, ++step) {
    const std::vector<int32_t> two = step_both({{a[0], {next[0]}}, {c[0], {next_c[0]}}}, step);
    next = {two[0]};
    next_c = {two[1]};
  }
  EXPECT_EQ(eager.graph_replays(), 0);
  EXPECT_TRUE(graphed.graph_failure().empty()) << graphed.graph_failure();
  // 48 decode steps; a new key (rows or plan length) costs one eager step
  // before the replays start: 7 keys here (a+b at plan lengths 16, 32, 48;
  // the three rows at 48 and 64; a+c at 48 and 64).
  EXPECT_EQ(graphed.graph_replays(), 48 - 7);
  EXPECT_TRUE(graphed_early.graph_failure().empty()) << graphed_early.graph_failure();
  EXPECT_EQ(graphed_early.graph_replays(), 48 - 7);
}

// `lowbit generate` warms the CUDA backend up before timing the prefill
// (engine::warm_up: a scratch sequence of 3 tokens, released): the same
// prompt then gives the same tokens as on a fresh backend, with the scratch
// sequence's pages reused.
TEST(CudaEngine, WarmUpLeavesTheBackendAsItWas) {
  LOWBIT_REQUIRE_GPU();
  const Model model = make_random_model(tiny_config(Architecture::qwen3, 64), 17, WeightMode::w4, 0.08f);
  KvOptions kv;
  kv.k = kv.v = KvStorage::tq4;
  kv.max_tokens = 40;
  kv.page_size = 16;
  const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2}};
  GenerateOptions g;
  g.max_tokens = 20;
  auto fresh = make_cuda_backend(model, kv);
  const GenerateResult want = generate(*fresh, prompts, g);
  auto warmed = make_cuda_backend(model, kv);
  warm_up(*warmed, 11);
  EXPECT_EQ(warmed->kv().bytes_used(), 0);
  const GenerateResult got = generate(*warmed, prompts, g);
  EXPECT_EQ(got.tokens, want.tokens);
}

TEST(CudaEngine, RejectsWhatItCannotRun) {
  LOWBIT_REQUIRE_GPU();
  ModelConfig c = tiny_config(Architecture::llama);
  c.head_dim = 96;
  const Model model = make_random_model(c, 1, WeightMode::dense, 0.08f);
  KvOptions kv;
  EXPECT_TRUE(test::throws_error([&] { (void)make_cuda_backend(model, kv, false); }, ErrorKind::unsupported,
                                 "head_dim"));
  const Model ok = make_random_model(tiny_config(Architecture::llama), 1, WeightMode::dense, 0.08f);
  // --device auto runs what the GPU's backend refuses on the CPU, and says why.
  std::string why_cpu;
  EXPECT_EQ(make_backend("auto", model, CpuBackendOptions{kv}, &why_cpu)->name().rfind("cpu", 0), 0u);
  EXPECT_NE(why_cpu.find("head_dim"), std::string::npos) << why_cpu;
  // An fp16 window of recent K/V (KvOptions::fp16_window) runs on the GPU.
  KvOptions windowed;
  windowed.k = windowed.v = KvStorage::tq4;
  windowed.fp16_window = 16;
  EXPECT_EQ(make_backend("auto", ok, CpuBackendOptions{windowed}, &why_cpu)->name(), "cuda");
  EXPECT_EQ(why_cpu, "");
  EXPECT_EQ(make_backend("auto", ok, CpuBackendOptions{kv}, &why_cpu)->name(), "cuda");
  EXPECT_EQ(why_cpu, "") << "a backend that ran on the GPU has nothing to explain";
  kv.max_tokens = 8;
  auto gpu = make_cuda_backend(ok, kv, false);
  // The weights as the device holds them: the model's f32 linears became
  // fp16, q/k/v and gate/up stacked (4 per layer, 2 layers, and the untied
  // output matrix), half the model's bytes.
  const Backend::WeightsInfo on_device = gpu->weights();
  EXPECT_EQ(on_device.formats, "9 x fp16, 1 x fp16 (embedding)");
  EXPECT_EQ(on_device.formats.find("f32"), std::string::npos) << on_device.formats;
  EXPECT_LT(on_device.bytes, static_cast<int64_t>(ok.weights.nbytes()));
  EXPECT_GT(on_device.bytes_per_step, 0);
  EXPECT_LE(on_device.bytes_per_step, on_device.bytes);
  const int s = gpu->add_sequence();
  std::vector<float> logits;
  const auto run = [&](int seq, std::vector<int32_t> tokens) {
    gpu->forward(std::vector<StepInput>{{seq, tokens}}, LogitsWanted::last, logits);
  };
  EXPECT_TRUE(test::throws_error([&] { run(s, {384}); }, ErrorKind::invalid_argument, "token id 384"));
  EXPECT_TRUE(test::throws_error([&] { run(s, std::vector<int32_t>(9, 1)); }, ErrorKind::invalid_argument,
                                 "would hold 9"));
  EXPECT_TRUE(test::throws_error([&] { run(s + 1, {1}); }, ErrorKind::invalid_argument, "unknown sequence"));
  // Nothing of the refused calls was kept: the sequence still takes 8 tokens.
  run(s, std::vector<int32_t>(8, 2));
  EXPECT_EQ(gpu->length(s), 8);
}

// A prompt of `prompt_len` tokens, then `steps` decode steps fed `tokens`:
// the greedy choices of this backend, recorded into it, where it is empty;
// else the tokens recorded by an earlier call (so every backend sees the
// same ones). The logits of every prompt token, then of each step.
std::vector<float> prompt_and_steps(Backend& backend, int prompt_len, int steps, std::vector<int32_t>& tokens) {
  const int vocab = static_cast<int>(backend.model().config.vocab);
  const bool record = tokens.empty();
  std::vector<int32_t> prompt;
  for (int i = 0; i < prompt_len; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 5) % vocab));
  const int s = backend.add_sequence();
  std::vector<float> all, logits;
  backend.forward(std::vector<StepInput>{{s, prompt}}, LogitsWanted::all, all);
  for (int step = 0; step < steps; ++step) {
    if (record) {
      const auto last = all.end() - vocab;
      tokens.push_back(static_cast<int32_t>(std::max_element(last, all.end()) - last));
    }
    const std::vector<int32_t> next = {tokens[static_cast<size_t>(step)]};
    backend.forward(std::vector<StepInput>{{s, next}}, LogitsWanted::last, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// KvOptions::fp16_window on the GPU (kv/device_window.h) against the CPU
// backend's window, with the tq bounds of PrefillAndDecodeLogitsAgree: a
// window of 8 under a 21-token prompt and 6 decode steps (most queries read
// codes and copies; the decode steps replay a CUDA graph), both rotations
// and head dimensions; and a 300-token prompt with a window of 16, which
// the GPU attends in pieces of kWindowPrefillBlock queries.
TEST(CudaEngine, Fp16WindowAgreesWithTheCpuBackend) {
  LOWBIT_REQUIRE_GPU();
  struct WindowCase {
    Architecture arch;
    int64_t head_dim;
    kv::RotationKind rotation;
    KvStorage k, v;
    int64_t window;
    int prompt;
  };
  const WindowCase cases[] = {
      {Architecture::qwen3, 128, kv::RotationKind::hadamard, KvStorage::tq4, KvStorage::tq4, 8, 21},
      {Architecture::llama, 64, kv::RotationKind::haar, KvStorage::tq4, KvStorage::tq4, 8, 21},
      {Architecture::qwen3, 64, kv::RotationKind::hadamard, KvStorage::fp16, KvStorage::tq3, 8, 21},
      {Architecture::qwen3, 128, kv::RotationKind::hadamard, KvStorage::tq4, KvStorage::tq4, 16, 300},
  };
  for (const WindowCase& wc : cases) {
    SCOPED_TRACE(std::string(architecture_name(wc.arch)) + " d" + std::to_string(wc.head_dim) + " window " +
                 std::to_string(wc.window) + " prompt " + std::to_string(wc.prompt));
    const Model model = make_random_model(tiny_config(wc.arch, wc.head_dim), 99, WeightMode::w4, 0.08f);
    CpuBackendOptions options;
    options.kv.k = wc.k;
    options.kv.v = wc.v;
    options.kv.max_tokens = 320;
    options.kv.page_size = 16;
    options.kv.rotation = wc.rotation;
    options.kv.fp16_window = wc.window;
    auto cpu = make_cpu_backend(model, options);
    auto gpu = make_cuda_backend(model, options.kv, false);
    std::vector<int32_t> tokens;
    const std::vector<float> want = prompt_and_steps(*cpu, wc.prompt, 6, tokens);
    const std::vector<float> got = prompt_and_steps(*gpu, wc.prompt, 6, tokens);
    ASSERT_EQ(got.size(), want.size());
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LE(max_rel_error(got, want), logits_tolerance(wc.v == KvStorage::tq3 ? KvStorage::tq3 : KvStorage::tq4));
    EXPECT_GT(gpu->kv().bytes_used(), 0);
    EXPECT_NE(gpu->kv().describe().find("newest " + std::to_string(wc.window) + " tokens also fp16"),
              std::string::npos)
        << gpu->kv().describe();
  }
}

// A window over every position of the sequence makes a tq4 cache an fp16
// one: the GPU's logits then agree with its fp16 K/V within the fp16 bound,
// and closer than the same tq4 cache without a window does (so the copies,
// not the codes, were read).
TEST(CudaEngine, Fp16WindowOverEveryPositionIsAnFp16Cache) {
  LOWBIT_REQUIRE_GPU();
  const Model model = make_random_model(tiny_config(Architecture::qwen3), 99, WeightMode::w4, 0.08f);
  KvOptions kv;
  kv.max_tokens = 64;
  kv.page_size = 16;
  kv.rotation = kv::RotationKind::hadamard;
  kv.k = kv.v = KvStorage::fp16;
  std::vector<int32_t> tokens;
  auto fp16 = make_cuda_backend(model, kv, false);
  const std::vector<float> want = prompt_and_steps(*fp16, 21, 6, tokens);
  kv.k = kv.v = KvStorage::tq4;
  auto plain = make_cuda_backend(model, kv, false);
  const double plain_error = max_rel_error(prompt_and_steps(*plain, 21, 6, tokens), want);
  kv.fp16_window = 64;
  auto windowed = make_cuda_backend(model, kv, false);
  const double windowed_error = max_rel_error(prompt_and_steps(*windowed, 21, 6, tokens), want);
  EXPECT_LE(windowed_error, test::kCudaEngineLogitsRelError);
  EXPECT_LT(windowed_error, plain_error);
  RecordProperty("tq4_vs_fp16", std::to_string(plain_error));
  RecordProperty("tq4_window_vs_fp16", std::to_string(windowed_error));
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineVsCpu,
                         ::testing::Values(Case{Architecture::llama, WeightMode::dense, KvStorage::fp16},
                                           Case{Architecture::qwen3, WeightMode::dense, KvStorage::fp16},
                                           Case{Architecture::llama, WeightMode::w4, KvStorage::fp16},
                                           Case{Architecture::qwen3, WeightMode::w4, KvStorage::tq4},
                                           Case{Architecture::llama, WeightMode::dense, KvStorage::tq3},
                                           Case{Architecture::llama, WeightMode::dense, KvStorage::fp16, 64},
                                           Case{Architecture::llama, WeightMode::w4, KvStorage::tq4, 64},
                                           Case{Architecture::qwen3, WeightMode::w4, KvStorage::tq3, 64},
                                           Case{Architecture::qwen3, WeightMode::w4, KvStorage::tq4, 128,
                                                kv::RotationKind::hadamard},
                                           Case{Architecture::llama, WeightMode::dense, KvStorage::tq3, 64,
                                                kv::RotationKind::hadamard}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

}  // namespace
}  // namespace lowbit::engine
