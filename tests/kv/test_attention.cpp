// Attention on the paged quantized cache: exactness of the rotated-domain
// computation (against dense attention on the dequantized K/V), split-KV
// merge, causal (chunked) prefill, page boundaries and mixed batches, and the
// quality against dense attention on the original K/V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "error_matchers.h"
#include "kv_test_util.h"
#include "lowbit/kv/attention_ref.h"
#include "tolerances.h"

namespace lowbit::kv {
namespace {

using kvtest::DataKind;
using lowbit::test::throws_error;

struct Geometry {
  int num_q_heads, num_kv_heads, head_dim, page_size;
};
constexpr Geometry kQwen3_14B{40, 8, 128, 16};  // attention geometry of Qwen3-14B, small pages
constexpr Geometry kSmall{8, 2, 64, 16};

// The batch of tests/kv/kv_test_util.h, grown 13 tokens at a time, and the
// dequantized view of its cache.
struct Batch : kvtest::InterleavedBatch {
  Batch(const KvCacheConfig& config, const std::vector<int64_t>& lens, DataKind kind, uint64_t seed)
      : InterleavedBatch(config, lens, kind, seed, 13) {}

  // The dequantized (original-domain) K or V of sequence b.
  std::vector<float> dequantized(KvPart part, int layer, size_t b) const {
    const int H = cache.config().num_kv_heads, d = cache.config().head_dim;
    std::vector<float> out(static_cast<size_t>(lengths[b]) * H * d);
    for (int64_t t = 0; t < lengths[b]; ++t)
      for (int h = 0; h < H; ++h)
        cache.read_original(part, layer, seqs[b], t, h,
                            {out.data() + (static_cast<size_t>(t) * H + h) * d, static_cast<size_t>(d)});
    return out;
  }
};

KvCacheConfig config_for(const Geometry& g, KvFormat k, KvFormat v, int64_t pages,
                         RotationKind rotation = RotationKind::haar) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = g.num_kv_heads;
  c.head_dim = g.head_dim;
  c.page_size = g.page_size;
  c.num_pages = pages;
  c.k_format = k;
  c.v_format = v;
  c.rotation = rotation;
  return c;
}

// Decode on the cache vs dense attention per sequence on (k, v) given by `kv_of`.
template <typename KvOf>
std::vector<float> dense_decode(const Batch& batch, int num_q_heads, const std::vector<float>& q,
                                KvOf kv_of) {
  const int H = batch.cache.config().num_kv_heads, d = batch.cache.config().head_dim;
  const size_t row = static_cast<size_t>(num_q_heads) * d;
  std::vector<float> out(q.size());
  for (size_t b = 0; b < batch.seqs.size(); ++b) {
    const auto [k, v] = kv_of(b);
    dense_attention_ref({q.data() + b * row, row}, k, v, 1, batch.lengths[b], num_q_heads, H, d,
                        {out.data() + b * row, row});
  }
  return out;
}

TEST(PagedDecode, RotatedDomainEqualsDenseAttentionOnDequantizedKv) {
  // Keys never un-rotated, values un-rotated once: the same result as
  // attending to the dequantized vectors, for every format pair, both
  // rotations, and lengths around page boundaries (P = 16).
  const std::vector<int64_t> lens = {1, 15, 16, 17, 33, 70};
  const std::vector<std::pair<KvFormat, KvFormat>> formats = {{KvFormat::tq4, KvFormat::tq4},
                                                              {KvFormat::tq3, KvFormat::tq2},
                                                              {KvFormat::fp16, KvFormat::tq4},
                                                              {KvFormat::tq4, KvFormat::fp16},
                                                              {KvFormat::fp16, KvFormat::fp16}};
  for (RotationKind rotation : {RotationKind::haar, RotationKind::hadamard})
    for (const auto& [kf, vf] : formats) {
      SCOPED_TRACE(std::string(rotation_kind_name(rotation)) + " K " + kv_format_name(kf) + " V " +
                   kv_format_name(vf));
      const Batch batch(config_for(kSmall, kf, vf, 40, rotation), lens, DataKind::outliers, 100);
      const auto q = kvtest::random_rows(static_cast<int64_t>(lens.size()), kSmall.num_q_heads,
                                         kSmall.head_dim, 7, DataKind::gaussian, false);
      for (int layer : {0, 1}) {
        std::vector<float> out(q.size());
        paged_decode_attention_ref(batch.cache, layer, batch.seqs, kSmall.num_q_heads, q, out);
        const auto expected = dense_decode(batch, kSmall.num_q_heads, q, [&](size_t b) {
          return std::pair{batch.dequantized(KvPart::key, layer, b),
                           batch.dequantized(KvPart::value, layer, b)};
        });
        EXPECT_LE(kvtest::max_relative_error(out, expected), test::kAttentionVsDequantizedRtol)
            << "layer " << layer;
      }
    }
}

TEST(PagedDecode, ManySequencesOfMixedLengthWithReusedPages) {
  const Geometry g = kQwen3_14B;
  std::vector<int64_t> lens;
  for (int i = 0; i < 12; ++i) lens.push_back(1 + (i * 37) % 150);
  Batch batch(config_for(g, KvFormat::tq4, KvFormat::tq4, 160), lens, DataKind::gaussian, 300);
  // Release two sequences and grow a new one into their pages.
  batch.cache.release_sequence(batch.seqs[3]);
  batch.cache.release_sequence(batch.seqs[7]);
  const int fresh = batch.cache.add_sequence();
  const int64_t n = 90;
  batch.cache.extend(fresh, n);
  const auto k = kvtest::random_rows(n, g.num_kv_heads, g.head_dim, 900, DataKind::gaussian, true);
  const auto v = kvtest::random_rows(n, g.num_kv_heads, g.head_dim, 901, DataKind::gaussian, false);
  batch.cache.write(0, fresh, 0, n, k, v);
  batch.seqs[3] = fresh;
  batch.lengths[3] = n;
  batch.seqs.erase(batch.seqs.begin() + 7);
  batch.lengths.erase(batch.lengths.begin() + 7);
  const auto q = kvtest::random_rows(static_cast<int64_t>(batch.seqs.size()), g.num_q_heads, g.head_dim, 5,
                                     DataKind::gaussian, false);
  std::vector<float> out(q.size());
  paged_decode_attention_ref(batch.cache, 0, batch.seqs, g.num_q_heads, q, out);
  const auto expected = dense_decode(batch, g.num_q_heads, q, [&](size_t b) {
    return std::pair{batch.dequantized(KvPart::key, 0, b), batch.dequantized(KvPart::value, 0, b)};
  });
  EXPECT_LE(kvtest::max_relative_error(out, expected), test::kAttentionVsDequantizedRtol);
}

TEST(PagedDecode, SplitKvMergeEqualsUnsplit) {
  const std::vector<int64_t> lens = {1, 16, 17, 100, 301};
  const Batch batch(config_for(kQwen3_14B, KvFormat::tq4, KvFormat::tq4, 40), lens, DataKind::outliers, 500);
  const auto q = kvtest::random_rows(5, 40, 128, 9, DataKind::gaussian, false);
  std::vector<float> unsplit(q.size()), split(q.size());
  paged_decode_attention_ref(batch.cache, 1, batch.seqs, 40, q, unsplit);
  for (int64_t chunk : {1, 15, 16, 17, 64, 300, 1000}) {
    paged_decode_attention_ref(batch.cache, 1, batch.seqs, 40, q, split, {0.0f, chunk});
    EXPECT_LE(kvtest::max_relative_error(split, unsplit), test::kSplitMergeRtol) << "split_tokens " << chunk;
  }
  // The partials: one chunk per 64 tokens, empty chunks of short sequences marked -inf.
  const DecodePartials p = paged_decode_partials_ref(batch.cache, 1, batch.seqs, 40, q, {0.0f, 64});
  EXPECT_EQ(p.max_splits, 5);  // ceil(301 / 64)
  EXPECT_EQ(p.split_tokens, 64);
  EXPECT_TRUE(p.value_rotated);
  for (int b = 0; b < 5; ++b)
    for (int s = 0; s < 5; ++s) {
      const float lse = p.lse[(static_cast<size_t>(b) * 40 + 17) * 5 + s];
      EXPECT_EQ(std::isinf(lse), s * 64 >= lens[static_cast<size_t>(b)]) << b << "," << s;
    }
  const DecodePartials whole = paged_decode_partials_ref(batch.cache, 1, batch.seqs, 40, q);
  EXPECT_EQ(whole.max_splits, 1);
  EXPECT_EQ(whole.split_tokens, 301);
}

TEST(PagedPrefill, CausalChunksEqualDenseAttentionOnDequantizedKv) {
  // A 100-token prompt written and attended in chunks of 37, 47 and 16
  // (chunked prefill): each chunk attends causally to everything before it.
  for (const auto& [kf, vf] : std::vector<std::pair<KvFormat, KvFormat>>{{KvFormat::tq4, KvFormat::tq4},
                                                                         {KvFormat::fp16, KvFormat::tq3}}) {
    const Geometry g = kQwen3_14B;
    PagedKvCache cache(config_for(g, kf, vf, 10));
    const int s = cache.add_sequence();
    const int64_t total = 100;
    const auto k = kvtest::random_rows(total, g.num_kv_heads, g.head_dim, 11, DataKind::outliers, true);
    const auto v = kvtest::random_rows(total, g.num_kv_heads, g.head_dim, 12, DataKind::outliers, false);
    const auto q = kvtest::random_rows(total, g.num_q_heads, g.head_dim, 13, DataKind::gaussian, false);
    const size_t kv_row = static_cast<size_t>(g.num_kv_heads) * g.head_dim,
                 q_row = static_cast<size_t>(g.num_q_heads) * g.head_dim;
    std::vector<float> out(q.size());
    int64_t first = 0;
    for (int64_t chunk : {37, 47, 16}) {
      EXPECT_EQ(cache.extend(s, chunk), first);
      cache.write(0, s, first, chunk, {k.data() + first * kv_row, chunk * kv_row},
                  {v.data() + first * kv_row, chunk * kv_row});
      paged_prefill_attention_ref(cache, 0, s, first, chunk, g.num_q_heads,
                                  {q.data() + first * q_row, chunk * q_row},
                                  {out.data() + first * q_row, chunk * q_row});
      first += chunk;
    }
    // Dense oracle on the dequantized K/V of the whole prompt, causal.
    std::vector<float> kd(k.size()), vd(v.size()), expected(q.size());
    for (int64_t t = 0; t < total; ++t)
      for (int h = 0; h < g.num_kv_heads; ++h) {
        const size_t at = static_cast<size_t>(t) * kv_row + static_cast<size_t>(h) * g.head_dim;
        cache.read_original(KvPart::key, 0, s, t, h, {kd.data() + at, 128});
        cache.read_original(KvPart::value, 0, s, t, h, {vd.data() + at, 128});
      }
    dense_attention_ref(q, kd, vd, total, total, g.num_q_heads, g.num_kv_heads, g.head_dim, expected);
    EXPECT_LE(kvtest::max_relative_error(out, expected), test::kAttentionVsDequantizedRtol)
        << kv_format_name(kf);
    // The prompt's last token attended by decode gives the prefill's last row.
    std::vector<float> last(q_row);
    const int seqs[] = {s};
    paged_decode_attention_ref(cache, 0, seqs, g.num_q_heads, {q.data() + (total - 1) * q_row, q_row}, last);
    EXPECT_LE(kvtest::max_relative_error(last, {out.data() + (total - 1) * q_row, q_row}),
              test::kSplitMergeRtol);
    // And prefill quality against the original K/V.
    std::vector<float> original(q.size());
    dense_attention_ref(q, k, v, total, total, g.num_q_heads, g.num_kv_heads, g.head_dim, original);
    double mean = 0;
    for (int64_t i = 0; i < total * g.num_q_heads; ++i)
      mean += kvtest::cosine({out.data() + i * 128, 128}, {original.data() + i * 128, 128});
    EXPECT_GE(mean / static_cast<double>(total * g.num_q_heads), test::kAttentionCosMeanTq4Outliers);
  }
}

struct CosineStats {
  double mean = 0, min = 1;
};

// Per (sequence, query head) cosine of decode on the cache vs dense attention
// on the original K/V, Qwen3-14B geometry, a batch of mixed lengths.
CosineStats decode_quality(KvFormat kf, KvFormat vf, DataKind kind,
                           RotationKind rotation = RotationKind::haar) {
  const std::vector<int64_t> lens = {37, 200, 513, 1000};
  const Batch batch(config_for(kQwen3_14B, kf, vf, 120, rotation), lens, kind, 7000);
  const int Hq = kQwen3_14B.num_q_heads;
  const auto q = kvtest::random_rows(4, Hq, 128, 77, DataKind::gaussian, false);
  std::vector<float> out(q.size());
  paged_decode_attention_ref(batch.cache, 0, batch.seqs, Hq, q, out, {0.0f, 256});
  const auto expected = dense_decode(batch, Hq, q, [&](size_t b) {
    return std::pair{batch.k[b], batch.v[b]};
  });
  CosineStats s;
  for (size_t r = 0; r < 4 * static_cast<size_t>(Hq); ++r) {
    const double c = kvtest::cosine({out.data() + r * 128, 128}, {expected.data() + r * 128, 128});
    s.mean += c;
    s.min = std::min(s.min, c);
  }
  s.mean /= 4.0 * Hq;
  return s;
}

TEST(AttentionQuality, Tq4OnRandomData) {
  for (RotationKind rotation : {RotationKind::haar, RotationKind::hadamard}) {
    const CosineStats s = decode_quality(KvFormat::tq4, KvFormat::tq4, DataKind::gaussian, rotation);
    EXPECT_GE(s.mean, test::kAttentionCosMeanTq4) << rotation_kind_name(rotation);
    EXPECT_GE(s.min, test::kAttentionCosMinTq4) << rotation_kind_name(rotation);
  }
  const CosineStats v_only = decode_quality(KvFormat::fp16, KvFormat::tq4, DataKind::gaussian);
  EXPECT_GE(v_only.mean, test::kAttentionCosMeanFp16KTq4V);
  EXPECT_GE(v_only.min, test::kAttentionCosMinFp16KTq4V);
}

TEST(AttentionQuality, Tq4OnDataWithOutlierChannels) {
  const CosineStats s = decode_quality(KvFormat::tq4, KvFormat::tq4, DataKind::outliers);
  EXPECT_GE(s.mean, test::kAttentionCosMeanTq4Outliers);
  EXPECT_GE(s.min, test::kAttentionCosMinTq4Outliers);
  const CosineStats v_only = decode_quality(KvFormat::fp16, KvFormat::tq4, DataKind::outliers);
  EXPECT_GE(v_only.mean, test::kAttentionCosMeanFp16KTq4V);
  EXPECT_GE(v_only.min, test::kAttentionCosMinFp16KTq4V);
}

TEST(AttentionQuality, MoreBitsAreBetter) {
  const double tq4 = decode_quality(KvFormat::tq4, KvFormat::tq4, DataKind::gaussian).mean;
  const double tq3 = decode_quality(KvFormat::tq3, KvFormat::tq3, DataKind::gaussian).mean;
  const double tq2 = decode_quality(KvFormat::tq2, KvFormat::tq2, DataKind::gaussian).mean;
  EXPECT_GT(tq4, tq3);
  EXPECT_GT(tq3, tq2);
  // Each bit roughly quarters the error 1 - cos (Lloyd-Max: 0.117, 0.035, 0.0095).
  EXPECT_LT(1.0 - tq4, 0.5 * (1.0 - tq3));
  EXPECT_LT(1.0 - tq3, 0.5 * (1.0 - tq2));
}

TEST(Attention, ErrorsNameTheArgument) {
  Batch batch(config_for(kSmall, KvFormat::tq4, KvFormat::tq4, 8), {5}, DataKind::gaussian, 1);
  PagedKvCache& cache = batch.cache;
  std::vector<float> q(8 * 64), out(8 * 64);
  const std::vector<int> seqs = batch.seqs;
  EXPECT_TRUE(throws_error([&] { paged_decode_attention_ref(cache, 0, seqs, 7, q, out); },
                           ErrorKind::invalid_argument,
                           {"'num_q_heads' = 7", "multiple of num_kv_heads = 2"}));
  EXPECT_TRUE(throws_error([&] { paged_decode_attention_ref(cache, 0, seqs, 4, q, out); },
                           ErrorKind::invalid_argument,
                           {"'q' has 512 values", "[batch 1][num_q_heads 4][head_dim 64]"}));
  EXPECT_TRUE(throws_error([&] { paged_decode_attention_ref(cache, 3, seqs, 8, q, out); },
                           ErrorKind::invalid_argument, "'layer' = 3"));
  EXPECT_TRUE(throws_error(
      [&] {
        paged_decode_attention_ref(cache, 0, seqs, 8, q, out, {0.0f, -1});
      },
      ErrorKind::invalid_argument, "'split_tokens' = -1"));
  EXPECT_TRUE(throws_error(
      [&] {
        paged_decode_attention_ref(cache, 0, seqs, 8, q, out, {-1.0f, 0});
      },
      ErrorKind::invalid_argument, "'softmax_scale' = -1"));
  const int empty = cache.add_sequence();
  const std::vector<int> with_empty = {seqs[0], empty};
  std::vector<float> q2(2 * 8 * 64), out2(q2.size());
  EXPECT_TRUE(throws_error([&] { paged_decode_attention_ref(cache, 0, with_empty, 8, q2, out2); },
                           ErrorKind::invalid_argument, {"'seqs[1]'", "empty"}));
  const std::vector<int> bad = {42};
  EXPECT_TRUE(throws_error([&] { paged_decode_attention_ref(cache, 0, bad, 8, q, out); },
                           ErrorKind::invalid_argument, "'seqs[0]' = 42"));
  EXPECT_TRUE(throws_error([&] { paged_prefill_attention_ref(cache, 0, seqs[0], 3, 3, 8, q, out); },
                           ErrorKind::invalid_argument, {"'first_pos' = 3", "length 5"}));
  std::vector<float> k(5 * 2 * 64);
  EXPECT_TRUE(throws_error([&] { dense_attention_ref(q, k, k, 1, 5, 8, 3, 64, out); },
                           ErrorKind::invalid_argument, "'num_q_heads' = 8"));
  EXPECT_TRUE(throws_error([&] { dense_attention_ref(q, k, k, 6, 5, 8, 2, 64, out); },
                           ErrorKind::invalid_argument, "'n_keys' = 5"));
}

}  // namespace
}  // namespace lowbit::kv
