// The paged KV cache: config checks, slab layout and alignment, bytes per
// token, page allocation (lengths around page boundaries, interleaved and
// released sequences), where each token's bytes land, fp16 pass-through.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "error_matchers.h"
#include "kv_test_util.h"
#include "lowbit/core/half.h"
#include "lowbit/core/host_memory.h"
#include "lowbit/kv/paged_cache.h"
#include "tolerances.h"

namespace lowbit::kv {
namespace {

using lowbit::test::throws_error;

KvCacheConfig small_config(KvFormat k = KvFormat::tq4, KvFormat v = KvFormat::tq4) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.page_size = 16;
  c.num_pages = 12;
  c.k_format = k;
  c.v_format = v;
  return c;
}

TEST(PagedKvCache, ConfigErrorsNameTheField) {
  auto expect_bad = [](auto mutate, std::initializer_list<std::string_view> needles) {
    KvCacheConfig c = small_config();
    mutate(c);
    EXPECT_TRUE(throws_error([&] { PagedKvCache cache(c); }, ErrorKind::invalid_argument, needles));
  };
  expect_bad([](KvCacheConfig& c) { c.page_size = 8; }, {"'page_size' = 8", "multiple of 16 in [16, 256]"});
  expect_bad([](KvCacheConfig& c) { c.page_size = 24; }, {"'page_size' = 24"});
  expect_bad([](KvCacheConfig& c) { c.page_size = 512; }, {"'page_size' = 512"});
  expect_bad([](KvCacheConfig& c) { c.head_dim = 100; }, {"'head_dim' = 100", "multiple of 32"});
  expect_bad([](KvCacheConfig& c) { c.head_dim = 2048; }, {"'head_dim' = 2048"});
  expect_bad(
      [](KvCacheConfig& c) {
        c.head_dim = 96;
        c.rotation = RotationKind::hadamard;
      },
      {"'head_dim' = 96", "power of two"});
  expect_bad([](KvCacheConfig& c) { c.num_kv_heads = 0; }, {"'num_kv_heads' = 0"});
  expect_bad([](KvCacheConfig& c) { c.num_layers = 0; }, {"'num_layers' = 0"});
  expect_bad([](KvCacheConfig& c) { c.num_pages = 0; }, {"'num_pages' = 0"});
  KvCacheConfig ok = small_config();
  ok.head_dim = 96;  // haar takes any multiple of 32
  EXPECT_NO_THROW(PagedKvCache{ok});
}

// Every page is allocated (and cleared) when the cache is made, so a pool
// larger than the machine is refused there with its size, not left to the
// OOM killer (Linux lends memory it does not have).
TEST(PagedKvCache, APoolLargerThanTheMachineIsRefusedWithItsSize) {
  if (!host_memory_available()) GTEST_SKIP() << "no /proc/meminfo here: the check does nothing (documented)";
  KvCacheConfig c = small_config();
  c.num_layers = 40;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 256;
  c.num_pages = std::numeric_limits<int32_t>::max();  // ~1.8 PiB per layer
  EXPECT_TRUE(throws_error([&] { PagedKvCache cache(c); }, ErrorKind::unsupported,
                           {"the paged KV cache (40 layers x 2147483647 pages x 8 KV heads", "PiB of host memory"}));
}

TEST(PagedKvCache, SlabSectionsAre16ByteAligned) {
  for (KvFormat k : {KvFormat::tq4, KvFormat::tq3, KvFormat::tq2, KvFormat::fp16})
    for (KvFormat v : {KvFormat::tq4, KvFormat::tq3, KvFormat::tq2, KvFormat::fp16})
      for (int page : {16, 48, 256})
        for (ScaleDType s : {ScaleDType::f16, ScaleDType::f32}) {
          KvCacheConfig c = small_config(k, v);
          c.page_size = page;
          c.head_dim = 32;
          c.scale_dtype = s;
          c.num_pages = 1;
          const PagedKvCache cache(c);
          const PageLayout& l = cache.layout();
          for (int64_t offset : {l.k_rows, l.k_scales, l.v_rows, l.v_scales, l.bytes})
            EXPECT_EQ(offset % 16, 0);
          EXPECT_EQ(l.bytes,
                    page * static_cast<int64_t>(kv_vector_bytes(k, 32, s) + kv_vector_bytes(v, 32, s)));
          EXPECT_EQ(reinterpret_cast<uintptr_t>(cache.slab(1, 0, 1)) % 16, 0u);
        }
  // tq4 K and V, f16 scales, d = 128, P = 16: 16 * (64 + 2 + 64 + 2) bytes.
  KvCacheConfig c = small_config();
  c.head_dim = 128;
  const PagedKvCache cache(c);
  EXPECT_EQ(cache.layout().k_scales, 1024);
  EXPECT_EQ(cache.layout().v_rows, 1056);
  EXPECT_EQ(cache.layout().v_scales, 2080);
  EXPECT_EQ(cache.layout().bytes, 2112);
  EXPECT_EQ(cache.slab(0, 1, 0) - cache.slab(0, 0, 0), 2 * 2112);  // (page * num_kv_heads + head) * bytes
  EXPECT_EQ(cache.slab(0, 0, 1) - cache.slab(0, 0, 0), 2112);
  EXPECT_EQ(cache.layer_pool(1).size(), static_cast<size_t>(12 * 2 * 2112));
}

TEST(PagedKvCache, BytesPerTokenQwen3_14BGeometry) {
  KvCacheConfig c;
  c.num_layers = 40;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 128;
  c.num_pages = 1;
  c.rotation = RotationKind::hadamard;  // bytes do not depend on it; it skips 40 QR factorizations
  const PagedKvCache tq4(c);
  EXPECT_EQ(tq4.bytes_per_token_per_layer(), 8 * 2 * 66);
  EXPECT_EQ(tq4.bytes_per_token(), 40 * 8 * 2 * 66);  // 42,240 bytes
  EXPECT_EQ(tq4.page_bytes(), 128 * tq4.bytes_per_token());
  EXPECT_EQ(tq4.pool_bytes(), tq4.page_bytes());
  c.k_format = c.v_format = KvFormat::fp16;
  const PagedKvCache fp16(c);
  EXPECT_EQ(fp16.bytes_per_token(), 40 * 8 * 2 * 256);  // 163,840 bytes: 3.88x more
  c.k_format = KvFormat::fp16;
  c.v_format = KvFormat::tq3;
  c.scale_dtype = ScaleDType::f32;
  EXPECT_EQ(PagedKvCache(c).bytes_per_token(), 40 * 8 * (256 + 48 + 4));
}

TEST(PagedKvCache, PagesAroundPageBoundaries) {
  KvCacheConfig c = small_config();
  c.num_pages = 64;
  PagedKvCache cache(c);
  const int64_t P = 16;
  for (int64_t len : {int64_t{1}, P - 1, P, P + 1, 3 * P, 3 * P + 1}) {
    const int s = cache.add_sequence();
    EXPECT_EQ(cache.extend(s, len), 0);
    EXPECT_EQ(cache.length(s), len);
    EXPECT_EQ(static_cast<int64_t>(cache.block_table(s).size()), (len + P - 1) / P) << len;
    cache.release_sequence(s);
  }
  EXPECT_EQ(cache.free_pages(), 64);
  // Growing token by token crosses boundaries exactly when expected.
  const int s = cache.add_sequence();
  for (int64_t t = 0; t < 2 * P + 3; ++t) {
    EXPECT_EQ(cache.extend(s, 1), t);
    EXPECT_EQ(static_cast<int64_t>(cache.block_table(s).size()), t / P + 1);
  }
  EXPECT_EQ(cache.used_pages(), 3);
}

TEST(PagedKvCache, InterleavedSequencesOwnDisjointPagesAndReleaseReturnsThem) {
  PagedKvCache cache(small_config());  // 12 pages of 16
  const int a = cache.add_sequence(), b = cache.add_sequence();
  cache.extend(a, 20);  // pages 0, 1
  cache.extend(b, 5);   // page 2
  cache.extend(a, 30);  // pages 3, 4: a's table is not contiguous
  const std::vector<int32_t> ta(cache.block_table(a).begin(), cache.block_table(a).end());
  EXPECT_EQ(ta, (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_EQ(cache.block_table(b).size(), 1u);
  EXPECT_EQ(cache.free_pages(), 7);
  // Out of pages: nothing is taken, the message says how much would fit.
  EXPECT_TRUE(throws_error([&] { cache.extend(b, 200); }, ErrorKind::invalid_argument,
                           {"'n_tokens' = 200", "only 7 of 12 are free", "at most 123 tokens"}));
  EXPECT_EQ(cache.free_pages(), 7);
  EXPECT_EQ(cache.length(b), 5);
  cache.release_sequence(a);
  EXPECT_EQ(cache.free_pages(), 11);
  EXPECT_TRUE(throws_error([&] { (void)cache.length(a); }, ErrorKind::invalid_argument,
                           {"'seq' = 0", "live sequence"}));
  const int c = cache.add_sequence();
  EXPECT_EQ(c, a);           // the id is reused
  cache.extend(c, 16 * 11);  // every free page
  std::set<int32_t> all(cache.block_table(c).begin(), cache.block_table(c).end());
  all.insert(cache.block_table(b).begin(), cache.block_table(b).end());
  EXPECT_EQ(all.size(), 12u);
  EXPECT_EQ(cache.free_pages(), 0);
}

TEST(PagedKvCache, EachTokenLandsInItsPageSlotAndHead) {
  // The bytes of token t, head h in the slab of block_table[t / P] at slot
  // t % P equal an independent quantization with the layer's rotation.
  KvCacheConfig c = small_config(KvFormat::tq3, KvFormat::tq4);
  PagedKvCache cache(c);
  const int filler = cache.add_sequence(), s = cache.add_sequence();
  cache.extend(filler, 3);
  const int64_t n = 40;
  cache.extend(s, n);
  for (int layer = 0; layer < 2; ++layer) {
    const auto k = kvtest::random_rows(n, 2, 64, 10 + layer, kvtest::DataKind::gaussian, true);
    const auto v = kvtest::random_rows(n, 2, 64, 20 + layer, kvtest::DataKind::gaussian, false);
    cache.write(layer, s, 0, n, k, v);
    EXPECT_EQ(cache.rotation(layer).seed(), layer_rotation_seed(42, layer));
    const VectorQuantizer& qk = *cache.quantizer(KvPart::key);
    const VectorQuantizer& qv = *cache.quantizer(KvPart::value);
    const PageLayout& l = cache.layout();
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < 2; ++h) {
        const std::byte* slab = cache.slab(layer, cache.block_table(s)[static_cast<size_t>(t / 16)], h);
        const int64_t slot = t % 16;
        const size_t at = static_cast<size_t>((t * 2 + h) * 64);
        std::vector<uint8_t> codes(qk.code_bytes());
        std::vector<std::byte> scale(2);
        qk.quantize(cache.rotation(layer), {k.data() + at, 64}, codes, scale);
        EXPECT_EQ(std::memcmp(slab + l.k_rows + slot * l.k_row_bytes, codes.data(), codes.size()), 0)
            << t << "," << h;
        EXPECT_EQ(std::memcmp(slab + l.k_scales + slot * 2, scale.data(), 2), 0);
        std::vector<uint8_t> vcodes(qv.code_bytes());
        qv.quantize(cache.rotation(layer), {v.data() + at, 64}, vcodes, scale);
        EXPECT_EQ(std::memcmp(slab + l.v_rows + slot * l.v_row_bytes, vcodes.data(), vcodes.size()), 0);
        EXPECT_EQ(std::memcmp(slab + l.v_scales + slot * 2, scale.data(), 2), 0);
        // read_original is the dequantized vector: close to the input.
        std::vector<float> back(64);
        cache.read_original(KvPart::value, layer, s, t, h, back);
        EXPECT_GT(kvtest::cosine(back, {v.data() + at, 64}), 0.97);
      }
  }
  // The filler sequence's page was never written: it decodes to zeros.
  std::vector<float> zero(64, 1.0f);
  cache.read_original(KvPart::key, 0, filler, 2, 1, zero);
  for (float z : zero) EXPECT_EQ(z, 0.0f);
}

TEST(PagedKvCache, PrefillWriteEqualsTokenByTokenWrites) {
  KvCacheConfig c = small_config();
  PagedKvCache bulk(c), single(c);
  const int64_t n = 37;
  const auto k = kvtest::random_rows(n, 2, 64, 1, kvtest::DataKind::outliers, true);
  const auto v = kvtest::random_rows(n, 2, 64, 2, kvtest::DataKind::outliers, false);
  const int a = bulk.add_sequence(), b = single.add_sequence();
  bulk.extend(a, n);
  bulk.write(1, a, 0, n, k, v);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = single.extend(b, 1);
    single.write_token(1, b, pos, {k.data() + t * 128, 128}, {v.data() + t * 128, 128});
  }
  const auto pa = bulk.layer_pool(1), pb = single.layer_pool(1);
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size()), 0);
}

TEST(PagedKvCache, Fp16PassThroughStoresTheRoundedValues) {
  PagedKvCache cache(small_config(KvFormat::fp16, KvFormat::fp16));
  EXPECT_EQ(cache.quantizer(KvPart::key), nullptr);
  EXPECT_FALSE(cache.stored_rotated(KvPart::value));
  const int s = cache.add_sequence();
  cache.extend(s, 17);
  const auto k = kvtest::random_rows(17, 2, 64, 3, kvtest::DataKind::gaussian, true);
  const auto v = kvtest::random_rows(17, 2, 64, 4, kvtest::DataKind::gaussian, false);
  cache.write(0, s, 0, 17, k, v);
  std::vector<float> back(64);
  cache.read_original(KvPart::value, 0, s, 16, 1, back);
  for (int j = 0; j < 64; ++j) EXPECT_EQ(back[j], f16_to_float(float_to_f16(v[(16 * 2 + 1) * 64 + j])));
  EXPECT_EQ(cache.layout().k_scale_bytes, 0);
}

TEST(PagedKvCache, WriteAndReadErrorsNameTheArgument) {
  PagedKvCache cache(small_config());
  const int s = cache.add_sequence();
  cache.extend(s, 4);
  std::vector<float> kv(4 * 2 * 64, 0.5f), one(2 * 64, 0.5f);
  EXPECT_TRUE(throws_error([&] { cache.write(0, s, 2, 4, kv, kv); }, ErrorKind::invalid_argument,
                           {"'first_pos' = 2", "length 4", "extend()"}));
  EXPECT_TRUE(throws_error([&] { cache.write(2, s, 0, 4, kv, kv); }, ErrorKind::invalid_argument,
                           {"'layer' = 2", "num_layers - 1 = 1"}));
  EXPECT_TRUE(
      throws_error([&] { cache.write(0, 7, 0, 4, kv, kv); }, ErrorKind::invalid_argument, "'seq' = 7"));
  EXPECT_TRUE(throws_error([&] { cache.write(0, s, 0, 4, one, kv); }, ErrorKind::invalid_argument,
                           {"'k' has 128 values", "[n_tokens 4][num_kv_heads 2][head_dim 64]"}));
  EXPECT_TRUE(
      throws_error([&] { cache.write_token(0, s, 3, one, kv); }, ErrorKind::invalid_argument, "'v' has 512"));
  EXPECT_TRUE(throws_error([&] { cache.extend(s, 0); }, ErrorKind::invalid_argument, "'n_tokens' = 0"));
  std::vector<float> out(64);
  EXPECT_TRUE(throws_error([&] { cache.read_original(KvPart::key, 0, s, 4, 0, out); },
                           ErrorKind::invalid_argument, "'pos' = 4"));
  EXPECT_TRUE(throws_error([&] { (void)cache.slab(0, 12, 0); }, ErrorKind::invalid_argument, "'page' = 12"));
  EXPECT_TRUE(throws_error([&] { (void)cache.slab(0, 0, 2); }, ErrorKind::invalid_argument, "'kv_head' = 2"));
  one[3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(
      throws_error([&] { cache.write_token(0, s, 3, one, one); }, ErrorKind::invalid_argument, "finite"));
}

}  // namespace
}  // namespace lowbit::kv
