#include "lowbit/engine/cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "lowbit/core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LOWBIT_ENGINE_X86 1
#endif

namespace lowbit::engine::cpu {

const char* isa_name(Isa isa) { return isa == Isa::avx2 ? "avx2" : "portable"; }

Isa best_isa() {
#if LOWBIT_ENGINE_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok ? Isa::avx2 : Isa::portable;
#else
  return Isa::portable;
#endif
}

namespace {

std::atomic<int> g_isa{-1};

Isa initial_isa() {
  if (const char* env = std::getenv("LOWBIT_ENGINE_ISA"); env != nullptr && std::string_view(env) == "portable")
    return Isa::portable;
  return best_isa();
}

constexpr int64_t kTileRows = 4;  // rows of x that share one pass over a weight row

// Sums of x over each group of `group` columns: xs[m][g].
void group_sums(const float* x, int64_t M, int64_t K, int64_t group, std::vector<float>& xs) {
  const int64_t G = K / group;
  xs.assign(static_cast<size_t>(M * G), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.0f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) s += x[m * K + k];
      xs[static_cast<size_t>(m * G + g)] = s;
    }
}

// ---- portable kernels ----------------------------------------------------------
// Each computes output rows [n0, n1) for all M rows of x.

void w4_rows_portable(const WeightMatrix& w, const float* x, int64_t M, const float* xs, float* y, int64_t n0,
                      int64_t n1) {
  const int64_t K = w.cols, N = w.rows, G = w.groups_per_row(), gs = w.group_size;
  float q[kW4BlockCols];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.codes.data() + n * (K / 2);
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        float acc = 0.0f;
        for (int64_t b = g * gs / kW4BlockCols; b < (g + 1) * gs / kW4BlockCols; ++b) {
          const uint8_t* blk = row + b * 16;
          for (int j = 0; j < 16; ++j) {
            q[j] = static_cast<float>(blk[j] & 0x0F);
            q[j + 16] = static_cast<float>(blk[j] >> 4);
          }
          const float* xb = x + m * K + b * kW4BlockCols;
          for (int j = 0; j < kW4BlockCols; ++j) acc += q[j] * xb[j];
        }
        total += w.scales[static_cast<size_t>(n * G + g)] * acc + w.mins[static_cast<size_t>(n * G + g)] * xs[m * G + g];
      }
      y[m * N + n] = total;
    }
  }
}

void q8_rows_portable(const WeightMatrix& w, const float* x, int64_t M, float* y, int64_t n0, int64_t n1) {
  const int64_t K = w.cols, N = w.rows, G = w.groups_per_row();
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = reinterpret_cast<const int8_t*>(w.codes.data()) + n * K;
    for (int64_t m = 0; m < M; ++m) {
      float total = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        float acc = 0.0f;
        for (int64_t k = g * kQ8BlockCols; k < (g + 1) * kQ8BlockCols; ++k) acc += static_cast<float>(row[k]) * x[m * K + k];
        total += w.scales[static_cast<size_t>(n * G + g)] * acc;
      }
      y[m * N + n] = total;
    }
  }
}

void dense_rows_portable(const WeightMatrix& w, const float* x, int64_t M, float* y, int64_t n0, int64_t n1) {
  const int64_t K = w.cols, N = w.rows;
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = n0; n < n1; ++n) {
    const float* r = w.f32.data() + n * K;
    if (w.format == MatrixFormat::f16) {
      w.dequant_row(n, row.data());
      r = row.data();
    }
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += r[k] * x[m * K + k];
      y[m * N + n] = acc;
    }
  }
}

// ---- AVX2 + FMA + F16C kernels -----------------------------------------------------
#if LOWBIT_ENGINE_X86
#define LOWBIT_AVX2 __attribute__((target("avx2,fma,f16c")))

LOWBIT_AVX2 inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 0x55));
  return _mm_cvtss_f32(lo);
}

template <int MT>
LOWBIT_AVX2 void w4_row_tile_avx2(const WeightMatrix& w, const float* x, const float* xs, float* y, int64_t n,
                                  int64_t m0) {
  const int64_t K = w.cols, N = w.rows, G = w.groups_per_row();
  const int64_t blocks_per_group = w.group_size / kW4BlockCols;
  const uint8_t* codes = w.codes.data() + n * (K / 2);
  const float* scales = w.scales.data() + n * G;
  const float* mins = w.mins.data() + n * G;
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  __m256 total[MT];
  float offset[MT];
  for (int m = 0; m < MT; ++m) {
    total[m] = _mm256_setzero_ps();
    offset[m] = 0.0f;
  }
  for (int64_t g = 0; g < G; ++g) {
    __m256 acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b * 16));
      const __m128i lo = _mm_and_si128(raw, low_mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low_mask);
      const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
      const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
      const __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
      const __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
      for (int m = 0; m < MT; ++m) {
        const float* xb = x + (m0 + m) * K + b * kW4BlockCols;
        acc[m] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xb), acc[m]);
        acc[m] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xb + 8), acc[m]);
        acc[m] = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb + 16), acc[m]);
        acc[m] = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb + 24), acc[m]);
      }
    }
    const __m256 s = _mm256_set1_ps(scales[g]);
    for (int m = 0; m < MT; ++m) {
      total[m] = _mm256_fmadd_ps(s, acc[m], total[m]);
      offset[m] += mins[g] * xs[(m0 + m) * G + g];
    }
  }
  for (int m = 0; m < MT; ++m) y[(m0 + m) * N + n] = hsum(total[m]) + offset[m];
}

template <int MT>
LOWBIT_AVX2 void q8_row_tile_avx2(const WeightMatrix& w, const float* x, float* y, int64_t n, int64_t m0) {
  const int64_t K = w.cols, N = w.rows, G = w.groups_per_row();
  const uint8_t* codes = w.codes.data() + n * K;
  const float* scales = w.scales.data() + n * G;
  __m256 total[MT];
  for (int m = 0; m < MT; ++m) total[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* blk = codes + g * kQ8BlockCols;
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16));
    const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
    const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)));
    const __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    const __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    const __m256 s = _mm256_set1_ps(scales[g]);
    for (int m = 0; m < MT; ++m) {
      const float* xb = x + (m0 + m) * K + g * kQ8BlockCols;
      __m256 acc = _mm256_mul_ps(q0, _mm256_loadu_ps(xb));
      acc = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xb + 8), acc);
      acc = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb + 16), acc);
      acc = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb + 24), acc);
      total[m] = _mm256_fmadd_ps(s, acc, total[m]);
    }
  }
  for (int m = 0; m < MT; ++m) y[(m0 + m) * N + n] = hsum(total[m]);
}

template <int MT, bool F16>
LOWBIT_AVX2 void dense_row_tile_avx2(const WeightMatrix& w, const float* x, float* y, int64_t n, int64_t m0) {
  const int64_t K = w.cols, N = w.rows;
  __m256 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
  const int64_t K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv;
    if constexpr (F16)
      wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.f16v.data() + n * K + k)));
    else
      wv = _mm256_loadu_ps(w.f32.data() + n * K + k);
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (m0 + m) * K + k), acc[m]);
  }
  for (int m = 0; m < MT; ++m) {
    float s = hsum(acc[m]);
    for (int64_t k = K8; k < K; ++k) {
      const float wk = F16 ? f16_to_float(w.f16v[static_cast<size_t>(n * K + k)]) : w.f32[static_cast<size_t>(n * K + k)];
      s += wk * x[(m0 + m) * K + k];
    }
    y[(m0 + m) * N + n] = s;
  }
}

// Rows [n0, n1) of the output, all M rows of x in tiles of kTileRows.
template <typename TileFn>
void tiles(int64_t M, int64_t n0, int64_t n1, TileFn&& fn) {
  for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
    const int64_t mt = std::min<int64_t>(kTileRows, M - m0);
    for (int64_t n = n0; n < n1; ++n) fn(n, m0, mt);
  }
}

void rows_avx2(const WeightMatrix& w, const float* x, int64_t M, const float* xs, float* y, int64_t n0, int64_t n1) {
  switch (w.format) {
    case MatrixFormat::w4:
      tiles(M, n0, n1, [&](int64_t n, int64_t m0, int64_t mt) {
        switch (mt) {
          case 1: w4_row_tile_avx2<1>(w, x, xs, y, n, m0); break;
          case 2: w4_row_tile_avx2<2>(w, x, xs, y, n, m0); break;
          case 3: w4_row_tile_avx2<3>(w, x, xs, y, n, m0); break;
          default: w4_row_tile_avx2<4>(w, x, xs, y, n, m0); break;
        }
      });
      return;
    case MatrixFormat::q8:
      tiles(M, n0, n1, [&](int64_t n, int64_t m0, int64_t mt) {
        switch (mt) {
          case 1: q8_row_tile_avx2<1>(w, x, y, n, m0); break;
          case 2: q8_row_tile_avx2<2>(w, x, y, n, m0); break;
          case 3: q8_row_tile_avx2<3>(w, x, y, n, m0); break;
          default: q8_row_tile_avx2<4>(w, x, y, n, m0); break;
        }
      });
      return;
    case MatrixFormat::f16:
      tiles(M, n0, n1, [&](int64_t n, int64_t m0, int64_t mt) {
        switch (mt) {
          case 1: dense_row_tile_avx2<1, true>(w, x, y, n, m0); break;
          case 2: dense_row_tile_avx2<2, true>(w, x, y, n, m0); break;
          case 3: dense_row_tile_avx2<3, true>(w, x, y, n, m0); break;
          default: dense_row_tile_avx2<4, true>(w, x, y, n, m0); break;
        }
      });
      return;
    case MatrixFormat::f32:
      tiles(M, n0, n1, [&](int64_t n, int64_t m0, int64_t mt) {
        switch (mt) {
          case 1: dense_row_tile_avx2<1, false>(w, x, y, n, m0); break;
          case 2: dense_row_tile_avx2<2, false>(w, x, y, n, m0); break;
          case 3: dense_row_tile_avx2<3, false>(w, x, y, n, m0); break;
          default: dense_row_tile_avx2<4, false>(w, x, y, n, m0); break;
        }
      });
      return;
  }
}
#endif  // LOWBIT_ENGINE_X86

void rows_portable(const WeightMatrix& w, const float* x, int64_t M, const float* xs, float* y, int64_t n0,
                   int64_t n1) {
  switch (w.format) {
    case MatrixFormat::w4: w4_rows_portable(w, x, M, xs, y, n0, n1); return;
    case MatrixFormat::q8: q8_rows_portable(w, x, M, y, n0, n1); return;
    case MatrixFormat::f16:
    case MatrixFormat::f32: dense_rows_portable(w, x, M, y, n0, n1); return;
  }
}

}  // namespace

Isa active_isa() {
  int v = g_isa.load();
  if (v < 0) {
    v = static_cast<int>(initial_isa());
    g_isa.store(v);
  }
  return static_cast<Isa>(v);
}

void set_isa(Isa isa) {
  if (isa == Isa::avx2 && best_isa() != Isa::avx2)
    fail(ErrorKind::unsupported, "the avx2 kernels need AVX2, FMA and F16C, which this CPU lacks");
  g_isa.store(static_cast<int>(isa));
}

void matmul(const WeightMatrix& w, const float* x, int64_t M, float* y, ThreadPool* pool) {
  if (M <= 0) return;
  std::vector<float> xs;
  if (w.format == MatrixFormat::w4) group_sums(x, M, w.cols, w.group_size, xs);
  const Isa isa = active_isa();
  const auto body = [&](int64_t n0, int64_t n1) {
#if LOWBIT_ENGINE_X86
    if (isa == Isa::avx2) {
      rows_avx2(w, x, M, xs.data(), y, n0, n1);
      return;
    }
#endif
    (void)isa;
    rows_portable(w, x, M, xs.data(), y, n0, n1);
  };
  // ~16 KiB of weights per chunk at least: small enough to balance, large
  // enough that claiming a chunk costs nothing next to streaming it.
  const int64_t row_bytes = std::max<int64_t>(1, static_cast<int64_t>(w.nbytes()) / w.rows);
  const int64_t grain = std::max<int64_t>(1, 16384 / row_bytes);
  if (pool != nullptr)
    pool->run(0, w.rows, grain, body);
  else
    body(0, w.rows);
}

void matmul_ref(const WeightMatrix& w, const float* x, int64_t M, float* y) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t n = 0; n < w.rows; ++n) {
    w.dequant_row(n, row.data());
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) acc += static_cast<double>(row[static_cast<size_t>(k)]) * x[m * w.cols + k];
      y[m * w.rows + n] = static_cast<float>(acc);
    }
  }
}

}  // namespace lowbit::engine::cpu
