#include "lowbit/ops/layer_ops_ref.h"

#include <cmath>
#include <string>

#include "lowbit/core/error.h"

namespace lowbit::ops {

namespace {

void check_span(size_t have, int64_t need, const char* what) {
  LOWBIT_REQUIRE(need >= 0 && have >= static_cast<size_t>(need), what, ": ", have, " values, need ", (need));
}

void normalize_row(const float* x, const float* w, int64_t dim, float eps, float* y) {
  double sum_sq = 0.0;  // double: the reference must not lose bits on long rows
  for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps));
  for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * inv_rms * w[i];
}

}  // namespace

const char* rope_style_name(RopeStyle style) { return style == RopeStyle::half ? "half" : "interleaved"; }

void rms_norm_ref(std::span<const float> x, std::span<const float> w, int64_t rows, int64_t dim, float eps,
                  std::span<float> y) {
  LOWBIT_REQUIRE(rows >= 0 && dim > 0, "rms_norm: rows >= 0 and dim > 0");
  check_span(x.size(), rows * dim, "rms_norm x");
  check_span(w.size(), dim, "rms_norm w");
  check_span(y.size(), rows * dim, "rms_norm y");
  for (int64_t r = 0; r < rows; ++r) normalize_row(&x[r * dim], w.data(), dim, eps, &y[r * dim]);
}

void add_rms_norm_ref(std::span<float> residual, std::span<const float> x, std::span<const float> w,
                      int64_t rows, int64_t dim, float eps, std::span<float> y) {
  LOWBIT_REQUIRE(rows >= 0 && dim > 0, "add_rms_norm: rows >= 0 and dim > 0");
  check_span(residual.size(), rows * dim, "add_rms_norm residual");
  check_span(x.size(), rows * dim, "add_rms_norm x");
  check_span(w.size(), dim, "add_rms_norm w");
  check_span(y.size(), rows * dim, "add_rms_norm y");
  for (int64_t i = 0; i < rows * dim; ++i) residual[i] += x[i];
  for (int64_t r = 0; r < rows; ++r) normalize_row(&residual[r * dim], w.data(), dim, eps, &y[r * dim]);
}

void rope_ref(std::span<float> x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
              std::span<const int32_t> positions, std::span<const float> inv_freq, RopeStyle style) {
  LOWBIT_REQUIRE(tokens >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0,
                 "rope: head_dim must be even and positive");
  LOWBIT_REQUIRE(token_stride >= heads * head_dim, "rope: token_stride must cover heads * head_dim");
  if (tokens == 0) return;
  check_span(x.size(), (tokens - 1) * token_stride + heads * head_dim, "rope x");
  check_span(positions.size(), tokens, "rope positions");
  const int64_t half = head_dim / 2;
  check_span(inv_freq.size(), half, "rope inv_freq");
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = &x[t * token_stride + h * head_dim];
      for (int64_t i = 0; i < half; ++i) {
        // The angle is rounded to fp32, as HF transformers computes it (and the
        // kernel): at position 32k that rounding alone moves it by ~1e-3 rad.
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        const double c = std::cos(angle), s = std::sin(angle);
        const int64_t a = style == RopeStyle::half ? i : 2 * i;
        const int64_t b = style == RopeStyle::half ? i + half : 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = static_cast<float>(x0 * c - x1 * s);
        v[b] = static_cast<float>(x1 * c + x0 * s);
      }
    }
  }
}

void silu_mul_ref(std::span<const float> gate, std::span<const float> up, int64_t tokens, int64_t width,
                  int64_t row_stride, std::span<float> out) {
  LOWBIT_REQUIRE(tokens >= 0 && width > 0 && row_stride >= width, "silu_mul: row_stride must be >= width");
  if (tokens == 0) return;
  check_span(gate.size(), (tokens - 1) * row_stride + width, "silu_mul gate");
  check_span(up.size(), (tokens - 1) * row_stride + width, "silu_mul up");
  check_span(out.size(), tokens * width, "silu_mul out");
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < width; ++i) {
      const double g = gate[t * row_stride + i];
      out[t * width + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[t * row_stride + i]);
    }
  }
}

void embedding_ref(std::span<const float> table, int64_t vocab, int64_t dim, std::span<const int32_t> ids,
                   std::span<float> out) {
  LOWBIT_REQUIRE(vocab > 0 && dim > 0, "embedding: vocab and dim must be positive");
  check_span(table.size(), vocab * dim, "embedding table");
  check_span(out.size(), static_cast<int64_t>(ids.size()) * dim, "embedding out");
  for (size_t t = 0; t < ids.size(); ++t) {
    LOWBIT_REQUIRE(ids[t] >= 0 && ids[t] < vocab, "embedding: token id ", ids[t], " outside [0, ", vocab,
                   ")");
    for (int64_t i = 0; i < dim; ++i) out[static_cast<int64_t>(t) * dim + i] = table[ids[t] * dim + i];
  }
}

void argmax_ref(std::span<const float> x, int64_t rows, int64_t width, std::span<int32_t> out) {
  LOWBIT_REQUIRE(rows >= 0 && width > 0 && width <= INT32_MAX, "argmax: width must be in [1, 2^31)");
  check_span(x.size(), rows * width, "argmax x");
  check_span(out.size(), rows, "argmax out");
  for (int64_t r = 0; r < rows; ++r) {
    int32_t best = 0;
    float best_value = -INFINITY;
    bool found = false;
    for (int64_t i = 0; i < width; ++i) {
      const float v = x[r * width + i];
      if (std::isnan(v)) continue;
      if (!found || v > best_value) {
        best = static_cast<int32_t>(i);
        best_value = v;
        found = true;
      }
    }
    out[r] = best;
  }
}

}  // namespace lowbit::ops
