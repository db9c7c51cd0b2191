// The decoder-layer kernels (lowbit/ops/layer_ops_cuda.h) against their fp32
// references, in f32, f16 and bf16, on random data with outputs poisoned
// (all bits set: NaN in every float type) so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "error_matchers.h"
#include "gpu_test_util.h"
#include "lowbit/core/half.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/check.h"
#include "lowbit/ops/layer_ops_cuda.h"
#include "tolerances.h"

namespace lowbit::ops {
namespace {

// Host values stored in `dtype`, and the same values read back as floats (the
// references run on exactly what the kernels see).
struct DeviceArray {
  Buffer buffer;
  DType dtype;
  int64_t count;
};

std::vector<float> round_to(DType dtype, std::vector<float> v) {
  for (auto& x : v) {
    if (dtype == DType::f16) x = f16_to_float(float_to_f16(x));
    if (dtype == DType::bf16) x = bf16_to_float(float_to_bf16(x));
  }
  return v;
}

DeviceArray upload(DType dtype, const std::vector<float>& v) {
  DeviceArray a{Buffer(std::max<size_t>(dtype_bytes(dtype, v.size()), 1), Device::cuda), dtype,
                static_cast<int64_t>(v.size())};
  std::vector<uint8_t> bytes(dtype_bytes(dtype, v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::f32) std::memcpy(&bytes[4 * i], &v[i], 4);
    if (dtype == DType::f16) {
      const f16 h = float_to_f16(v[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
    if (dtype == DType::bf16) {
      const bf16 h = float_to_bf16(v[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  Buffer::copy(a.buffer.data(), Device::cuda, bytes.data(), Device::cpu, bytes.size());
  return a;
}

DeviceArray poisoned(DType dtype, int64_t count) {
  DeviceArray a{Buffer(std::max<size_t>(dtype_bytes(dtype, static_cast<size_t>(count)), 1), Device::cuda),
                dtype, count};
  LOWBIT_CUDA_CHECK(cudaMemset(a.buffer.data(), 0xFF, a.buffer.size()));
  return a;
}

std::vector<float> download(const DeviceArray& a) {
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> bytes(dtype_bytes(a.dtype, static_cast<size_t>(a.count)));
  Buffer::copy(bytes.data(), Device::cpu, a.buffer.data(), Device::cuda, bytes.size());
  std::vector<float> v(static_cast<size_t>(a.count));
  for (size_t i = 0; i < v.size(); ++i) {
    if (a.dtype == DType::f32) std::memcpy(&v[i], &bytes[4 * i], 4);
    if (a.dtype == DType::f16) {
      f16 h;
      std::memcpy(&h, &bytes[2 * i], 2);
      v[i] = f16_to_float(h);
    }
    if (a.dtype == DType::bf16) {
      bf16 h;
      std::memcpy(&h, &bytes[2 * i], 2);
      v[i] = bf16_to_float(h);
    }
  }
  return v;
}

TensorView view(const DeviceArray& a, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(a.buffer.data(), a.dtype, shape, Device::cuda);
}

std::vector<float> random_values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

double rtol_for(DType dtype) {
  return dtype == DType::f32   ? test::kOpsF32Rtol
         : dtype == DType::f16 ? test::kOpsF16Rtol
                               : test::kOpsBf16Rtol;
}

// Every element within rtol of the reference, with an absolute floor scaled to
// the row's largest value (outputs that cancel to near zero).
::testing::AssertionResult close_rows(const std::vector<float>& got, const std::vector<float>& want,
                                      int64_t width, double rtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t r = 0; r * width < want.size(); ++r) {
    double row_max = 0;
    for (int64_t i = 0; i < width; ++i)
      row_max = std::max(row_max, std::abs(static_cast<double>(want[r * width + i])));
    for (int64_t i = 0; i < width; ++i) {
      const size_t e = r * width + i;
      const double err = std::abs(static_cast<double>(got[e]) - want[e]);
      if (!(err <= rtol * std::abs(want[e]) + test::kOpsAbsFloorVsMax * row_max)) {
        return ::testing::AssertionFailure() << "element " << e << " (row " << r << "): got " << got[e]
                                             << ", want " << want[e] << ", rtol " << rtol;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

const DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

TEST(LayerOpsCuda, RmsNormMatchesReference) {
  LOWBIT_REQUIRE_GPU();
  for (DType dtype : kFloatTypes) {
    for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 5120}, {3, 64}, {17, 4100}, {2, 1}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " rows " + std::to_string(rows) + " dim " +
                   std::to_string(dim));
      const auto x = round_to(dtype, random_values(static_cast<size_t>(rows * dim), 1, 3.0f));
      const auto w = round_to(dtype, random_values(static_cast<size_t>(dim), 2));
      std::vector<float> want(x.size());
      rms_norm_ref(x, w, rows, dim, 1e-6f, want);
      const auto dx = upload(dtype, x), dw = upload(dtype, w);
      const auto dy = poisoned(dtype, rows * dim);
      rms_norm(view(dx, {rows, dim}), view(dw, {dim}), 1e-6f, view(dy, {rows, dim}));
      EXPECT_TRUE(close_rows(download(dy), round_to(dtype, want), dim, rtol_for(dtype)));
    }
  }
}

TEST(LayerOpsCuda, AddRmsNormStoresRoundedResidualAndNormalizesIt) {
  LOWBIT_REQUIRE_GPU();
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t rows = 5, dim = 2048;
    const auto residual = round_to(dtype, random_values(static_cast<size_t>(rows * dim), 3, 4.0f));
    const auto x = round_to(dtype, random_values(static_cast<size_t>(rows * dim), 4));
    const auto w = round_to(dtype, random_values(static_cast<size_t>(dim), 5));
    std::vector<float> sum(residual.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + x[i];
    const auto stored = round_to(dtype, sum);  // fp32 add, one rounding: exact on both sides
    std::vector<float> want(sum.size());
    rms_norm_ref(stored, w, rows, dim, 1e-5f, want);
    const auto dres = upload(dtype, residual), dx = upload(dtype, x), dw = upload(dtype, w);
    const auto dy = poisoned(dtype, rows * dim);
    add_rms_norm(view(dres, {rows, dim}), view(dx, {rows, dim}), view(dw, {dim}), 1e-5f,
                 view(dy, {rows, dim}));
    EXPECT_EQ(download(dres), stored);
    EXPECT_TRUE(close_rows(download(dy), round_to(dtype, want), dim, rtol_for(dtype)));
  }
}

TEST(LayerOpsCuda, RopeOnFusedQkvSliceMatchesReference) {
  LOWBIT_REQUIRE_GPU();
  // q of a fused [tokens, (40 + 2 * 8) * 128] QKV output: a strided view.
  const int64_t tokens = 6, heads = 40, kv_heads = 8, d = 128, stride = (heads + 2 * kv_heads) * d;
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * static_cast<float>(i) / d);
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 32767, 131071};
  Buffer dpos(positions.size() * 4, Device::cuda), dfreq(inv_freq.size() * 4, Device::cuda);
  Buffer::copy(dpos.data(), Device::cuda, positions.data(), Device::cpu, dpos.size());
  Buffer::copy(dfreq.data(), Device::cuda, inv_freq.data(), Device::cpu, dfreq.size());
  for (DType dtype : kFloatTypes) {
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + rope_style_name(style));
      const auto qkv = round_to(dtype, random_values(static_cast<size_t>(tokens * stride), 6));
      std::vector<float> want = qkv;
      rope_ref(want, tokens, heads, d, stride, positions, inv_freq, style);
      const auto dqkv = upload(dtype, qkv);
      TensorView q = TensorView::contiguous(dqkv.buffer.data(), dtype, {tokens, heads, d}, Device::cuda);
      q.strides[0] = stride;
      rope(q, TensorView::contiguous(dpos.data(), DType::i32, {tokens}, Device::cuda),
           TensorView::contiguous(dfreq.data(), DType::f32, {d / 2}, Device::cuda), style);
      // The rotated q within tolerance, k and v untouched (bit for bit).
      const auto got = download(dqkv);
      EXPECT_TRUE(close_rows(got, round_to(dtype, want), stride, rtol_for(dtype)));
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = heads * d; j < stride; ++j) ASSERT_EQ(got[t * stride + j], qkv[t * stride + j]);
    }
  }
}

TEST(LayerOpsCuda, HeadRmsNormOnFusedQkvSlice) {
  LOWBIT_REQUIRE_GPU();
  // k heads of a fused QKV output (Qwen3's k norm): strided tokens.
  const int64_t tokens = 5, q_heads = 4, heads = 2, d = 128, stride = (q_heads + 2 * heads) * d;
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto qkv = round_to(dtype, random_values(static_cast<size_t>(tokens * stride), 11, 2.0f));
    const auto w = round_to(dtype, random_values(static_cast<size_t>(d), 12));
    std::vector<float> want = qkv;
    for (int64_t t = 0; t < tokens; ++t) {
      const size_t at = static_cast<size_t>(t * stride + q_heads * d);
      rms_norm_ref(std::span(qkv).subspan(at, static_cast<size_t>(heads * d)), w, heads, d, 1e-6f,
                   std::span(want).subspan(at, static_cast<size_t>(heads * d)));
    }
    const auto dqkv = upload(dtype, qkv), dw = upload(dtype, w);
    TensorView k = TensorView::contiguous(
        static_cast<char*>(dqkv.buffer.data()) + dtype_bytes(dtype, static_cast<size_t>(q_heads * d)), dtype,
        {tokens, heads, d}, Device::cuda);
    k.strides[0] = stride;
    head_rms_norm(k, view(dw, {d}), 1e-6f);
    const auto got = download(dqkv);
    EXPECT_TRUE(close_rows(got, round_to(dtype, want), d, rtol_for(dtype)));
  }
}

// qkv_to_attention_inputs against (a) the separate kernels it replaces in the
// engine (head_rms_norm, rope, convert_rows): bit for bit, and (b) the fp32
// references composed on the host.
struct QkvCase {
  DType dtype;
  int64_t head_dim;
  RopeStyle style;
  bool qk_norm;
};

std::string describe(const QkvCase& c) {
  return std::string(dtype_name(c.dtype)) + " head_dim " + std::to_string(c.head_dim) + " " +
         rope_style_name(c.style) + (c.qk_norm ? " with q/k norm" : " without q/k norm");
}

// The same bits (NaN == NaN, -0 != +0): what "the same kernels' arithmetic" means.
::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(LayerOpsCuda, QkvToAttentionInputsMatchesSeparateKernelsAndReference) {
  LOWBIT_REQUIRE_GPU();
  // GQA (3 q heads per kv head), a row stride beyond the fused width, and
  // positions from 0 to 128k (large angles: sincosf's slow path).
  const int64_t tokens = 5, heads = 6, kv_heads = 2, pad = 24;
  const float eps = 1e-6f;
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 131071};
  Buffer dpos(positions.size() * 4, Device::cuda);
  Buffer::copy(dpos.data(), Device::cuda, positions.data(), Device::cpu, dpos.size());
  const TensorView pos_view = TensorView::contiguous(dpos.data(), DType::i32, {tokens}, Device::cuda);
  std::vector<QkvCase> cases;
  for (DType dtype : kFloatTypes)
    for (int64_t d : {64, 128})
      for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved})
        for (bool qk_norm : {false, true}) cases.push_back({dtype, d, style, qk_norm});
  for (const QkvCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const int64_t d = c.head_dim, q_dim = heads * d, kv_dim = kv_heads * d;
    const int64_t width = q_dim + 2 * kv_dim, stride = width + pad;
    std::vector<float> inv_freq(static_cast<size_t>(d / 2));
    for (int64_t i = 0; i < d / 2; ++i)
      inv_freq[i] = std::pow(1e6f, -2.0f * static_cast<float>(i) / static_cast<float>(d));
    Buffer dfreq(inv_freq.size() * 4, Device::cuda);
    Buffer::copy(dfreq.data(), Device::cuda, inv_freq.data(), Device::cpu, dfreq.size());
    const TensorView freq_view = TensorView::contiguous(dfreq.data(), DType::f32, {d / 2}, Device::cuda);

    const auto qkv = round_to(c.dtype, random_values(static_cast<size_t>(tokens * stride), 21, 2.0f));
    auto q_w = random_values(static_cast<size_t>(d), 22, 0.3f),
         k_w = random_values(static_cast<size_t>(d), 23, 0.3f);
    for (auto* w : {&q_w, &k_w})
      for (auto& x : *w) x += 1.0f;  // norm weights near 1, as trained ones are
    q_w = round_to(c.dtype, q_w);
    k_w = round_to(c.dtype, k_w);
    const auto dq_w = upload(c.dtype, q_w), dk_w = upload(c.dtype, k_w);
    const TensorView q_w_view = view(dq_w, {d}), k_w_view = view(dk_w, {d});
    auto strided = [&](const DeviceArray& a, int64_t offset, std::initializer_list<int64_t> shape) {
      TensorView t = TensorView::contiguous(
          static_cast<char*>(a.buffer.data()) + dtype_bytes(c.dtype, static_cast<size_t>(offset)), c.dtype,
          shape, Device::cuda);
      t.strides[0] = stride;
      return t;
    };

    // The fused kernel.
    const auto fused_qkv = upload(c.dtype, qkv);
    const auto q = poisoned(DType::f32, tokens * q_dim), k = poisoned(DType::f32, tokens * kv_dim),
               v = poisoned(DType::f32, tokens * kv_dim);
    qkv_to_attention_inputs(strided(fused_qkv, 0, {tokens, width}), heads, kv_heads, d,
                            c.qk_norm ? &q_w_view : nullptr, c.qk_norm ? &k_w_view : nullptr, eps, pos_view,
                            freq_view, c.style, view(q, {tokens, q_dim}), view(k, {tokens, kv_dim}),
                            view(v, {tokens, kv_dim}));
    const auto got_q = download(q), got_k = download(k), got_v = download(v);
    EXPECT_EQ(download(fused_qkv), qkv) << "qkv must be left unchanged";

    // (a) The separate kernels, as the engine ran them: in place on qkv, then widened.
    const auto old_qkv = upload(c.dtype, qkv);
    const TensorView q_heads = strided(old_qkv, 0, {tokens, heads, d});
    const TensorView k_heads = strided(old_qkv, q_dim, {tokens, kv_heads, d});
    if (c.qk_norm) {
      head_rms_norm(q_heads, q_w_view, eps);
      head_rms_norm(k_heads, k_w_view, eps);
    }
    rope(q_heads, pos_view, freq_view, c.style);
    rope(k_heads, pos_view, freq_view, c.style);
    const auto old_q = poisoned(DType::f32, tokens * q_dim), old_k = poisoned(DType::f32, tokens * kv_dim),
               old_v = poisoned(DType::f32, tokens * kv_dim);
    convert_rows(strided(old_qkv, 0, {tokens, q_dim}), view(old_q, {tokens, q_dim}));
    convert_rows(strided(old_qkv, q_dim, {tokens, kv_dim}), view(old_k, {tokens, kv_dim}));
    convert_rows(strided(old_qkv, q_dim + kv_dim, {tokens, kv_dim}), view(old_v, {tokens, kv_dim}));
    EXPECT_TRUE(same_bits(got_q, download(old_q))) << "q";
    EXPECT_TRUE(same_bits(got_k, download(old_k))) << "k";
    EXPECT_TRUE(same_bits(got_v, download(old_v))) << "v";

    // (b) The fp32 references: per-head rms_norm_ref, then rope_ref, on
    // exactly the values the kernel read.
    std::vector<float> want_q(static_cast<size_t>(tokens * q_dim)),
        want_k(static_cast<size_t>(tokens * kv_dim)), want_v(static_cast<size_t>(tokens * kv_dim));
    for (int64_t t = 0; t < tokens; ++t) {
      const auto row = std::span(qkv).subspan(static_cast<size_t>(t * stride), static_cast<size_t>(width));
      std::copy_n(row.begin(), q_dim, want_q.begin() + t * q_dim);
      std::copy_n(row.begin() + q_dim, kv_dim, want_k.begin() + t * kv_dim);
      std::copy_n(row.begin() + q_dim + kv_dim, kv_dim, want_v.begin() + t * kv_dim);
    }
    if (c.qk_norm) {
      const std::vector<float> q_in = want_q, k_in = want_k;
      rms_norm_ref(q_in, q_w, tokens * heads, d, eps, want_q);
      rms_norm_ref(k_in, k_w, tokens * kv_heads, d, eps, want_k);
    }
    const std::vector<float> q_rope_in = want_q, k_rope_in = want_k;
    rope_ref(want_q, tokens, heads, d, q_dim, positions, inv_freq, c.style);
    rope_ref(want_k, tokens, kv_heads, d, kv_dim, positions, inv_freq, c.style);
    // The kernel rounds twice to the activation dtype (after the norm, after
    // RoPE). The first rounding moves each rotated coordinate by at most
    // sqrt(2) * 2^-11 (f16; 2^-8 bf16) of the largest magnitude m of its head's
    // RoPE input, so the bound per element is rtol * |want| + rtol * m (rtol
    // is twice the half-ulp), checked head by head.
    const double rtol = rtol_for(c.dtype);
    auto check = [&](const std::vector<float>& got, const std::vector<float>& want,
                     const std::vector<float>& in, const char* what) -> ::testing::AssertionResult {
      for (size_t h = 0; h * d < want.size(); ++h) {
        double m = 0;
        for (int64_t i = 0; i < d; ++i) m = std::max(m, std::abs(static_cast<double>(in[h * d + i])));
        for (int64_t i = 0; i < d; ++i) {
          const size_t e = h * d + i;
          const double err = std::abs(static_cast<double>(got[e]) - want[e]);
          if (!(err <= rtol * (std::abs(want[e]) + m)))
            return ::testing::AssertionFailure()
                   << what << " element " << e << " (head vector " << h << "): got " << got[e] << ", want "
                   << want[e] << ", head max " << m;
        }
      }
      return ::testing::AssertionSuccess();
    };
    EXPECT_TRUE(check(got_q, want_q, q_rope_in, "q"));
    EXPECT_TRUE(check(got_k, want_k, k_rope_in, "k"));
    EXPECT_TRUE(same_bits(got_v, want_v)) << "v is widened exactly";
  }
}

TEST(LayerOpsCuda, QkvToAttentionInputsRejectsBadArguments) {
  LOWBIT_REQUIRE_GPU();
  const int64_t tokens = 2, heads = 4, kv_heads = 2, d = 64;
  const int64_t q_dim = heads * d, kv_dim = kv_heads * d, width = q_dim + 2 * kv_dim;
  const auto qkv = poisoned(DType::f16, tokens * (width + 2)), w = poisoned(DType::f16, d);
  const auto q = poisoned(DType::f32, tokens * q_dim), k = poisoned(DType::f32, tokens * kv_dim),
             v = poisoned(DType::f32, tokens * kv_dim), q16 = poisoned(DType::f16, tokens * q_dim);
  const auto pos = poisoned(DType::i32, tokens), freq = poisoned(DType::f32, d / 2);
  const TensorView w_view = view(w, {d});
  auto call = [&](const TensorView& x, int64_t head_dim, const TensorView& q_out, const TensorView& k_out) {
    qkv_to_attention_inputs(x, heads, kv_heads, head_dim, &w_view, &w_view, 1e-6f, view(pos, {tokens}),
                            view(freq, {d / 2}), RopeStyle::half, q_out, k_out, view(v, {tokens, kv_dim}));
  };
  // The valid call, for contrast (the buffers hold NaN; nothing is checked).
  EXPECT_NO_THROW(call(view(qkv, {tokens, width}), d, view(q, {tokens, q_dim}), view(k, {tokens, kv_dim})));
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(test::throws_error(
      [&] {
        call(view(qkv, {tokens, width + 2}), d, view(q, {tokens, q_dim}), view(k, {tokens, kv_dim}));
      },
      ErrorKind::invalid_argument, "columns"));
  // An odd head_dim whose fused width matches: only the parity is wrong.
  EXPECT_TRUE(test::throws_error(
      [&] {
        call(view(qkv, {tokens, (heads + 2 * kv_heads) * 63}), 63, view(q, {tokens, heads * 63}),
             view(k, {tokens, kv_heads * 63}));
      },
      ErrorKind::invalid_argument, "head_dim must be even"));
  EXPECT_TRUE(test::throws_error(
      [&] {
        call(view(qkv, {tokens, width}), d, view(q, {tokens, q_dim - 1}), view(k, {tokens, kv_dim}));
      },
      ErrorKind::invalid_argument, "q_out must be contiguous"));
  EXPECT_TRUE(test::throws_error(
      [&] {
        call(view(qkv, {tokens, width}), d, view(q, {tokens, q_dim}), view(q, {tokens, kv_dim + d}));
      },
      ErrorKind::invalid_argument, "k_out must be contiguous"));
  EXPECT_TRUE(test::throws_error(
      [&] {
        call(view(qkv, {tokens, width}), d, view(q16, {tokens, q_dim}), view(k, {tokens, kv_dim}));
      },
      ErrorKind::invalid_argument, "q_out is f16"));
  const TensorView short_w = view(w, {d / 2});
  EXPECT_TRUE(test::throws_error(
      [&] {
        qkv_to_attention_inputs(view(qkv, {tokens, width}), heads, kv_heads, d, nullptr, &short_w, 1e-6f,
                                view(pos, {tokens}), view(freq, {d / 2}), RopeStyle::half,
                                view(q, {tokens, q_dim}), view(k, {tokens, kv_dim}),
                                view(v, {tokens, kv_dim}));
      },
      ErrorKind::invalid_argument, "norm weight must be [head_dim]"));
  EXPECT_TRUE(test::throws_error(
      [&] {
        qkv_to_attention_inputs(view(qkv, {tokens, width}), heads, kv_heads, d, nullptr, nullptr, 1e-6f,
                                view(pos, {tokens - 1}), view(freq, {d / 2}), RopeStyle::half,
                                view(q, {tokens, q_dim}), view(k, {tokens, kv_dim}),
                                view(v, {tokens, kv_dim}));
      },
      ErrorKind::invalid_argument, "positions must be i32 [tokens]"));
}

TEST(LayerOpsCuda, ConvertRowsRoundsOnceFromStridedRows) {
  LOWBIT_REQUIRE_GPU();
  const int64_t rows = 9, cols = 300, stride = 333;
  const auto src = random_values(static_cast<size_t>(rows * stride), 13, 5.0f);
  for (DType from : kFloatTypes) {
    for (DType to : kFloatTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      const auto values = round_to(from, src);
      std::vector<float> want;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) want.push_back(values[r * stride + c]);
      want = round_to(to, want);
      const auto dsrc = upload(from, values);
      const auto ddst = poisoned(to, rows * cols);
      TensorView s = TensorView::contiguous(dsrc.buffer.data(), from, {rows, cols}, Device::cuda);
      s.strides[0] = stride;
      convert_rows(s, view(ddst, {rows, cols}));
      EXPECT_EQ(download(ddst), want);  // one rounding of an exact value: bit-exact
    }
  }
}

TEST(LayerOpsCuda, SiluMulOnFusedGateUp) {
  LOWBIT_REQUIRE_GPU();
  const int64_t tokens = 7, width = 1000;
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto fused = round_to(dtype, random_values(static_cast<size_t>(tokens * 2 * width), 8, 2.0f));
    std::vector<float> want(static_cast<size_t>(tokens * width));
    silu_mul_ref(fused, std::span(fused).subspan(static_cast<size_t>(width)), tokens, width, 2 * width, want);
    const auto dfused = upload(dtype, fused);
    const auto dout = poisoned(dtype, tokens * width);
    TensorView gate = TensorView::contiguous(dfused.buffer.data(), dtype, {tokens, width}, Device::cuda);
    gate.strides[0] = 2 * width;
    TensorView up = gate;
    up.data = static_cast<char*>(dfused.buffer.data()) + dtype_bytes(dtype, static_cast<size_t>(width));
    silu_mul(gate, up, view(dout, {tokens, width}));
    EXPECT_TRUE(close_rows(download(dout), round_to(dtype, want), width, rtol_for(dtype)));
  }
}

TEST(LayerOpsCuda, EmbeddingCopiesRowsAndPoisonsBadIds) {
  LOWBIT_REQUIRE_GPU();
  const int64_t vocab = 50, dim = 96;
  const std::vector<int32_t> ids = {3, 49, 0, 3, 50, -1};
  Buffer dids(ids.size() * 4, Device::cuda);
  Buffer::copy(dids.data(), Device::cuda, ids.data(), Device::cpu, dids.size());
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto table = round_to(dtype, random_values(static_cast<size_t>(vocab * dim), 9));
    const auto dtable = upload(dtype, table);
    const auto dout = poisoned(dtype, 6 * dim);
    LOWBIT_CUDA_CHECK(
        cudaMemset(dout.buffer.data(), 0, dout.buffer.size()));  // NaN must come from the kernel
    embedding(view(dtable, {vocab, dim}), TensorView::contiguous(dids.data(), DType::i32, {6}, Device::cuda),
              view(dout, {6, dim}));
    const auto got = download(dout);
    std::vector<float> want(static_cast<size_t>(4 * dim));
    embedding_ref(table, vocab, dim, std::span(ids).first(4), want);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
    for (int64_t i = 4 * dim; i < 6 * dim; ++i) ASSERT_TRUE(std::isnan(got[i])) << "bad id row must be NaN";
  }
}

TEST(LayerOpsCuda, ArgmaxMatchesReferenceIncludingTiesAndNan) {
  LOWBIT_REQUIRE_GPU();
  const int64_t rows = 5, width = 151936;  // Qwen's vocabulary
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto x = round_to(dtype, random_values(static_cast<size_t>(rows * width), 10));
    x[1 * width + 70000] = 100;  // a tie: the lower index must win
    x[1 * width + 90000] = 100;
    x[2 * width + 5] = NAN;  // NaN never wins
    x[2 * width + 6] = 50;
    std::fill(x.begin() + 3 * width, x.begin() + 4 * width, NAN);  // all NaN -> 0
    x[4 * width + width - 1] = 60;                                 // the last element
    std::vector<int32_t> want(rows);
    argmax_ref(x, rows, width, want);
    EXPECT_EQ(want[1], 70000);
    const auto dx = upload(dtype, x);
    Buffer dout(rows * 4, Device::cuda);
    LOWBIT_CUDA_CHECK(cudaMemset(dout.data(), 0xFF, dout.size()));
    argmax(view(dx, {rows, width}), TensorView::contiguous(dout.data(), DType::i32, {rows}, Device::cuda));
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> got(rows);
    Buffer::copy(got.data(), Device::cpu, dout.data(), Device::cuda, dout.size());
    EXPECT_EQ(got, want);
  }
}

TEST(LayerOpsCuda, BadArgumentsAreErrors) {
  LOWBIT_REQUIRE_GPU();
  const auto a = poisoned(DType::f16, 64), b = poisoned(DType::f32, 64);
  EXPECT_TRUE(test::throws_error(
      [&] {
        rms_norm(view(a, {4, 16}), view(b, {16}), 1e-6f, view(a, {4, 16}));
      },
      ErrorKind::invalid_argument, "rms_norm w"));
  std::vector<float> host(64);
  TensorView on_host = TensorView::contiguous(host.data(), DType::f16, {4, 16});
  EXPECT_TRUE(test::throws_error(
      [&] {
        rms_norm(on_host, view(a, {16}), 1e-6f, view(a, {4, 16}));
      },
      ErrorKind::invalid_argument, "CUDA tensor"));
  const auto i8 = poisoned(DType::i8, 64);
  EXPECT_TRUE(test::throws_error(
      [&] {
        argmax(view(i8, {4, 16}), view(b, {4}));
      },
      ErrorKind::invalid_argument, "i32"));
}

}  // namespace
}  // namespace lowbit::ops
