// Shared helpers of the KV-cache tests: random K/V/Q data (plain and with
// outlier channels), cosine similarity, relative error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

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
