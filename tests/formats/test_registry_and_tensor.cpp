// The layout registry (built-ins, registration, the repack seam) and HostTensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "error_matchers.h"
#include "lowbit/formats/dequant_ref.h"
#include "lowbit/formats/host_tensor.h"
#include "lowbit/formats/layout_registry.h"
#include "random_layers.h"

namespace lowbit::formats {
namespace {

using test::throws_error;
using test::ZeroKind;

TEST(LayoutRegistry, BuiltInsArePresentWithDescriptions) {
  const std::vector<std::string> names = layout_names();
  for (const char* name : {"gptq", "gptq_v2", "awq", "float_zero", "q4_1"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
    const LayoutCodec& c = find_layout(name);
    EXPECT_EQ(c.name, name);
    EXPECT_FALSE(c.description.empty());
  }
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

// A stand-in for the GPU GEMM's tiled layout: codes stored one per byte,
// transposed to [N, K], plus the scales and zeros as given.
LayoutCodec transposed_bytes_codec(const std::string& name) {
  LayoutCodec c;
  c.name = name;
  c.description = "test: codes u8 [N, K], scales f16 [G, N], zeros u8 [G, N]";
  c.pack = [name](const QuantizedLinear& layer) {
    PackedLinear p{name, layer.K, layer.N, layer.group_size, layer.zero_point, {}};
    HostTensor codes = HostTensor::make(DType::u8, {layer.N, layer.K});
    for (int64_t k = 0; k < layer.K; ++k)
      for (int64_t n = 0; n < layer.N; ++n)
        codes.span<uint8_t>()[static_cast<size_t>(n * layer.K + k)] =
            layer.codes[static_cast<size_t>(k * layer.N + n)];
    HostTensor scales = HostTensor::make(DType::f16, {layer.num_groups(), layer.N});
    std::copy(layer.scales.begin(), layer.scales.end(), scales.span<f16>().begin());
    HostTensor zeros = HostTensor::make(DType::u8, {layer.num_groups(), layer.N});
    std::copy(layer.zeros.begin(), layer.zeros.end(), zeros.span<uint8_t>().begin());
    p.tensors["codes"] = std::move(codes);
    p.tensors["scales"] = std::move(scales);
    p.tensors["qzeros"] = std::move(zeros);
    return p;
  };
  c.unpack = [](const PackedLinear& p) {
    QuantizedLinear q = QuantizedLinear::allocate(p.K, p.N, p.group_size, ZeroPoint::integer);
    const auto codes = p.tensor("codes").span<uint8_t>();
    for (int64_t k = 0; k < p.K; ++k)
      for (int64_t n = 0; n < p.N; ++n)
        q.codes[static_cast<size_t>(k * p.N + n)] = codes[static_cast<size_t>(n * p.K + k)];
    const auto scales = p.tensor("scales").span<f16>();
    q.scales.assign(scales.begin(), scales.end());
    const auto zeros = p.tensor("qzeros").span<uint8_t>();
    q.zeros.assign(zeros.begin(), zeros.end());
    return q;
  };
  return c;
}

TEST(LayoutRegistry, ACustomLayoutJoinsTheRepackSeam) {
  register_layout(transposed_bytes_codec("test_transposed_bytes"));
  const std::vector<std::string> names = layout_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "test_transposed_bytes"), names.end());
  // GPTQ checkpoint -> custom layout -> AWQ, with the same weights all along.
  const QuantizedLinear layer = test::random_layer(256, 16, 64, ZeroKind::asym_v1, 51);
  const PackedLinear gptq = pack(layer, "gptq");
  const PackedLinear custom = repack(gptq, "test_transposed_bytes");
  EXPECT_EQ(custom.layout, "test_transposed_bytes");
  EXPECT_EQ(unpack(custom), layer);
  EXPECT_EQ(unpack(repack(custom, "awq")), layer);
  // Duplicate names are refused.
  EXPECT_TRUE(throws_error([&] { register_layout(transposed_bytes_codec("test_transposed_bytes")); },
                           ErrorKind::invalid_argument, {"'codec.name' = \"test_transposed_bytes\"", "already"}));
  EXPECT_TRUE(throws_error([&] { register_layout(transposed_bytes_codec("gptq")); },
                           ErrorKind::invalid_argument, "already registered"));
  LayoutCodec empty;
  EXPECT_TRUE(throws_error([&] { register_layout(empty); }, ErrorKind::invalid_argument, "'codec.name'"));
  LayoutCodec no_functions;
  no_functions.name = "test_no_functions";
  EXPECT_TRUE(throws_error([&] { register_layout(no_functions); }, ErrorKind::invalid_argument,
                           {"'codec'", "pack and an unpack"}));
}

TEST(LayoutRegistry, ConcurrentFirstUseIsSafe) {
  std::vector<std::thread> threads;
  std::vector<size_t> counts(4);
  for (size_t i = 0; i < counts.size(); ++i)
    threads.emplace_back([&counts, i] { counts[i] = layout_names().size(); });
  for (auto& t : threads) t.join();
  for (size_t c : counts) EXPECT_GE(c, 5u);
}

TEST(LayoutRegistry, PackedSizesAreFourBitsPerWeightPlusMetadata) {
  const QuantizedLinear layer = test::random_layer(4096, 64, 128, ZeroKind::asym_v1, 52);
  const size_t codes = 4096 * 64 / 2, scales = 32 * 64 * 2, zeros = 32 * 64 / 2;
  EXPECT_EQ(pack(layer, "awq").nbytes(), codes + scales + zeros);
  EXPECT_EQ(pack(layer, "gptq").nbytes(), codes + scales + zeros + 4096 * 4);  // + g_idx
  EXPECT_EQ(pack(layer, "float_zero").nbytes(), codes + scales + 32 * 64 * 4);
}

TEST(HostTensor, MakeSpanAndView) {
  HostTensor t = HostTensor::make(DType::i32, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.bytes.size(), 48u);
  EXPECT_EQ(t.describe(), "[3, 4] i32");
  for (int32_t v : t.span<int32_t>()) EXPECT_EQ(v, 0);
  t.span<int32_t>()[5] = 42;
  const TensorView v = t.view();
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.shape[1], 4);
  EXPECT_EQ(v.strides[0], 4);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.as<int32_t>()[5], 42);
  EXPECT_TRUE(throws_error([&] { (void)t.span<float>(); }, ErrorKind::invalid_argument,
                           {"span<f32>", "dtype i32"}));
  EXPECT_TRUE(throws_error([&] { (void)t.span<f16>(); }, ErrorKind::invalid_argument, "span<f16>"));
  EXPECT_EQ(HostTensor::make(DType::u4x2, {3, 5}).bytes.size(), 8u);
  EXPECT_EQ(HostTensor::make(DType::f32, {}).numel(), 1);
  EXPECT_TRUE(throws_error([&] { (void)HostTensor::make(DType::f32, {2, -1}); },
                           ErrorKind::invalid_argument, "'shape' = -1"));
}

TEST(HostTensor, CopyOfStridedView) {
  // A [3, 4] f16 view with a row stride of 6 and a [4, 3] transposed view.
  std::vector<f16> data(18);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float_to_f16(static_cast<float>(i));
  TensorView v = TensorView::contiguous(data.data(), DType::f16, {3, 4});
  v.strides = {6, 1};
  const HostTensor c = HostTensor::copy_of(v);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{3, 4}));
  const auto s = c.span<f16>();
  EXPECT_EQ(f16_to_float(s[0]), 0.0f);
  EXPECT_EQ(f16_to_float(s[4]), 6.0f);
  EXPECT_EQ(f16_to_float(s[11]), 15.0f);
  TensorView t = TensorView::contiguous(data.data(), DType::f16, {4, 3});
  t.strides = {1, 6};
  const HostTensor tc = HostTensor::copy_of(t);
  const auto ts = tc.span<f16>();
  EXPECT_EQ(f16_to_float(ts[1]), 6.0f);   // [0, 1]
  EXPECT_EQ(f16_to_float(ts[3]), 1.0f);   // [1, 0]
  EXPECT_EQ(f16_to_float(ts[11]), 15.0f); // [3, 2]
  // Contiguous copies equal the original bytes.
  const HostTensor whole = HostTensor::copy_of(TensorView::contiguous(data.data(), DType::f16, {18}));
  EXPECT_EQ(std::memcmp(whole.bytes.data(), data.data(), 36), 0);
}

TEST(DequantRef, ViewOutputsMatchTheFloatBuffer) {
  const QuantizedLinear layer = test::random_layer(128, 24, 32, ZeroKind::asym, 53, true);
  std::vector<float> ref(128 * 24);
  dequantize_ref(layer, ref.data());
  for (int64_t k = 0; k < 128; ++k)
    for (int64_t n = 0; n < 24; ++n) ASSERT_EQ(ref[static_cast<size_t>(k * 24 + n)], layer.dequant(k, n));
  std::vector<f16> h(128 * 24);
  dequantize_ref(layer, TensorView::contiguous(h.data(), DType::f16, {128, 24}));
  std::vector<bf16> b(128 * 24);
  dequantize_ref(layer, TensorView::contiguous(b.data(), DType::bf16, {128, 24}));
  std::vector<float> padded(128 * 30, -1.0f);
  TensorView pv = TensorView::contiguous(padded.data(), DType::f32, {128, 24});
  pv.strides = {30, 1};
  dequantize_ref(layer, pv);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(h[i], float_to_f16(ref[i]));
    ASSERT_EQ(b[i], float_to_bf16(ref[i]));
    ASSERT_EQ(padded[(i / 24) * 30 + i % 24], ref[i]);
  }
  EXPECT_EQ(padded[24], -1.0f);  // padding untouched
  EXPECT_TRUE(throws_error([&] { dequantize_ref(layer, TensorView::contiguous(h.data(), DType::f16, {24, 128})); },
                           ErrorKind::invalid_argument, {"'out' with shape [24, 128]", "[128, 24]"}));
  EXPECT_TRUE(throws_error([&] { dequantize_ref(layer, TensorView::contiguous(h.data(), DType::i8, {128, 24})); },
                           ErrorKind::invalid_argument, "'out.dtype' = i8"));
}

}  // namespace
}  // namespace lowbit::formats
