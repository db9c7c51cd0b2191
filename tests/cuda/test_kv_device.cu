// The CUDA KV cache against the CPU one (paged_cache.h, attention_ref.h):
//  - the device rotation matrices are the host's, bit for bit;
//  - the device quantizer writes the host's bytes (indices identical on
//    >= 99.9% of coordinates, only adjacent cells otherwise; scales within
//    one f16 ulp; fp16 rows identical) for prefill blocks and decode appends;
//  - decode attention equals the CPU reference of the quantized path to
//    1e-3 relative for every K/V format pair, GQA, page boundaries (lengths
//    1, P-1, P, P+1), mixed batches, forced and automatic KV splits;
//  - the chunks merged inside a cluster give the merge kernel's bits;
//  - the decode attention's own append of the newest token
//    (DeviceDecodeOptions::append_k) stores the append kernel's bytes and
//    gives its output bits;
//  - causal prefill (whole and chunked) likewise, through the tiled prefill
//    kernel and through the decode kernel (one row per query token);
//  - bad arguments throw.
// Outputs are poisoned with NaN before each call, so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "error_matchers.h"
#include "gpu_test_util.h"
#include "kv/kv_test_util.h"
#include "lowbit/core/half.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/kv/attention_ref.h"
#include "lowbit/kv/device_cache.h"
#include "tolerances.h"

namespace lowbit::kv {
namespace {

using kvtest::DataKind;
using lowbit::test::throws_error;

constexpr int kLayers = 2;
constexpr int kTestLayer = 1;  // not layer 0: the per-layer rotation seed must be honoured

KvCacheConfig make_config(KvFormat kf, KvFormat vf, int page_size, int64_t pages, int kv_heads = 8,
                          ScaleDType scale = ScaleDType::f16, RotationKind rotation = RotationKind::haar,
                          int head_dim = 128) {
  KvCacheConfig c;
  c.num_layers = kLayers;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.num_pages = pages;
  c.k_format = kf;
  c.v_format = vf;
  c.scale_dtype = scale;
  c.rotation = rotation;
  return c;
}

int64_t pages_for(const std::vector<int64_t>& lens, int page_size) {
  int64_t n = 4;  // a few spare pages
  for (int64_t l : lens) n += (l + page_size - 1) / page_size;
  return n;
}

// The host batch of tests/kv/kv_test_util.h, grown 7 tokens at a time.
struct HostBatch : kvtest::InterleavedBatch {
  HostBatch(const KvCacheConfig& config, const std::vector<int64_t>& lengths, DataKind kind, uint64_t seed)
      : InterleavedBatch(config, lengths, kind, seed, 7) {}
};

Buffer to_device(const std::vector<float>& x) {
  Buffer b(x.size() * 4, Device::cuda);
  Buffer::copy(b.data(), Device::cuda, x.data(), Device::cpu, x.size() * 4);
  return b;
}

std::vector<float> from_device(const Buffer& b, size_t floats) {
  std::vector<float> x(floats);
  Buffer::copy(x.data(), Device::cpu, b.data(), Device::cuda, floats * 4);
  return x;
}

Buffer poisoned_output(size_t floats) {
  Buffer b(floats * 4, Device::cuda);
  LOWBIT_CUDA_CHECK(cudaMemset(b.data(), 0xFF, b.size()));  // NaN
  return b;
}

::testing::AssertionResult close_to_reference(const std::vector<float>& gpu, const std::vector<float>& ref) {
  for (size_t i = 0; i < gpu.size(); ++i)
    if (!std::isfinite(gpu[i])) return ::testing::AssertionFailure() << "non-finite output at " << i << ": " << gpu[i];
  const double err = kvtest::max_relative_error(gpu, ref);
  if (err > test::kKvDeviceAttentionRelErr)
    return ::testing::AssertionFailure() << "max relative error " << err << " > " << test::kKvDeviceAttentionRelErr;
  return ::testing::AssertionSuccess() << "max relative error " << err;
}

std::string name(KvFormat kf, KvFormat vf) { return std::string(kv_format_name(kf)) + "/" + kv_format_name(vf); }

const KvFormat kAllFormats[] = {KvFormat::tq4, KvFormat::tq3, KvFormat::tq2, KvFormat::fp16};

// ------------------------------------------------------------------------------

TEST(KvDevice, RotationMatricesAreTheHostsBits) {
  LOWBIT_REQUIRE_GPU();
  for (int d : {64, 128})
  for (RotationKind kind : {RotationKind::haar, RotationKind::hadamard}) {
    const KvCacheConfig c = make_config(KvFormat::tq4, KvFormat::tq4, 16, 1, 8, ScaleDType::f16, kind, d);
    const DeviceKvCache dev(c);
    const PagedKvCache host(c);
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::vector<float> m = host.rotation(layer).dense_matrix();
      std::vector<float> got(m.size()), got_t(m.size());
      Buffer::copy(got.data(), Device::cpu, dev.rotation(layer), Device::cuda, m.size() * 4);
      Buffer::copy(got_t.data(), Device::cpu, dev.rotation_t(layer), Device::cuda, m.size() * 4);
      EXPECT_EQ(std::memcmp(got.data(), m.data(), m.size() * 4), 0) << rotation_kind_name(kind) << " layer " << layer;
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j)
          ASSERT_EQ(got_t[static_cast<size_t>(j * d + i)], m[static_cast<size_t>(i * d + j)]);
    }
  }
}

// Compares two pools slot by slot: fp16 rows bytewise, indices (mismatches
// counted, each must be an adjacent cell), scales to one f16 ulp.
struct PoolComparison {
  int64_t coords = 0, index_mismatches = 0, far_mismatches = 0, scale_mismatches = 0, fp16_mismatches = 0;
};

PoolComparison compare_pools(const PagedKvCache& host, const std::vector<std::byte>& dev, int layer) {
  const KvCacheConfig& c = host.config();
  const PageLayout& l = host.layout();
  const std::span<const std::byte> ref = host.layer_pool(layer);
  PoolComparison r;
  const int d = c.head_dim;
  std::vector<uint8_t> ia(static_cast<size_t>(d)), ib(static_cast<size_t>(d));
  for (int64_t slab = 0; slab < c.num_pages * c.num_kv_heads; ++slab)
    for (KvPart part : {KvPart::key, KvPart::value}) {
      const bool key = part == KvPart::key;
      const VectorQuantizer* q = host.quantizer(part);
      const int64_t rows = slab * l.bytes + (key ? l.k_rows : l.v_rows);
      const int64_t row_bytes = key ? l.k_row_bytes : l.v_row_bytes;
      for (int slot = 0; slot < c.page_size; ++slot) {
        const auto* a = reinterpret_cast<const uint8_t*>(ref.data() + rows + slot * row_bytes);
        const auto* b = reinterpret_cast<const uint8_t*>(dev.data() + rows + slot * row_bytes);
        if (q == nullptr) {
          r.fp16_mismatches += std::memcmp(a, b, static_cast<size_t>(row_bytes)) != 0;
          continue;
        }
        unpack_indices(q->bits(), {a, static_cast<size_t>(row_bytes)}, ia);
        unpack_indices(q->bits(), {b, static_cast<size_t>(row_bytes)}, ib);
        for (int j = 0; j < d; ++j) {
          ++r.coords;
          if (ia[j] != ib[j]) {
            ++r.index_mismatches;
            if (std::abs(int{ia[j]} - int{ib[j]}) != 1) ++r.far_mismatches;
          }
        }
        const int64_t sb = key ? l.k_scale_bytes : l.v_scale_bytes;
        const int64_t at = slab * l.bytes + (key ? l.k_scales : l.v_scales) + slot * sb;
        const float sa = q->load_scale({ref.data() + at, static_cast<size_t>(sb)});
        const float sd = q->load_scale({dev.data() + at, static_cast<size_t>(sb)});
        if (!(std::abs(sa - sd) <= test::kKvDeviceScaleRtol * std::max(std::abs(sa), std::abs(sd))))
          ++r.scale_mismatches;
      }
    }
  return r;
}

// head_dim 128 (Qwen3, Llama) and 64 (SmolLM2): the write kernel runs one
// thread per coordinate, so each is its own instantiation.
TEST(KvDevice, WriteMatchesHostQuantizer) {
  LOWBIT_REQUIRE_GPU();
  struct Case {
    KvFormat kf, vf;
    ScaleDType scale;
    RotationKind rotation;
    DataKind data;
  };
  const Case cases[] = {
      {KvFormat::tq4, KvFormat::tq4, ScaleDType::f16, RotationKind::haar, DataKind::gaussian},
      {KvFormat::tq4, KvFormat::tq4, ScaleDType::f32, RotationKind::haar, DataKind::outliers},
      {KvFormat::tq3, KvFormat::tq2, ScaleDType::f16, RotationKind::haar, DataKind::gaussian},
      {KvFormat::tq2, KvFormat::tq3, ScaleDType::f16, RotationKind::hadamard, DataKind::outliers},
      {KvFormat::fp16, KvFormat::tq4, ScaleDType::f16, RotationKind::hadamard, DataKind::gaussian},
      {KvFormat::tq4, KvFormat::fp16, ScaleDType::f16, RotationKind::haar, DataKind::gaussian},
  };
  // The write kernel quantizes one vector per CTA up to 64 vectors per call
  // (decode) and 8 per CTA above: the 5-row append and the 14+ token writes
  // take the second path, the 4-row append and the 2-token write the first.
  for (int head_dim : {128, 64})
  for (const std::vector<int64_t>& lens : {std::vector<int64_t>{1, 3, 15, 16, 17, 250},
                                           std::vector<int64_t>{2, 33, 40, 250}})
  for (const Case& cs : cases) {
    SCOPED_TRACE(name(cs.kf, cs.vf) + " " + scale_dtype_name(cs.scale) + " " + rotation_kind_name(cs.rotation) +
                 " rows " + std::to_string(lens.size()) + " d=" + std::to_string(head_dim));
    const KvCacheConfig c =
        make_config(cs.kf, cs.vf, 16, pages_for(lens, 16), 8, cs.scale, cs.rotation, head_dim);
    HostBatch hb(c, lens, cs.data, 100);
    DeviceKvCache dev(c);
    const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
    const int H = c.num_kv_heads, d = c.head_dim;
    const size_t vec = static_cast<size_t>(H) * d;
    // Prefill all but the last token of each row, then append the last tokens together (decode).
    std::vector<float> k_last, v_last;
    for (size_t b = 0; b < lens.size(); ++b) {
      if (lens[b] > 1) {
        const size_t n = static_cast<size_t>(lens[b] - 1) * vec;
        const Buffer k = to_device({hb.k[b].begin(), hb.k[b].begin() + static_cast<int64_t>(n)});
        const Buffer v = to_device({hb.v[b].begin(), hb.v[b].begin() + static_cast<int64_t>(n)});
        device_write_tokens(dev, kTestLayer, tables, static_cast<int>(b), 0, lens[b] - 1, k.as<float>(),
                            v.as<float>());
      }
      const size_t at = static_cast<size_t>(lens[b] - 1) * vec;
      k_last.insert(k_last.end(), hb.k[b].begin() + static_cast<int64_t>(at), hb.k[b].end());
      v_last.insert(v_last.end(), hb.v[b].begin() + static_cast<int64_t>(at), hb.v[b].end());
    }
    const Buffer kl = to_device(k_last), vl = to_device(v_last);
    device_append_tokens(dev, kTestLayer, tables, kl.as<float>(), vl.as<float>());
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    const PoolComparison r = compare_pools(hb.cache, dev.download_pool(kTestLayer), kTestLayer);
    EXPECT_EQ(r.fp16_mismatches, 0);
    EXPECT_EQ(r.scale_mismatches, 0);
    EXPECT_EQ(r.far_mismatches, 0);
    EXPECT_LE(static_cast<double>(r.index_mismatches), test::kKvDeviceIndexMismatchMax * static_cast<double>(r.coords))
        << r.index_mismatches << " of " << r.coords;
    RecordProperty("index_mismatches_" + name(cs.kf, cs.vf), std::to_string(r.index_mismatches));
  }
}

// The two write kernels (KvWriteKernel) store the same bytes: prefill blocks
// of several rows (whole and in two pieces), then one appended token per row,
// every format pair, both head dimensions, f16 and f32 scales, outlier data,
// Hadamard rotations (the warp kernel's domain); the rows' lengths cross page
// boundaries. The host comparison above covers both kernels against
// VectorQuantizer; this one pins them to each other bit for bit.
TEST(KvDevice, WarpWriteKernelStoresThePerCoordinateKernelsBytes) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<int64_t> lens = {1, 17, 33, 300};
  for (int head_dim : {128, 64})
    for (ScaleDType scale : {ScaleDType::f16, ScaleDType::f32})
      for (KvFormat kf : kAllFormats)
        for (KvFormat vf : kAllFormats) {
          SCOPED_TRACE(name(kf, vf) + " " + scale_dtype_name(scale) + " d=" + std::to_string(head_dim));
          const KvCacheConfig c =
              make_config(kf, vf, 16, pages_for(lens, 16), 3, scale, RotationKind::hadamard, head_dim);
          HostBatch hb(c, lens, DataKind::outliers, 77);
          const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
          const size_t vec = static_cast<size_t>(c.num_kv_heads) * head_dim;
          std::vector<std::byte> pools[2];
          for (int which = 0; which < 2; ++which) {
            const KvWriteKernel kernel = which == 0 ? KvWriteKernel::automatic : KvWriteKernel::per_coordinate;
            DeviceKvCache dev(c);
            std::vector<float> k_last, v_last;
            for (size_t b = 0; b < lens.size(); ++b) {
              const int64_t n = lens[b] - 1;
              if (n > 0) {
                const Buffer k = to_device({hb.k[b].begin(), hb.k[b].begin() + static_cast<int64_t>(n * vec)});
                const Buffer v = to_device({hb.v[b].begin(), hb.v[b].begin() + static_cast<int64_t>(n * vec)});
                // Rows of more than 20 tokens in two pieces (the second from position 20).
                const int64_t first = n > 20 ? 20 : n;
                device_write_tokens(dev, kTestLayer, tables, static_cast<int>(b), 0, first, k.as<float>(),
                                    v.as<float>(), nullptr, kernel);
                if (first < n)
                  device_write_tokens(dev, kTestLayer, tables, static_cast<int>(b), first, n - first,
                                      k.as<float>() + first * vec, v.as<float>() + first * vec, nullptr, kernel);
              }
              const size_t at = static_cast<size_t>(n) * vec;
              k_last.insert(k_last.end(), hb.k[b].begin() + static_cast<int64_t>(at), hb.k[b].end());
              v_last.insert(v_last.end(), hb.v[b].begin() + static_cast<int64_t>(at), hb.v[b].end());
            }
            const Buffer kl = to_device(k_last), vl = to_device(v_last);
            device_append_tokens(dev, kTestLayer, tables, kl.as<float>(), vl.as<float>(), nullptr, kernel);
            LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
            pools[which] = dev.download_pool(kTestLayer);
          }
          ASSERT_EQ(pools[0].size(), pools[1].size());
          EXPECT_EQ(std::memcmp(pools[0].data(), pools[1].data(), pools[0].size()), 0)
              << "the warp write kernel stored other bytes than the per-coordinate kernel";
          // And the host's bytes (the same bounds as WriteMatchesHostQuantizer).
          const PoolComparison r = compare_pools(hb.cache, pools[0], kTestLayer);
          EXPECT_EQ(r.fp16_mismatches, 0);
          EXPECT_EQ(r.scale_mismatches, 0);
          EXPECT_EQ(r.far_mismatches, 0);
          EXPECT_LE(static_cast<double>(r.index_mismatches),
                    test::kKvDeviceIndexMismatchMax * static_cast<double>(r.coords));
        }
}

// The queries as DeviceDecodeOptions::queries_rotated takes them: rotated by
// the host's Rotation::rotate (which the device rotations reproduce bit for
// bit) and scaled by decode_query_scale.
std::vector<float> rotated_queries(const PagedKvCache& cache, const KvCacheConfig& c, const std::vector<float>& q) {
  std::vector<float> q_rot(q.size());
  const Rotation& rot = cache.rotation(kTestLayer);
  const float q_scale = decode_query_scale(c, {});
  const size_t d = static_cast<size_t>(c.head_dim);
  for (size_t h = 0; h < q.size() / d; ++h) {
    rot.rotate(std::span<const float>(q.data() + h * d, d), std::span<float>(q_rot.data() + h * d, d));
    for (size_t i = 0; i < d; ++i) q_rot[h * d + i] *= q_scale;
  }
  return q_rot;
}

// Device decode on a host-written cache vs paged_decode_attention_ref.
void check_decode(KvFormat kf, KvFormat vf, int page_size, const std::vector<int64_t>& lens, int q_heads, int kv_heads,
                  int64_t split_tokens, DataKind data = DataKind::gaussian, ScaleDType scale = ScaleDType::f16,
                  int cta_warps = 0, int head_dim = 128, int64_t plan_length = 0,
                  RotationKind rotation = RotationKind::haar) {
  SCOPED_TRACE(name(kf, vf) + " P=" + std::to_string(page_size) + " split=" + std::to_string(split_tokens) +
               " heads " + std::to_string(q_heads) + "/" + std::to_string(kv_heads) +
               " cta_warps=" + std::to_string(cta_warps) + " d=" + std::to_string(head_dim) +
               " plan_length=" + std::to_string(plan_length) + " " + rotation_kind_name(rotation));
  const KvCacheConfig c =
      make_config(kf, vf, page_size, pages_for(lens, page_size), kv_heads, scale, rotation, head_dim);
  HostBatch hb(c, lens, data, 7 + static_cast<uint64_t>(page_size));
  DeviceKvCache dev(c);
  dev.upload(hb.cache);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  const int batch = static_cast<int>(lens.size());
  const std::vector<float> q = kvtest::random_rows(batch, q_heads, head_dim, 999, DataKind::gaussian, false);
  std::vector<float> ref(q.size());
  paged_decode_attention_ref(hb.cache, kTestLayer, hb.seqs, q_heads, q, ref);
  const Buffer qd = to_device(q);
  AttentionWorkspace ws;
  // One call into a poisoned output, copied back.
  const auto decode_with = [&](const DeviceDecodeOptions& options) {
    Buffer out = poisoned_output(q.size());
    device_decode_attention(dev, kTestLayer, tables, q_heads, qd.as<float>(), out.as<float>(), ws, options);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    return from_device(out, q.size());
  };
  DeviceDecodeOptions o;
  o.split_tokens = split_tokens;
  o.cta_warps = cta_warps;
  o.plan_length = plan_length;
  const std::vector<float> got = decode_with(o);
  EXPECT_TRUE(close_to_reference(got, ref));
  // Rows of up to 8 chunks are merged inside a cluster of their CTAs
  // (DeviceDecodeOptions::cluster_merge, sm_90): the merge kernel's bits.
  DeviceDecodeOptions merge_kernel = o;
  merge_kernel.cluster_merge = false;
  EXPECT_EQ(std::memcmp(decode_with(merge_kernel).data(), got.data(), got.size() * 4), 0)
      << "the cluster merge gives other bits than the merge kernel";
  // DeviceDecodeOptions::l2_streaming (on by default) is a cache hint: the
  // same bits without the window.
  DeviceDecodeOptions no_window = o;
  no_window.l2_streaming = false;
  EXPECT_EQ(std::memcmp(decode_with(no_window).data(), got.data(), got.size() * 4), 0)
      << "the L2 streaming window changes the bits";
  // The fp16 output option: the same fp32 results, each rounded once.
  Buffer out16(q.size() * 2, Device::cuda);
  LOWBIT_CUDA_CHECK(cudaMemset(out16.data(), 0xFF, out16.size()));  // NaN
  o.out_f16 = out16.data();
  device_decode_attention(dev, kTestLayer, tables, q_heads, qd.as<float>(), nullptr, ws, o);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> bits(q.size());
  Buffer::copy(bits.data(), Device::cpu, out16.data(), Device::cuda, out16.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < bits.size(); ++i) mismatches += bits[i] != float_to_f16(got[i]).bits;
  EXPECT_EQ(mismatches, 0u) << "fp16 output differs from the rounded fp32 output";
  if (rotation != RotationKind::hadamard || kf == KvFormat::fp16) return;
  // DeviceDecodeOptions::queries_rotated: the queries rotated and scaled by
  // the caller (here the host's Rotation::rotate, which the Hadamard
  // rotation kernel reproduces bit for bit) give the same output bits.
  const Buffer qrd = to_device(rotated_queries(hb.cache, c, q));
  Buffer out_pre = poisoned_output(q.size());
  o.out_f16 = nullptr;
  o.queries_rotated = true;
  device_decode_attention(dev, kTestLayer, tables, q_heads, qrd.as<float>(), out_pre.as<float>(), ws, o);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got_pre = from_device(out_pre, q.size());
  EXPECT_EQ(std::memcmp(got_pre.data(), got.data(), got.size() * 4), 0)
      << "queries rotated by the caller give other bits than the rotation kernel's";
}

// Both CTA layouts of the packed pairs (8 warps, 128-byte table rows; 16
// warps, 256-byte rows), forced: short rows like these choose 8 by default.
// Pairs with an fp16 part have one layout (4 warps; cta_warps is ignored),
// run once.
TEST(KvDevice, DecodeEveryFormatPair) {
  LOWBIT_REQUIRE_GPU();
  for (int cta_warps : {8, 16})
    for (KvFormat kf : kAllFormats)
      for (KvFormat vf : kAllFormats) {
        const bool packed = kf != KvFormat::fp16 && vf != KvFormat::fp16;
        if (!packed && cta_warps == 16) continue;
        check_decode(kf, vf, 16, {1, 15, 16, 17, 300}, 40, 8, 0, DataKind::gaussian, ScaleDType::f16, cta_warps);
      }
}

// The Hadamard rotation: the query rotation and the output's un-rotation
// by the signs (kv/hadamard_warp.cuh) instead of the dense matrix, every
// pair once at both head dimensions, and queries rotated by the caller.
TEST(KvDevice, DecodeHadamardRotation) {
  LOWBIT_REQUIRE_GPU();
  for (KvFormat kf : kAllFormats)
    for (KvFormat vf : kAllFormats) {
      check_decode(kf, vf, 16, {1, 15, 16, 17, 300}, 40, 8, 0, DataKind::gaussian, ScaleDType::f16, 0, 128, 0,
                   RotationKind::hadamard);
      check_decode(kf, vf, 16, {1, 33, 300}, 9, 3, 32, DataKind::outliers, ScaleDType::f32, 0, 64, 0,
                   RotationKind::hadamard);
    }
}

// DeviceDecodeOptions::append_k: the attention stores each row's newest
// token itself (one warp for K, one for V, in the CTA holding the row's last
// chunk) before it reads it. Against the append kernel followed by the
// attention: the same pool bytes and the same output bits, for every format
// pair at both head dimensions and both CTA layouts, with the newest token
// at the first, last and a middle slot of a page (lengths 17, 16, 300 at 16
// tokens per page) and in a one-token row, f16 and f32 scales; also with the
// queries rotated by the caller (the engine's decode step). The newest
// token's tile is in the ring before the attention stores the token, so
// its warp also writes the token there. Both caches first hold other
// vectors in the newest slots, so a token the attention failed to store
// shows. A Haar cache with quantized parts is refused: the warp applies only
// the Hadamard rotation.
void check_decode_append(KvFormat kf, KvFormat vf, int head_dim, int q_heads, int kv_heads, int cta_warps,
                         ScaleDType scale = ScaleDType::f16) {
  SCOPED_TRACE(name(kf, vf) + " d=" + std::to_string(head_dim) + " cta_warps=" + std::to_string(cta_warps) + " " +
               scale_dtype_name(scale));
  const std::vector<int64_t> lens = {1, 15, 16, 17, 300};
  const KvCacheConfig c =
      make_config(kf, vf, 16, pages_for(lens, 16), kv_heads, scale, RotationKind::hadamard, head_dim);
  HostBatch hb(c, lens, DataKind::outliers, 41);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  const int batch = static_cast<int>(lens.size());
  const size_t vec = static_cast<size_t>(kv_heads) * head_dim;
  std::vector<float> k_last, v_last;
  for (size_t b = 0; b < lens.size(); ++b) {
    const size_t at = static_cast<size_t>(lens[b] - 1) * vec;
    k_last.insert(k_last.end(), hb.k[b].begin() + static_cast<int64_t>(at), hb.k[b].end());
    v_last.insert(v_last.end(), hb.v[b].begin() + static_cast<int64_t>(at), hb.v[b].end());
  }
  const Buffer kl = to_device(k_last), vl = to_device(v_last);
  const Buffer k_other = to_device(kvtest::random_rows(batch, kv_heads, head_dim, 5, DataKind::gaussian, true));
  const Buffer v_other = to_device(kvtest::random_rows(batch, kv_heads, head_dim, 6, DataKind::gaussian, false));
  const std::vector<float> q = kvtest::random_rows(batch, q_heads, head_dim, 999, DataKind::gaussian, false);
  const Buffer qd = to_device(q);
  AttentionWorkspace ws;
  DeviceDecodeOptions o;
  o.cta_warps = cta_warps;
  // The append kernel, then the attention.
  DeviceKvCache separate(c);
  separate.upload(hb.cache);
  device_append_tokens(separate, kTestLayer, tables, k_other.as<float>(), v_other.as<float>());
  device_append_tokens(separate, kTestLayer, tables, kl.as<float>(), vl.as<float>());
  Buffer out_separate = poisoned_output(q.size());
  device_decode_attention(separate, kTestLayer, tables, q_heads, qd.as<float>(), out_separate.as<float>(), ws, o);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::byte> pool_separate = separate.download_pool(kTestLayer);
  const std::vector<float> want = from_device(out_separate, q.size());
  std::vector<float> ref(q.size());
  paged_decode_attention_ref(hb.cache, kTestLayer, hb.seqs, q_heads, q, ref);
  EXPECT_TRUE(close_to_reference(want, ref));
  // The attention appending, with the queries as given and, for quantized K,
  // rotated and scaled by the caller.
  const Buffer qrd = to_device(rotated_queries(hb.cache, c, q));
  for (const bool rotated : {false, true}) {
    if (rotated && kf == KvFormat::fp16) continue;
    SCOPED_TRACE(rotated ? "queries rotated by the caller" : "queries as given");
    DeviceKvCache fused(c);
    fused.upload(hb.cache);
    device_append_tokens(fused, kTestLayer, tables, k_other.as<float>(), v_other.as<float>());
    Buffer out_fused = poisoned_output(q.size());
    DeviceDecodeOptions of = o;
    of.append_k = kl.as<float>();
    of.append_v = vl.as<float>();
    of.queries_rotated = rotated;
    device_decode_attention(fused, kTestLayer, tables, q_heads, (rotated ? qrd : qd).as<float>(),
                            out_fused.as<float>(), ws, of);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<std::byte> pool_fused = fused.download_pool(kTestLayer);
    ASSERT_EQ(pool_fused.size(), pool_separate.size());
    EXPECT_EQ(std::memcmp(pool_fused.data(), pool_separate.data(), pool_fused.size()), 0)
        << "the attention's append stored other bytes than the append kernel";
    const std::vector<float> got = from_device(out_fused, q.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
        << "the attention's output with its own append differs from the append kernel's";
  }
}

TEST(KvDevice, DecodeAppendsTheNewestTokenAsTheAppendKernel) {
  LOWBIT_REQUIRE_GPU();
  for (KvFormat kf : kAllFormats)
    for (KvFormat vf : kAllFormats) {
      const bool packed = kf != KvFormat::fp16 && vf != KvFormat::fp16;
      check_decode_append(kf, vf, 128, 40, 8, 0);
      if (packed) check_decode_append(kf, vf, 128, 40, 8, 16);
      check_decode_append(kf, vf, 64, 9, 3, 0);
      check_decode_append(kf, vf, 128, 40, 8, 0, ScaleDType::f32);  // 4-byte scales in the ring stage
    }
  // Haar rotations: the append kernel's job (a 64 KB matrix per layer).
  const std::vector<int64_t> lens = {20};
  const KvCacheConfig haar = make_config(KvFormat::tq4, KvFormat::tq4, 16, 4, 2);
  HostBatch hb(haar, lens, DataKind::gaussian, 1);
  DeviceKvCache dev(haar);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  Buffer q(4 * 128 * 4, Device::cuda), out(4 * 128 * 4, Device::cuda), kv(2 * 128 * 4, Device::cuda);
  AttentionWorkspace ws;
  DeviceDecodeOptions o;
  o.append_k = o.append_v = kv.as<float>();
  EXPECT_TRUE(throws_error([&] { device_decode_attention(dev, 0, tables, 4, q.as<float>(), out.as<float>(), ws, o); },
                           ErrorKind::unsupported, "Haar"));
  o.append_v = nullptr;
  EXPECT_TRUE(throws_error([&] { device_decode_attention(dev, 0, tables, 4, q.as<float>(), out.as<float>(), ws, o); },
                           ErrorKind::invalid_argument, "append_v"));
}

// head_dim 64 on SmolLM2's geometry (9 query heads over 3 KV heads): every
// format pair, one and several chunks, and the scale and data variants.
TEST(KvDevice, DecodeHeadDim64) {
  LOWBIT_REQUIRE_GPU();
  for (KvFormat kf : kAllFormats)
    for (KvFormat vf : kAllFormats)
      for (int64_t split : {int64_t{0}, int64_t{32}})
        check_decode(kf, vf, 16, {1, 15, 16, 17, 300}, 9, 3, split, DataKind::gaussian, ScaleDType::f16, 0, 64);
  check_decode(KvFormat::tq4, KvFormat::tq4, 64, {5, 64, 700}, 8, 1, 0, DataKind::outliers, ScaleDType::f32, 0, 64);
  check_decode(KvFormat::tq4, KvFormat::tq4, 128, {1, 127, 128, 129, 3001}, 40, 8, 0, DataKind::gaussian,
               ScaleDType::f16, 0, 64);
  // cta_warps = 16 is not built for d = 64: the 8-warp layout runs instead.
  check_decode(KvFormat::tq4, KvFormat::tq4, 16, {33, 400}, 9, 3, 0, DataKind::gaussian, ScaleDType::f16, 16, 64);
}

// The chunks planned for rows longer than the call's (what the engine does
// so that consecutive decode steps launch the same kernels): the chunks past
// each row's end must contribute nothing.
TEST(KvDevice, DecodePlannedForLongerRows) {
  LOWBIT_REQUIRE_GPU();
  for (int d : {128, 64}) {
    check_decode(KvFormat::tq4, KvFormat::tq4, 16, {1, 15, 300}, 40, 8, 0, DataKind::gaussian, ScaleDType::f16, 0, d,
                 4096);
    check_decode(KvFormat::fp16, KvFormat::fp16, 16, {1, 15, 300}, 40, 8, 0, DataKind::gaussian, ScaleDType::f16, 0,
                 d, 32768);
    check_decode(KvFormat::tq4, KvFormat::tq3, 16, {33, 200}, 40, 8, 16, DataKind::gaussian, ScaleDType::f16, 0, d,
                 256);
  }
}

TEST(KvDevice, DecodePageBoundariesAndSplits) {
  LOWBIT_REQUIRE_GPU();
  for (int64_t split : {int64_t{0}, int64_t{16}, int64_t{48}, int64_t{4096}}) {
    check_decode(KvFormat::tq4, KvFormat::tq4, 128, {1, 127, 128, 129, 1000, 3001}, 40, 8, split);
    check_decode(KvFormat::tq4, KvFormat::tq4, 128, {1, 127, 128, 129, 1000, 3001}, 40, 8, split, DataKind::gaussian,
                 ScaleDType::f16, 16);
    check_decode(KvFormat::fp16, KvFormat::fp16, 128, {1, 127, 128, 129, 1000, 3001}, 40, 8, split);
  }
  check_decode(KvFormat::tq4, KvFormat::tq4, 256, {255, 256, 257, 2000}, 40, 8, 0);
}

TEST(KvDevice, DecodeGqaShapesScalesAndOutliers) {
  LOWBIT_REQUIRE_GPU();
  check_decode(KvFormat::tq4, KvFormat::tq4, 32, {5, 64, 700}, 8, 8, 0);    // MHA
  check_decode(KvFormat::tq4, KvFormat::tq4, 32, {5, 64, 700}, 8, 1, 0);    // 8 query heads on one KV head (the maximum)
  check_decode(KvFormat::tq4, KvFormat::tq4, 32, {5, 64, 700}, 12, 4, 32);  // group 3
  check_decode(KvFormat::tq4, KvFormat::tq4, 16, {33, 400}, 40, 8, 0, DataKind::outliers);
  check_decode(KvFormat::tq3, KvFormat::tq4, 16, {33, 400}, 40, 8, 0, DataKind::gaussian, ScaleDType::f32);
  check_decode(KvFormat::tq4, KvFormat::tq4, 16, {33, 400}, 40, 8, 0, DataKind::outliers, ScaleDType::f32, 16);
}

// More clusters than fit at once: 24 clusters of 8 one-SM CTAs (16 warps
// forced), where an H100 holds 15. run_attention then merges with the merge
// kernel instead of leaving 9 clusters for a second wave; check_decode
// compares the bits with the merge kernel's either way.
TEST(KvDevice, DecodeMoreClustersThanFitAtOnce) {
  LOWBIT_REQUIRE_GPU();
  check_decode(KvFormat::tq4, KvFormat::tq4, 128, {2048, 2048, 1500}, 40, 8, 256, DataKind::gaussian,
               ScaleDType::f16, 16, 128, 0, RotationKind::hadamard);
}

TEST(KvDevice, DecodeManyMixedSequences) {
  LOWBIT_REQUIRE_GPU();
  std::vector<int64_t> lens;
  for (int i = 0; i < 37; ++i) lens.push_back(1 + (i * 997) % 1500);
  check_decode(KvFormat::tq4, KvFormat::tq4, 64, lens, 40, 8, 0);
}

// Repeated calls with one workspace (the engine makes one per layer and
// token) with many chunks give the same bits each time, and fewer rows after
// them, reusing the larger workspace, are still right: no state may leak
// from one call into the next.
TEST(KvDevice, DecodeRepeatedCallsGiveTheSameBits) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<int64_t> lens = {700, 1, 333, 129};
  const KvCacheConfig c = make_config(KvFormat::tq4, KvFormat::tq4, 64, pages_for(lens, 64));
  HostBatch hb(c, lens, DataKind::gaussian, 41);
  DeviceKvCache dev(c);
  dev.upload(hb.cache);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  const std::vector<float> q = kvtest::random_rows(4, 40, 128, 8, DataKind::gaussian, false);
  std::vector<float> ref(q.size());
  paged_decode_attention_ref(hb.cache, kTestLayer, hb.seqs, 40, q, ref);
  const Buffer qd = to_device(q);
  AttentionWorkspace ws;
  DeviceDecodeOptions o;
  o.split_tokens = 16;  // 44 chunks on the longest row
  std::vector<float> first;
  for (int call = 0; call < 5; ++call) {
    Buffer out = poisoned_output(q.size());
    device_decode_attention(dev, kTestLayer, tables, 40, qd.as<float>(), out.as<float>(), ws, o);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = from_device(out, q.size());
    if (call == 0) {
      EXPECT_TRUE(close_to_reference(got, ref));
      first = got;
    } else {
      EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * 4), 0) << "call " << call;
    }
  }
  // The first two sequences alone, same workspace.
  const std::vector<int> two = {hb.seqs[0], hb.seqs[1]};
  const DeviceBlockTables tables2 = DeviceBlockTables::from_cache(hb.cache, two);
  const std::vector<float> q2(q.begin(), q.begin() + 2 * 40 * 128);
  std::vector<float> ref2(q2.size());
  paged_decode_attention_ref(hb.cache, kTestLayer, two, 40, q2, ref2);
  const Buffer qd2 = to_device(q2);
  Buffer out2 = poisoned_output(q2.size());
  device_decode_attention(dev, kTestLayer, tables2, 40, qd2.as<float>(), out2.as<float>(), ws, o);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close_to_reference(from_device(out2, q2.size()), ref2));
}

// Device write + device decode against the CPU reference of the host-written
// cache: the whole device path end to end.
TEST(KvDevice, WriteThenDecodeEndToEnd) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<int64_t> lens = {3, 129, 600};
  const KvCacheConfig c = make_config(KvFormat::tq4, KvFormat::tq4, 128, pages_for(lens, 128));
  HostBatch hb(c, lens, DataKind::gaussian, 31);
  DeviceKvCache dev(c);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  for (size_t b = 0; b < lens.size(); ++b) {
    const Buffer k = to_device(hb.k[b]), v = to_device(hb.v[b]);
    device_write_tokens(dev, kTestLayer, tables, static_cast<int>(b), 0, lens[b], k.as<float>(), v.as<float>());
  }
  const std::vector<float> q = kvtest::random_rows(3, 40, 128, 5, DataKind::gaussian, false);
  std::vector<float> ref(q.size());
  paged_decode_attention_ref(hb.cache, kTestLayer, hb.seqs, 40, q, ref);
  const Buffer qd = to_device(q);
  Buffer out = poisoned_output(q.size());
  AttentionWorkspace ws;
  device_decode_attention(dev, kTestLayer, tables, 40, qd.as<float>(), out.as<float>(), ws);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close_to_reference(from_device(out, q.size()), ref));
}

// A cache writer that behaves like lowbit's own write kernels: launched
// with programmatic dependent launch, it lets the next kernel launch at its
// start. Then it takes its time (~50 us), so that the kernel after it has
// launched, and requested whatever it requests before its own wait, before
// the first byte is stored.
__global__ void slow_pool_copy_kernel(std::byte* dst, const std::byte* src, int64_t bytes) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  for (int i = 0; i < 50; ++i) __nanosleep(1000);
  const int64_t n = bytes / 16;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
}

// An attention call right after a kernel that is still writing the cache
// (slow_pool_copy_kernel: the fresh content over a stale one) reads what
// that kernel wrote: the same bits as the same call on an idle stream. A
// Hadamard cache, whose queries are rotated inside the attention CTAs, so no
// rotation kernel in between waits for the writer; both CTA layouts for
// decode; for prefill the decode kernel with one row per query token and the
// tiled kernel. Up to v21 the 8-warp layout requested its first K/V tiles
// before its wait in such calls and read the slots' old bytes: on an H100
// the v21 kernel failed this test in the 8-warp decode with the merge kernel
// (the cluster launches passed). A device_write_tokens of a prompt (or of a
// prefill block) right before such a call was a race, which the write
// kernels' short tails made rare: the same test with device_write_tokens as
// the writer passed on v21 in two runs of three repetitions.
TEST(KvDevice, AttentionReadsTheCacheOnlyAfterTheKernelBeforeItCompletes) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<int64_t> lens = {4096};
  const KvCacheConfig c =
      make_config(KvFormat::tq4, KvFormat::tq4, 64, pages_for(lens, 64), 8, ScaleDType::f16, RotationKind::hadamard);
  HostBatch stale(c, lens, DataKind::gaussian, 5), fresh(c, lens, DataKind::gaussian, 6);
  DeviceKvCache dev(c), fresh_dev(c);
  fresh_dev.upload(fresh.cache);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(fresh.cache, fresh.seqs);
  cudaStream_t stream;
  LOWBIT_CUDA_CHECK(cudaStreamCreate(&stream));
  AttentionWorkspace ws;
  constexpr int64_t kBlock = 512;
  const std::vector<float> q = kvtest::random_rows(kBlock, 40, 128, 9, DataKind::gaussian, false);
  const Buffer qd = to_device(q);
  // The call right after the writer, then again on an idle stream: the same bits?
  auto same_bits_after_the_writer = [&](const std::function<void(float*)>& attention, size_t floats) {
    Buffer racing = poisoned_output(floats), idle = poisoned_output(floats);
    dev.upload(stale.cache);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    cuda::launch_with_pdl(slow_pool_copy_kernel, dim3(16), dim3(256), 0, stream, dev.pool(kTestLayer),
                          static_cast<const std::byte*>(fresh_dev.pool(kTestLayer)), dev.pool_bytes());
    attention(racing.as<float>());
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    attention(idle.as<float>());
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> a = from_device(racing, floats), b = from_device(idle, floats);
    return std::memcmp(a.data(), b.data(), floats * 4) == 0;
  };
  for (bool cluster_merge : {true, false}) {
    for (int warps : {8, 16}) {
      DeviceDecodeOptions o;
      o.cta_warps = warps;
      o.cluster_merge = cluster_merge;
      EXPECT_TRUE(same_bits_after_the_writer(
          [&](float* out) {
            device_decode_attention(dev, kTestLayer, tables, 40, qd.as<float>(), out, ws, o, stream);
          },
          40 * 128))
          << "decode, " << warps << " warps, cluster merge " << cluster_merge << ": other bits right after the writer";
    }
    for (bool tiled : {false, true}) {
      DeviceDecodeOptions o;
      o.prefill_tiled = tiled;
      o.cluster_merge = cluster_merge;
      EXPECT_TRUE(same_bits_after_the_writer(
          [&](float* out) {
            device_prefill_attention(dev, kTestLayer, tables, 0, lens[0] - kBlock, kBlock, 40, qd.as<float>(), out,
                                     ws, o, stream);
          },
          q.size()))
          << "prefill through the " << (tiled ? "tiled kernel" : "decode kernel") << ", cluster merge "
          << cluster_merge << ": other bits right after the writer";
    }
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(stream));
}

// One causal prefill call (tokens first_pos .. len - 1 of one row, the
// earlier ones cached before) through both kernels: the tiled prefill kernel
// (the default) and the decode kernel with one row per query token
// (prefill_tiled = false), each against the CPU reference of the quantized
// path; for the decode kernel also the cluster merge against the merge
// kernel's bits.
struct PrefillCase {
  KvFormat kf = KvFormat::tq4, vf = KvFormat::tq4;
  int64_t len = 0, first_pos = 0, split_tokens = 0;
  int head_dim = 128, page_size = 16, kv_heads = 8, q_heads = 40;
  RotationKind rotation = RotationKind::haar;
  ScaleDType scale = ScaleDType::f16;
  DataKind data = DataKind::gaussian;
};

void check_prefill(const PrefillCase& p) {
  SCOPED_TRACE(name(p.kf, p.vf) + " len " + std::to_string(p.len) + " first_pos " + std::to_string(p.first_pos) +
               " split " + std::to_string(p.split_tokens) + " d=" + std::to_string(p.head_dim) + " page " +
               std::to_string(p.page_size) + " heads " + std::to_string(p.q_heads) + "/" + std::to_string(p.kv_heads) +
               (p.rotation == RotationKind::hadamard ? " hadamard" : " haar") +
               (p.scale == ScaleDType::f32 ? " f32 scales" : ""));
  const std::vector<int64_t> lens = {p.len};
  const KvCacheConfig c = make_config(p.kf, p.vf, p.page_size, pages_for(lens, p.page_size), p.kv_heads, p.scale,
                                      p.rotation, p.head_dim);
  HostBatch hb(c, lens, p.data, 77);
  DeviceKvCache dev(c);
  dev.upload(hb.cache);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  const int64_t n = p.len - p.first_pos;
  const std::vector<float> q = kvtest::random_rows(n, p.q_heads, p.head_dim, 6, DataKind::gaussian, false);
  std::vector<float> ref(q.size());
  paged_prefill_attention_ref(hb.cache, kTestLayer, hb.seqs[0], p.first_pos, n, p.q_heads, q, ref);
  const Buffer qd = to_device(q);
  AttentionWorkspace ws;
  DeviceDecodeOptions o;
  o.split_tokens = p.split_tokens;
  auto run = [&](const DeviceDecodeOptions& opt) {
    Buffer out = poisoned_output(q.size());
    device_prefill_attention(dev, kTestLayer, tables, 0, p.first_pos, n, p.q_heads, qd.as<float>(), out.as<float>(),
                             ws, opt);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    return from_device(out, q.size());
  };
  EXPECT_TRUE(close_to_reference(run(o), ref)) << "tiled prefill kernel";
  o.prefill_tiled = false;
  const std::vector<float> got = run(o);
  EXPECT_TRUE(close_to_reference(got, ref)) << "decode kernel, one row per query token";
  o.cluster_merge = false;
  EXPECT_EQ(std::memcmp(run(o).data(), got.data(), got.size() * 4), 0)
      << "the cluster merge gives other bits than the merge kernel";
}

TEST(KvDevice, PrefillCausal) {
  LOWBIT_REQUIRE_GPU();
  check_prefill({.len = 200});
  check_prefill({.len = 333, .first_pos = 100});                      // chunked: earlier tokens already cached
  check_prefill({.len = 333, .first_pos = 100, .split_tokens = 32});  // and split
  check_prefill({.kf = KvFormat::fp16, .vf = KvFormat::tq3, .len = 97, .first_pos = 17});
  check_prefill({.kf = KvFormat::tq2, .vf = KvFormat::fp16, .len = 64, .split_tokens = 16});
  check_prefill({.len = 333, .first_pos = 100, .split_tokens = 32, .head_dim = 64});
  check_prefill({.kf = KvFormat::fp16, .vf = KvFormat::fp16, .len = 97, .head_dim = 64});
  // The default model's geometry (9 query heads over 3 KV heads of 64) in a
  // 512-token block, `lowbit perplexity`'s, both rotations.
  for (RotationKind rotation : {RotationKind::haar, RotationKind::hadamard})
    check_prefill({.len = 512, .head_dim = 64, .page_size = 32, .kv_heads = 3, .q_heads = 9, .rotation = rotation});
}

// The tiled prefill kernel's own edges: every format pair (its decode of
// each row format into fp16 tiles), both head dimensions, Hadamard queries
// rotated inside the CTAs, f32 scales, outlier channels; query blocks of
// 16-64 tokens for groups of 1-8 query heads (4-8 warps of 16 rows), block
// ends inside a key tile, pages smaller and larger than a 64-key tile,
// chunks that are not whole tiles, a short block over a long history (the
// automatic split then cuts the history into chunks), a single token.
TEST(KvDevice, PrefillTiledKernelEdges) {
  LOWBIT_REQUIRE_GPU();
  for (KvFormat kf : kAllFormats)
    for (KvFormat vf : kAllFormats) check_prefill({.kf = kf, .vf = vf, .len = 150, .first_pos = 30});
  for (KvFormat f : kAllFormats)
    check_prefill({.kf = f, .vf = f, .len = 150, .first_pos = 30, .head_dim = 64, .page_size = 32});
  check_prefill({.len = 300, .first_pos = 45, .rotation = RotationKind::hadamard});
  check_prefill({.len = 300, .first_pos = 45, .head_dim = 64, .rotation = RotationKind::hadamard});
  check_prefill({.kf = KvFormat::tq3, .vf = KvFormat::tq4, .len = 211, .scale = ScaleDType::f32,
                 .data = DataKind::outliers});
  for (int group : {1, 2, 3, 4, 6, 7, 8})
    check_prefill({.len = 181, .first_pos = 40, .page_size = 64, .kv_heads = 2, .q_heads = 2 * group});
  check_prefill({.len = 200, .split_tokens = 48, .page_size = 256});
  check_prefill({.len = 200, .first_pos = 3, .split_tokens = 80, .page_size = 128});
  check_prefill({.len = 2100, .first_pos = 2095, .page_size = 128});  // 5 tokens over 2095 cached ones
  check_prefill({.len = 1, .first_pos = 0});
  check_prefill({.len = 64, .first_pos = 63, .page_size = 64});
}

// The split heuristic (host code, runs without a GPU) on the benchmark's
// geometry for an H100 (132 SMs): each warp gets at least 4 tiles of 16
// tokens unless the call has at most 66 CTAs, chunks longer than a page are
// whole pages, and the choices are the ones measured best (or within 10% of
// it) by --split-tokens 128..16384 at batch 1, 4 and 8
// (docs/results/h100-kv-attention-splits.txt, docs/kv-cache.md).
TEST(KvDevice, SplitHeuristicPicksWholePagesAndEnoughWorkPerCta) {
  auto split = [](KvFormat f, int batch, int64_t context) {
    const KvCacheConfig c = make_config(f, f, 128, 1, 8);
    return decode_split_tokens(c, batch, context, 132);
  };
  EXPECT_EQ(split(KvFormat::tq4, 1, 1024), 128);
  EXPECT_EQ(split(KvFormat::tq4, 1, 2048), 256);
  EXPECT_EQ(split(KvFormat::tq4, 1, 4096), 512);
  EXPECT_EQ(split(KvFormat::tq4, 1, 32768), 2048);  // 16-warp CTAs, one per (row, KV head, chunk) and SM
  EXPECT_EQ(split(KvFormat::tq4, 4, 1024), 512);
  EXPECT_EQ(split(KvFormat::tq4, 8, 4096), 2048);
  EXPECT_EQ(split(KvFormat::tq4, 8, 32768), 16384);
  EXPECT_EQ(split(KvFormat::tq4, 32, 32768), 32768);  // 256 pairs: 8-warp CTAs, one chunk each
  EXPECT_EQ(split(KvFormat::tq4, 1, 131072), 8192);   // 16-warp CTAs in one wave: 16 chunks, not 32 in two
  EXPECT_EQ(split(KvFormat::tq4, 8, 131072), 65536);
  EXPECT_EQ(split(KvFormat::tq4, 16, 1024), 1024);    // 16-warp CTAs: 128 pairs fill the SMs
  EXPECT_EQ(split(KvFormat::tq4, 8, 1024), 512);      // 8-warp CTAs: 64 pairs of 1k rows
  EXPECT_EQ(split(KvFormat::fp16, 1, 1024), 128);
  EXPECT_EQ(split(KvFormat::fp16, 1, 4096), 256);
  EXPECT_EQ(split(KvFormat::fp16, 1, 32768), 2048);
  EXPECT_EQ(split(KvFormat::fp16, 8, 4096), 2048);
  EXPECT_EQ(split(KvFormat::fp16, 8, 32768), 16384);
  for (KvFormat f : kAllFormats)
    for (int batch : {1, 3, 8, 32})
      for (int64_t context : {int64_t{1}, int64_t{100}, int64_t{4096}, int64_t{50000}, int64_t{131072}}) {
        const int64_t s = split(f, batch, context);
        const int warps = f == KvFormat::fp16 ? 4 : 8;  // the wide layout's 16 warps get 4 tiles each too
        EXPECT_EQ(s % 16, 0);
        if (s < context) {  // several chunks
          const int64_t ctas = int64_t{batch} * 8 * ((context + s - 1) / s);
          EXPECT_TRUE(s >= 4 * warps * 16 || ctas <= 66) << batch << " " << context;
          if (s > 128) EXPECT_EQ(s % 128, 0) << batch << " " << context;
        }
      }
}

TEST(KvDevice, RejectsBadArguments) {
  LOWBIT_REQUIRE_GPU();
  KvCacheConfig c = make_config(KvFormat::tq4, KvFormat::tq4, 16, 4);
  for (int d : {32, 96, 256}) {
    c.head_dim = d;
    EXPECT_TRUE(throws_error([&] { DeviceKvCache bad(c); }, ErrorKind::invalid_argument, "head_dim")) << d;
  }
  const std::vector<int64_t> lens = {20};
  const KvCacheConfig ok = make_config(KvFormat::tq4, KvFormat::tq4, 16, 4, 2);
  HostBatch hb(ok, lens, DataKind::gaussian, 1);
  DeviceKvCache dev(ok);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  Buffer q(40 * 128 * 4, Device::cuda), out(40 * 128 * 4, Device::cuda);
  AttentionWorkspace ws;
  EXPECT_TRUE(throws_error(
      [&] { device_decode_attention(dev, 0, tables, 40, q.as<float>(), out.as<float>(), ws); },
      ErrorKind::invalid_argument, "num_q_heads"));  // 20 query heads per KV head
  DeviceDecodeOptions o;
  o.split_tokens = 24;
  EXPECT_TRUE(throws_error([&] { device_decode_attention(dev, 0, tables, 4, q.as<float>(), out.as<float>(), ws, o); },
                           ErrorKind::invalid_argument, "split_tokens"));
  o.split_tokens = 0;
  o.cta_warps = 12;
  EXPECT_TRUE(throws_error([&] { device_decode_attention(dev, 0, tables, 4, q.as<float>(), out.as<float>(), ws, o); },
                           ErrorKind::invalid_argument, "cta_warps"));
  EXPECT_TRUE(throws_error([&] { device_decode_attention(dev, 2, tables, 4, q.as<float>(), out.as<float>(), ws); },
                           ErrorKind::invalid_argument, "layer"));
  EXPECT_TRUE(throws_error(
      [&] { device_prefill_attention(dev, 0, tables, 0, 10, 11, 4, q.as<float>(), out.as<float>(), ws); },
      ErrorKind::invalid_argument, "first_pos"));
}


// ---- the fp16 window (device_window.h, DeviceDecodeOptions::window) ------------

// What a query at position `pos` of sequence b reads with a window of
// `window` tokens: the positions older than the window from the cache's
// codes (read_original: dequantized and un-rotated, the quantized path's
// values), the window's from the original fp32 K/V; an exact softmax in
// double. q: [q_heads][d] of this query; out likewise.
void windowed_attention_ref(const HostBatch& hb, const KvCacheConfig& c, int b, int64_t pos, int64_t window,
                            const float* q, int q_heads, float* out) {
  const int d = c.head_dim, H = c.num_kv_heads, group = q_heads / H;
  const int64_t len = pos + 1, first = std::max<int64_t>(0, len - window);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> keys(static_cast<size_t>(len * d)), values(static_cast<size_t>(len * d));
  for (int kh = 0; kh < H; ++kh) {
    for (int64_t t = 0; t < len; ++t) {
      float* kt = keys.data() + t * d;
      float* vt = values.data() + t * d;
      if (t < first) {
        hb.cache.read_original(KvPart::key, kTestLayer, hb.seqs[b], t, kh, {kt, static_cast<size_t>(d)});
        hb.cache.read_original(KvPart::value, kTestLayer, hb.seqs[b], t, kh, {vt, static_cast<size_t>(d)});
      } else {
        const size_t at = static_cast<size_t>((t * H + kh) * d);
        std::copy_n(hb.k[static_cast<size_t>(b)].data() + at, d, kt);
        std::copy_n(hb.v[static_cast<size_t>(b)].data() + at, d, vt);
      }
    }
    for (int g = 0; g < group; ++g) {
      const float* qh = q + static_cast<size_t>((kh * group + g) * d);
      std::vector<double> s(static_cast<size_t>(len));
      double mx = -INFINITY;
      for (int64_t t = 0; t < len; ++t) {
        double dot = 0;
        for (int j = 0; j < d; ++j) dot += static_cast<double>(qh[j]) * keys[static_cast<size_t>(t * d + j)];
        s[static_cast<size_t>(t)] = dot * scale;
        mx = std::max(mx, s[static_cast<size_t>(t)]);
      }
      std::vector<double> acc(static_cast<size_t>(d), 0.0);
      double total = 0;
      for (int64_t t = 0; t < len; ++t) {
        const double p = std::exp(s[static_cast<size_t>(t)] - mx);
        total += p;
        for (int j = 0; j < d; ++j) acc[static_cast<size_t>(j)] += p * values[static_cast<size_t>(t * d + j)];
      }
      for (int j = 0; j < d; ++j) out[(kh * group + g) * d + j] = static_cast<float>(acc[static_cast<size_t>(j)] / total);
    }
  }
}

Buffer to_device_i32(const std::vector<int32_t>& x) {
  Buffer b(x.size() * 4, Device::cuda);
  Buffer::copy(b.data(), Device::cuda, x.data(), Device::cpu, x.size() * 4);
  return b;
}

struct WindowCase {
  KvFormat kf = KvFormat::tq4, vf = KvFormat::tq4;
  std::vector<int64_t> lens;
  int64_t window = 0;
  int head_dim = 128, kv_heads = 8, q_heads = 40, page_size = 16;
  RotationKind rotation = RotationKind::haar;
  int64_t split_tokens = 0, plan_length = 0;
};

// Decode with a window against windowed_attention_ref: the newest token's
// copies stored by the window kernel (window_k / window_v), then the same
// call with them stored by device_window_write first (the same bits), and
// with Hadamard rotations the queries rotated by the caller (the same bits:
// the engine's path).
void check_window_decode(const WindowCase& w) {
  SCOPED_TRACE(name(w.kf, w.vf) + " window " + std::to_string(w.window) + " d=" + std::to_string(w.head_dim) + " " +
               rotation_kind_name(w.rotation) + " split " + std::to_string(w.split_tokens) + " plan " +
               std::to_string(w.plan_length));
  const KvCacheConfig c = make_config(w.kf, w.vf, w.page_size, pages_for(w.lens, w.page_size), w.kv_heads,
                                      ScaleDType::f16, w.rotation, w.head_dim);
  HostBatch hb(c, w.lens, DataKind::gaussian, 31);
  DeviceKvCache dev(c);
  dev.upload(hb.cache);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  const int batch = static_cast<int>(w.lens.size()), H = w.kv_heads, d = w.head_dim;
  DeviceKvWindow win(c, w.window, w.window + 40, batch + 1);
  std::vector<int32_t> slots;  // not the rows' order: the slots are looked up
  for (int b = 0; b < batch; ++b) slots.push_back(batch - b);
  const Buffer slots_d = to_device_i32(slots);
  std::vector<float> newest(static_cast<size_t>(batch * H * d));
  for (int b = 0; b < batch; ++b) {
    const int64_t len = w.lens[static_cast<size_t>(b)];
    std::copy_n(hb.k[static_cast<size_t>(b)].data() + (len - 1) * H * d, H * d, newest.data() + b * H * d);
    if (len == 1) continue;
    const Buffer kd = to_device(hb.k[static_cast<size_t>(b)]), vd = to_device(hb.v[static_cast<size_t>(b)]);
    device_window_write(dev, win, kTestLayer, slots[static_cast<size_t>(b)], 0, len - 1, kd.as<float>(),
                        vd.as<float>());
  }
  std::vector<float> newest_v(newest.size());
  for (int b = 0; b < batch; ++b) {
    const int64_t len = w.lens[static_cast<size_t>(b)];
    std::copy_n(hb.v[static_cast<size_t>(b)].data() + (len - 1) * H * d, H * d, newest_v.data() + b * H * d);
  }
  const Buffer newest_k_d = to_device(newest), newest_v_d = to_device(newest_v);
  const std::vector<float> q = kvtest::random_rows(batch, w.q_heads, d, 555, DataKind::gaussian, false);
  std::vector<float> ref(q.size());
  for (int b = 0; b < batch; ++b)
    windowed_attention_ref(hb, c, b, w.lens[static_cast<size_t>(b)] - 1, w.window, q.data() + b * w.q_heads * d,
                           w.q_heads, ref.data() + b * w.q_heads * d);
  const Buffer qd = to_device(q);
  AttentionWorkspace ws;
  DeviceDecodeOptions o;
  o.split_tokens = w.split_tokens;
  o.plan_length = w.plan_length;
  o.window = &win;
  o.window_slots = slots_d.as<const int32_t>();
  o.window_k = newest_k_d.as<float>();
  o.window_v = newest_v_d.as<float>();
  const auto decode = [&](const DeviceDecodeOptions& opt, const Buffer& queries) {
    Buffer out = poisoned_output(q.size());
    device_decode_attention(dev, kTestLayer, tables, w.q_heads, queries.as<float>(), out.as<float>(), ws, opt);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    return from_device(out, q.size());
  };
  const std::vector<float> got = decode(o, qd);
  EXPECT_TRUE(close_to_reference(got, ref)) << "newest copies stored by the window kernel";
  for (int b = 0; b < batch; ++b)
    device_window_write(dev, win, kTestLayer, slots[static_cast<size_t>(b)], w.lens[static_cast<size_t>(b)] - 1, 1,
                        newest_k_d.as<float>() + b * H * d, newest_v_d.as<float>() + b * H * d);
  DeviceDecodeOptions stored = o;
  stored.window_k = stored.window_v = nullptr;
  EXPECT_EQ(std::memcmp(decode(stored, qd).data(), got.data(), got.size() * 4), 0)
      << "copies stored by device_window_write give other bits than the window kernel's";
  if (w.rotation != RotationKind::hadamard) return;  // a warp's append applies Hadamard rotations only
  // The window kernel also storing the newest tokens' codes (append_k, the
  // engine's decode step with a Hadamard cache): the same output bits, and
  // the append kernel's cache bytes.
  {
    DeviceKvCache appended(c), by_kernel(c);
    appended.upload(hb.cache);
    by_kernel.upload(hb.cache);
    device_append_tokens(by_kernel, kTestLayer, tables, newest_k_d.as<float>(), newest_v_d.as<float>());
    DeviceDecodeOptions fused = o;
    fused.append_k = o.window_k;
    fused.append_v = o.window_v;
    Buffer out = poisoned_output(q.size());
    device_decode_attention(appended, kTestLayer, tables, w.q_heads, qd.as<float>(), out.as<float>(), ws, fused);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(std::memcmp(from_device(out, q.size()).data(), got.data(), got.size() * 4), 0)
        << "the window kernel's code append changes the output";
    EXPECT_TRUE(appended.download_pool(kTestLayer) == by_kernel.download_pool(kTestLayer))
        << "the window kernel's code append stores other bytes than device_append_tokens";
  }
  if (w.kf == KvFormat::fp16) return;
  stored.queries_rotated = true;
  EXPECT_EQ(std::memcmp(decode(stored, to_device(rotated_queries(hb.cache, c, q))).data(), got.data(),
                        got.size() * 4),
            0)
      << "queries rotated by the caller give other bits than those rotated in the kernels";
}

// Rows shorter than the window (every position from the copies: no code
// chunk, every CTA of the code kernel exits, and the merge still waits for
// the window's), longer ones across page and chunk boundaries, windows of
// 1 (only the query's own position), 16 and 100, both rotations, both head
// dimensions, fp16 parts (their copies unrotated), forced splits, and a plan
// longer than the rows (the engine's decode graphs).
TEST(KvDevice, DecodeWithAnFp16Window) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<int64_t> mixed = {1, 15, 16, 17, 100, 301};
  for (RotationKind rotation : {RotationKind::haar, RotationKind::hadamard}) {
    check_window_decode({.lens = mixed, .window = 16, .rotation = rotation});
    check_window_decode({.lens = mixed, .window = 16, .head_dim = 64, .kv_heads = 3, .q_heads = 9,
                         .rotation = rotation});
  }
  check_window_decode({.lens = {1, 5, 20}, .window = 100});                      // every row inside its window
  check_window_decode({.lens = {1, 5, 20}, .window = 100, .plan_length = 512});  // and a longer plan
  check_window_decode({.lens = mixed, .window = 1});
  check_window_decode({.lens = mixed, .window = 16, .split_tokens = 32});
  check_window_decode({.lens = mixed, .window = 64, .rotation = RotationKind::hadamard, .plan_length = 768});
  check_window_decode({.kf = KvFormat::fp16, .vf = KvFormat::tq4, .lens = mixed, .window = 16});
  check_window_decode({.kf = KvFormat::tq3, .vf = KvFormat::fp16, .lens = mixed, .window = 16,
                       .rotation = RotationKind::hadamard});
  check_window_decode({.kf = KvFormat::tq2, .vf = KvFormat::tq2, .lens = {2000}, .window = 64});
}

// A prefill block with a window: query i of the block (position first_pos +
// i) reads its own window, through the tiled kernel (its causal mask
// shifted by the window) and through the decode kernel. The rings hold
// exactly what the block needs (capacity = window + block - 1); one more
// query is refused.
void check_window_prefill(KvFormat kf, KvFormat vf, int64_t len, int64_t first_pos, int64_t window, int head_dim,
                          RotationKind rotation, int kv_heads, int q_heads) {
  SCOPED_TRACE(name(kf, vf) + " prefill " + std::to_string(first_pos) + ".." + std::to_string(len - 1) +
               " window " + std::to_string(window) + " d=" + std::to_string(head_dim) + " " +
               rotation_kind_name(rotation));
  const std::vector<int64_t> lens = {len};
  const KvCacheConfig c = make_config(kf, vf, 16, pages_for(lens, 16), kv_heads, ScaleDType::f16, rotation, head_dim);
  HostBatch hb(c, lens, DataKind::gaussian, 41);
  DeviceKvCache dev(c);
  dev.upload(hb.cache);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  const int64_t n = len - first_pos;
  DeviceKvWindow win(c, window, window + n - 1, 1);
  EXPECT_EQ(device_window_max_block(win), n);
  const Buffer kd = to_device(hb.k[0]), vd = to_device(hb.v[0]);
  device_window_write(dev, win, kTestLayer, 0, 0, len, kd.as<float>(), vd.as<float>());  // keeps the last ones
  const Buffer slots_d = to_device_i32({0});
  const std::vector<float> q = kvtest::random_rows(n, q_heads, head_dim, 8, DataKind::gaussian, false);
  std::vector<float> ref(q.size());
  for (int64_t i = 0; i < n; ++i)
    windowed_attention_ref(hb, c, 0, first_pos + i, window, q.data() + i * q_heads * head_dim, q_heads,
                           ref.data() + i * q_heads * head_dim);
  const Buffer qd = to_device(q);
  AttentionWorkspace ws;
  DeviceDecodeOptions o;
  o.window = &win;
  o.window_slots = slots_d.as<const int32_t>();
  Buffer out = poisoned_output(q.size());
  device_prefill_attention(dev, kTestLayer, tables, 0, first_pos, n, q_heads, qd.as<float>(), out.as<float>(), ws, o);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close_to_reference(from_device(out, q.size()), ref)) << "tiled prefill kernel, its mask shifted";
  DeviceDecodeOptions per_token = o;
  per_token.prefill_tiled = false;
  Buffer out2 = poisoned_output(q.size());
  device_prefill_attention(dev, kTestLayer, tables, 0, first_pos, n, q_heads, qd.as<float>(), out2.as<float>(), ws,
                           per_token);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(close_to_reference(from_device(out2, q.size()), ref)) << "decode kernel, one row per query token";
  if (first_pos > 0)
    EXPECT_TRUE(throws_error([&] { device_prefill_attention(dev, kTestLayer, tables, 0, first_pos - 1, n + 1, q_heads,
                                                            qd.as<float>(), out.as<float>(), ws, o); },
                             ErrorKind::invalid_argument, "pieces"));
}

TEST(KvDevice, PrefillWithAnFp16Window) {
  LOWBIT_REQUIRE_GPU();
  check_window_prefill(KvFormat::tq4, KvFormat::tq4, 200, 0, 16, 128, RotationKind::haar, 8, 40);
  check_window_prefill(KvFormat::tq4, KvFormat::tq4, 333, 100, 64, 128, RotationKind::hadamard, 8, 40);
  check_window_prefill(KvFormat::tq4, KvFormat::tq4, 97, 17, 300, 64, RotationKind::hadamard, 3, 9);
  check_window_prefill(KvFormat::fp16, KvFormat::tq3, 150, 30, 8, 64, RotationKind::haar, 3, 9);
  check_window_prefill(KvFormat::tq4, KvFormat::tq4, 600, 344, 16, 128, RotationKind::hadamard, 2, 16);  // several chunks
  check_window_prefill(KvFormat::tq3, KvFormat::tq4, 40, 0, 64, 128, RotationKind::haar, 8, 40);  // all in the window
}

TEST(KvDevice, Fp16WindowRejectsBadArguments) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<int64_t> lens = {20};
  const KvCacheConfig c = make_config(KvFormat::tq4, KvFormat::tq4, 16, 4, 2, ScaleDType::f16, RotationKind::hadamard);
  HostBatch hb(c, lens, DataKind::gaussian, 1);
  DeviceKvCache dev(c);
  const DeviceBlockTables tables = DeviceBlockTables::from_cache(hb.cache, hb.seqs);
  EXPECT_TRUE(throws_error([&] { DeviceKvWindow bad(c, 0, 8, 1); }, ErrorKind::invalid_argument, "window"));
  EXPECT_TRUE(throws_error([&] { DeviceKvWindow bad(c, 16, 8, 1); }, ErrorKind::invalid_argument, "capacity"));
  EXPECT_TRUE(throws_error([&] { DeviceKvWindow bad(c, 8, 8, 0); }, ErrorKind::invalid_argument, "slots"));
  DeviceKvWindow win(c, 8, 16, 1);
  Buffer q(4 * 128 * 4, Device::cuda), out(4 * 128 * 4, Device::cuda), kv(2 * 128 * 4, Device::cuda);
  const Buffer slots_d = to_device_i32({0});
  AttentionWorkspace ws;
  DeviceDecodeOptions o;
  o.window = &win;
  const auto decode = [&] { device_decode_attention(dev, 0, tables, 4, q.as<float>(), out.as<float>(), ws, o); };
  EXPECT_TRUE(throws_error(decode, ErrorKind::invalid_argument, "window_slots"));
  o.window_slots = slots_d.as<const int32_t>();
  o.append_k = o.append_v = kv.as<float>();  // not the window's newest K/V
  EXPECT_TRUE(throws_error(decode, ErrorKind::invalid_argument, "append_k"));
  o.append_k = o.append_v = nullptr;
  o.window_k = kv.as<float>();
  EXPECT_TRUE(throws_error(decode, ErrorKind::invalid_argument, "window_v"));
  o.window_v = kv.as<float>();
  EXPECT_TRUE(throws_error(
      [&] { device_prefill_attention(dev, 0, tables, 0, 10, 1, 4, q.as<float>(), out.as<float>(), ws, o); },
      ErrorKind::invalid_argument, "window_k"));
  EXPECT_TRUE(throws_error([&] { device_window_write(dev, win, 0, 1, 0, 1, kv.as<float>(), kv.as<float>()); },
                           ErrorKind::invalid_argument, "slot"));
  const KvCacheConfig other = make_config(KvFormat::tq4, KvFormat::tq4, 16, 4, 4);
  DeviceKvWindow wrong(other, 8, 16, 1);
  o.window_k = o.window_v = nullptr;
  o.window = &wrong;
  EXPECT_TRUE(throws_error(decode, ErrorKind::invalid_argument, "window"));
}

}  // namespace
}  // namespace lowbit::kv
