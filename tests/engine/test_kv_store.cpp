// The engine's KV stores: the pooled paged-TurboQuant attention against the
// kv module's reference kernels on the same cache, and the dense store against
// the kv module's double-precision dense attention.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "engine_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/kv_store.h"
#include "lowbit/core/half.h"
#include "lowbit/kv/attention_ref.h"
#include "lowbit/kv/paged_cache.h"
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

// A store's options as the tests below use them: room for attend_all's 39
// tokens, 16-token pages (when K or V is tq: both fp16 or fp32 make a dense
// store).
engine::KvOptions store_options(KvStorage k, KvStorage v, int64_t fp16_window = 0) {
  engine::KvOptions o;
  o.k = k;
  o.v = v;
  o.page_size = 16;
  o.max_tokens = 64;
  o.fp16_window = fp16_window;
  return o;
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
  engine::KvOptions o = store_options(GetParam().first, GetParam().second);
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
  auto store = engine::make_kv_store(c, store_options(KvStorage::fp32, KvStorage::fp32));  // both fp32: dense
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

// KvOptions::fp16_window with the window over every position: the paged
// store reads nothing from its codes and gives the dense fp16 store's
// outputs (the same fp32 operations but for the final scaling).
TEST(PagedAttentionFp16Window, WholeSequenceInTheWindowGivesTheFp16Store) {
  const engine::ModelConfig c = small_config();
  auto dense = engine::make_kv_store(c, store_options(KvStorage::fp16, KvStorage::fp16));  // both fp16: dense
  const std::vector<float> want = attend_all(*dense, c, 21);
  for (const auto& [k, v] : {std::pair{KvStorage::tq4, KvStorage::tq4}, std::pair{KvStorage::tq3, KvStorage::fp16},
                             std::pair{KvStorage::fp16, KvStorage::tq2}}) {
    const engine::KvOptions w = store_options(k, v, 40);  // attend_all writes 39 tokens
    auto windowed = engine::make_kv_store(c, w);
    EXPECT_LE(max_relative_error(attend_all(*windowed, c, 21), want), kEngineBatchMaxRelError) << w.describe();
  }
}

// A window of 8 over a 30-token prompt and 9 decode steps: the query at
// position p reads positions p - 7 .. p as fp16 and the older ones as their
// codes decode (read_original of a cache given the same writes).
TEST(PagedAttentionFp16Window, OlderPositionsComeFromTheirCodes) {
  const engine::ModelConfig c = small_config();
  constexpr int64_t kWindow = 8;
  for (const auto& [kf, vf] : {std::pair{KvStorage::tq4, KvStorage::tq4}, std::pair{KvStorage::tq3, KvStorage::fp16}}) {
    const engine::KvOptions o = store_options(kf, vf, kWindow);
    auto store = engine::make_kv_store(c, o);
    std::vector<float> k, v, q;
    const std::vector<float> ours = attend_all(*store, c, 5, &k, &v, &q);

    // The same layer-1 K/V quantized by a cache of the store's configuration.
    kv::KvCacheConfig cc;
    cc.num_layers = 2;
    cc.num_kv_heads = static_cast<int>(c.num_kv_heads);
    cc.head_dim = static_cast<int>(c.head_dim);
    cc.page_size = 16;
    cc.num_pages = 4;
    cc.k_format = kf == KvStorage::fp16 ? kv::KvFormat::fp16 : kf == KvStorage::tq4 ? kv::KvFormat::tq4 : kv::KvFormat::tq3;
    cc.v_format = vf == KvStorage::fp16 ? kv::KvFormat::fp16 : kv::KvFormat::tq4;
    cc.rotation = engine::kv_rotation_for(std::nullopt, c.head_dim);
    cc.rotation_seed_base = o.rotation_seed;
    kv::PagedKvCache cache(cc);
    const int seq = cache.add_sequence();
    const int64_t kvd = c.kv_dim(), qd = c.q_dim(), D = c.head_dim, total = static_cast<int64_t>(k.size()) / kvd;
    cache.extend(seq, total);
    cache.write(1, seq, 0, total, k, v);

    std::vector<float> want(ours.size());
    for (int64_t p = 0; p < total; ++p) {
      std::vector<float> ke(static_cast<size_t>((p + 1) * kvd)), ve(ke.size());
      for (int64_t t = 0; t <= p; ++t)
        for (int64_t h = 0; h < c.num_kv_heads; ++h) {
          const auto at = static_cast<size_t>(t * kvd + h * D);
          if (t > p - kWindow) {  // fp16 copies of the originals
            for (int64_t j = 0; j < D; ++j) {
              ke[at + static_cast<size_t>(j)] = f16_to_float(float_to_f16(k[at + static_cast<size_t>(j)]));
              ve[at + static_cast<size_t>(j)] = f16_to_float(float_to_f16(v[at + static_cast<size_t>(j)]));
            }
          } else {
            cache.read_original(kv::KvPart::key, 1, seq, t, static_cast<int>(h), {ke.data() + at, static_cast<size_t>(D)});
            cache.read_original(kv::KvPart::value, 1, seq, t, static_cast<int>(h), {ve.data() + at, static_cast<size_t>(D)});
          }
        }
      kv::dense_attention_ref(std::span<const float>(q).subspan(static_cast<size_t>(p * qd), static_cast<size_t>(qd)), ke,
                              ve, 1, p + 1, static_cast<int>(c.num_heads), static_cast<int>(c.num_kv_heads),
                              static_cast<int>(D), std::span<float>(want).subspan(static_cast<size_t>(p * qd), static_cast<size_t>(qd)));
    }
    EXPECT_LE(max_relative_error(ours, want), kAttentionVsDequantizedRtol) << o.describe();
  }
}

TEST(PagedAttentionFp16Window, CountsItsBytesAndNamesItself) {
  const engine::ModelConfig c = small_config();
  engine::KvOptions o = store_options(KvStorage::tq4, KvStorage::tq4);
  auto plain = engine::make_kv_store(c, o);
  o.fp16_window = 8;
  auto windowed = engine::make_kv_store(c, o);
  attend_all(*plain, c, 2);
  attend_all(*windowed, c, 2);
  // K and V in fp16 of the positions the next query can read: 8 after the
  // last write (layer 0, never attended here), 7 after the last attend
  // (layer 1: the next query reads its own from its write).
  EXPECT_EQ(windowed->bytes_used() - plain->bytes_used(), (8 + 7) * c.kv_dim() * 2 * 2);
  EXPECT_EQ(windowed->bytes_per_token(), plain->bytes_per_token());
  EXPECT_NE(windowed->describe().find("newest 8 tokens also fp16"), std::string::npos) << windowed->describe();
  o.k = o.v = KvStorage::fp16;  // both dense: the window changes nothing
  EXPECT_FALSE(o.has_fp16_window());
  EXPECT_EQ(o.describe(), "K fp16, V fp16");
}

TEST(PagedAttentionFp16Window, PositionsOutOfOrderAreRefused) {
  const engine::ModelConfig c = small_config();
  auto store = engine::make_kv_store(c, store_options(KvStorage::tq4, KvStorage::tq4, 4));
  const int seq = store->add_sequence();
  std::mt19937_64 rng(1);
  const auto kv_rows = [&](int64_t n) { return randn(static_cast<size_t>(n * c.kv_dim()), rng); };
  store->extend(seq, 11);
  const std::vector<float> k10 = kv_rows(10), v10 = kv_rows(10), k1 = kv_rows(1), v1 = kv_rows(1);
  store->write(0, seq, 0, 10, k10, v10);
  store->write(0, seq, 10, 1, k1, v1);  // the window now holds 7..10
  std::vector<float> q(static_cast<size_t>(c.q_dim())), out(q.size());
  EXPECT_NO_THROW(store->attend(0, seq, 10, 1, q, out, nullptr));
  EXPECT_THROW(store->attend(0, seq, 2, 1, q, out, nullptr), Error);   // its window (0..2) is gone
  EXPECT_THROW(store->write(0, seq, 2, 1, k1, v1), Error);             // so is the room to rewrite it
}

TEST(KvOptions, RejectsABadFp16Window) {
  engine::KvOptions o;
  o.k = o.v = KvStorage::tq4;
  o.fp16_window = -1;
  EXPECT_THROW(o.validate(), Error);
  o.fp16_window = 16;
  o.reference_attention = true;
  EXPECT_THROW(o.validate(), Error);
  o.reference_attention = false;
  EXPECT_NO_THROW(o.validate());
}

TEST(KvOptions, RejectsFp32MixedWithOtherFormats) {
  engine::KvOptions o;
  o.k = KvStorage::fp32;
  o.v = KvStorage::fp16;
  EXPECT_THROW(o.validate(), Error);
}

}  // namespace
}  // namespace lowbit::test
