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
