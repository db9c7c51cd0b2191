// The engine's KV stores: the pooled paged-TurboQuant attention against the
// kv module's reference kernels on the same cache, and the dense store against
// the kv module's double-precision dense attention.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "engine_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/kv_store.h"
#include "lowbit/kv/attention_ref.h"
#include "tolerances.h"

namespace lowbit::test {
namespace {

using engine::KvStorage;

engine::ModelConfig small_config() {
  engine::ModelConfig c;
  c.hidden = 64;
  c.intermediate = 64;
  c.num_layers = 2;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.vocab = 16;
  return c;
}

std::vector<float> randn(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Fills both stores with the same K/V (a 30-token prefill, then 9 single
// tokens) and returns the attention outputs of every position of layer 1.
std::vector<float> attend_all(engine::KvStore& store, const engine::ModelConfig& c, uint64_t seed,
                              std::vector<float>* k_all = nullptr, std::vector<float>* v_all = nullptr,
                              std::vector<float>* q_all = nullptr) {
  std::mt19937_64 rng(seed);
  const int seq = store.add_sequence();
  const int64_t kvd = c.kv_dim(), qd = c.q_dim();
  std::vector<float> outs;
  int64_t written = 0;
  for (const int64_t n : {30, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    const int64_t first = store.extend(seq, n);
    for (int layer = 0; layer < 2; ++layer) {
      const std::vector<float> k = randn(static_cast<size_t>(n * kvd), rng), v = randn(static_cast<size_t>(n * kvd), rng);
      store.write(layer, seq, first, n, k, v);
      if (layer == 1 && k_all) {
        k_all->insert(k_all->end(), k.begin(), k.end());
        v_all->insert(v_all->end(), v.begin(), v.end());
      }
    }
    const std::vector<float> q = randn(static_cast<size_t>(n * qd), rng);
    if (q_all) q_all->insert(q_all->end(), q.begin(), q.end());
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    engine::ThreadPool pool(2);
    store.attend(1, seq, first, n, q, out, &pool);
    outs.insert(outs.end(), out.begin(), out.end());
    written += n;
  }
  EXPECT_EQ(store.length(seq), written);
  return outs;
}

class PagedAttention : public ::testing::TestWithParam<std::pair<KvStorage, KvStorage>> {};

TEST_P(PagedAttention, PooledLoopMatchesTheKvModuleReference) {
  const engine::ModelConfig c = small_config();
  engine::KvOptions o;
  o.k = GetParam().first;
  o.v = GetParam().second;
  o.page_size = 16;
  o.max_tokens = 64;
  auto fast = engine::make_kv_store(c, o);
  o.reference_attention = true;
  auto ref = engine::make_kv_store(c, o);
  const std::vector<float> a = attend_all(*fast, c, 9), b = attend_all(*ref, c, 9);
  // Same arithmetic up to fp32 summation order (the reference uses an online
  // softmax): well inside the batch bound.
  EXPECT_LE(max_relative_error(a, b), kEngineBatchMaxRelError) << o.describe();
  EXPECT_GT(fast->bytes_used(), 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, PagedAttention,
                         ::testing::Values(std::pair{KvStorage::tq4, KvStorage::tq4}, std::pair{KvStorage::tq3, KvStorage::tq4},
                                           std::pair{KvStorage::tq4, KvStorage::fp16},
                                           std::pair{KvStorage::fp16, KvStorage::tq2}),
                         [](const auto& param_info) {
                           return std::string("K") + engine::kv_storage_name(param_info.param.first) + "_V" +
                                  engine::kv_storage_name(param_info.param.second);
                         });

TEST(DenseAttention, Fp32StoreMatchesTheDoubleDenseReference) {
  const engine::ModelConfig c = small_config();
  engine::KvOptions o;
  o.k = o.v = KvStorage::fp32;
  o.max_tokens = 64;
  auto store = engine::make_kv_store(c, o);
  std::vector<float> k, v, q;
  const std::vector<float> ours = attend_all(*store, c, 3, &k, &v, &q);
  // Position by position: queries of the prefill chunk, then single tokens.
  const int64_t kvd = c.kv_dim(), qd = c.q_dim();
  const int64_t total = static_cast<int64_t>(k.size()) / kvd;
  std::vector<float> ref(ours.size());
  std::vector<float> out(static_cast<size_t>(30 * qd));
  kv::dense_attention_ref(std::span<const float>(q).subspan(0, static_cast<size_t>(30 * qd)),
                          std::span<const float>(k).subspan(0, static_cast<size_t>(30 * kvd)),
                          std::span<const float>(v).subspan(0, static_cast<size_t>(30 * kvd)), 30, 30,
                          static_cast<int>(c.num_heads), static_cast<int>(c.num_kv_heads), static_cast<int>(c.head_dim), out);
  std::copy(out.begin(), out.end(), ref.begin());
  for (int64_t p = 30; p < total; ++p) {
    std::vector<float> o1(static_cast<size_t>(qd));
    kv::dense_attention_ref(std::span<const float>(q).subspan(static_cast<size_t>(p * qd), static_cast<size_t>(qd)),
                            std::span<const float>(k).subspan(0, static_cast<size_t>((p + 1) * kvd)),
                            std::span<const float>(v).subspan(0, static_cast<size_t>((p + 1) * kvd)), 1, p + 1,
                            static_cast<int>(c.num_heads), static_cast<int>(c.num_kv_heads), static_cast<int>(c.head_dim), o1);
    std::copy(o1.begin(), o1.end(), ref.begin() + p * qd);
  }
  EXPECT_LE(max_relative_error(ours, ref), kEngineBatchMaxRelError);
}

TEST(KvOptions, RejectsFp32MixedWithOtherFormats) {
  engine::KvOptions o;
  o.k = KvStorage::fp32;
  o.v = KvStorage::fp16;
  EXPECT_THROW(o.validate(), Error);
}

}  // namespace
}  // namespace lowbit::test
