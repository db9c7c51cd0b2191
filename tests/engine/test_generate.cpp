// engine::generate and engine::warm_up on the CPU backend and a golden model
// (tests/cuda/test_cuda_engine.cu runs the same warm-up check on the GPU).
#include <gtest/gtest.h>

#include <vector>

#include "engine_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/generate.h"
#include "lowbit/engine/weights.h"

namespace lowbit::test {
namespace {

// The warm-up's scratch sequence is gone afterwards and leaves nothing
// behind: the same prompt generates the same tokens as on a fresh backend,
// with the cache as full as it would be without the warm-up.
TEST(Generate, WarmUpLeavesTheBackendAsItWas) {
  const engine::Model model = engine::load_model(golden_dir("llama_d64"));
  engine::CpuBackendOptions o;
  o.kv.k = o.kv.v = engine::KvStorage::tq4;
  o.kv.max_tokens = 24;
  o.kv.max_sequences = 1;
  const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}};
  engine::GenerateOptions g;
  g.max_tokens = 12;
  auto fresh = engine::make_cpu_backend(model, o);
  const engine::GenerateResult want = engine::generate(*fresh, prompts, g);
  auto warmed = engine::make_cpu_backend(model, o);
  engine::warm_up(*warmed, 7);
  EXPECT_EQ(warmed->kv().bytes_used(), 0);
  const engine::GenerateResult got = engine::generate(*warmed, prompts, g);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.kv_tokens, want.kv_tokens);
  // One sequence of 3 tokens must fit: with room for 2 the warm-up is refused, and no sequence is left.
  o.kv.max_tokens = 2;
  auto small = engine::make_cpu_backend(model, o);
  EXPECT_THROW(engine::warm_up(*small, 7), Error);
  EXPECT_NO_THROW((void)small->add_sequence());
}

}  // namespace
}  // namespace lowbit::test
