// Shared helpers of the KV-cache tests (CPU ones here, the CUDA ones in
// tests/cuda): random K/V/Q data (plain and with outlier channels), a host
// cache holding a batch of sequences, cosine similarity, relative error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "lowbit/kv/paged_cache.h"

namespace lowbit::kv::kvtest {

enum class DataKind {
  gaussian,  // i.i.d. N(0, 1) coordinates
  outliers,  // as gaussian, but K channels j % 16 == 3 (8 of 128) have 6x the
             // standard deviation and mean 8 (the massive channels of LLM keys),
             // and V channels j % 32 == 7 (4 of 128) have 4x the standard deviation
};

// [rows][heads][dim] values for K (is_key) or V; Q uses DataKind::gaussian.
inline std::vector<float> random_rows(int64_t rows, int heads, int dim, uint64_t seed, DataKind kind,
                                      bool is_key) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(rows) * static_cast<size_t>(heads) * static_cast<size_t>(dim));
  for (size_t i = 0; i < out.size(); ++i) {
    const int j = static_cast<int>(i % static_cast<size_t>(dim));
    float x = normal(rng);
    if (kind == DataKind::outliers) {
      if (is_key && j % 16 == 3) x = 6.0f * x + 8.0f;
      if (!is_key && j % 32 == 7) x = 4.0f * x;
    }
    out[i] = x;
  }
  return out;
}

// A host cache holding a batch of sequences of random K/V, with the original
// K/V kept aside. The sequences grow round-robin, `step` tokens at a time,
// each chunk written (every layer) as it is added: their block tables
// interleave, and the writes start mid-page.
struct InterleavedBatch {
  PagedKvCache cache;
  std::vector<int> seqs;
  std::vector<std::vector<float>> k, v;  // per sequence [len][num_kv_heads][head_dim]
  std::vector<int64_t> lengths;

  InterleavedBatch(const KvCacheConfig& config, const std::vector<int64_t>& lens, DataKind kind, uint64_t seed,
                   int64_t step)
      : cache(config), lengths(lens) {
    const int H = config.num_kv_heads, d = config.head_dim;
    for (size_t b = 0; b < lens.size(); ++b) {
      seqs.push_back(cache.add_sequence());
      k.push_back(random_rows(lens[b], H, d, seed + 2 * b, kind, true));
      v.push_back(random_rows(lens[b], H, d, seed + 2 * b + 1, kind, false));
    }
    for (int64_t start = 0;; start += step) {
      bool any = false;
      for (size_t b = 0; b < lens.size(); ++b) {
        const int64_t n = std::min(step, lens[b] - start);
        if (n <= 0) continue;
        any = true;
        EXPECT_EQ(cache.extend(seqs[b], n), start);
        const size_t at = static_cast<size_t>(start) * H * d, count = static_cast<size_t>(n) * H * d;
        for (int layer = 0; layer < config.num_layers; ++layer)
          cache.write(layer, seqs[b], start, n, {k[b].data() + at, count}, {v[b].data() + at, count});
      }
      if (!any) break;
    }
  }
};

inline double cosine(std::span<const float> a, std::span<const float> b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// max |a - b| / max |b|
inline double max_relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

}  // namespace lowbit::kv::kvtest
