// The vector quantizer: index packing layouts, the quantize steps one by one,
// round-trip MSE on random unit vectors (and on vectors with outlier
// channels), bytes per vector, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "error_matchers.h"
#include "kv_test_util.h"
#include "lowbit/core/half.h"
#include "lowbit/kv/round_trip.h"
#include "lowbit/kv/vector_quantizer.h"
#include "tolerances.h"

namespace lowbit::kv {
namespace {

using lowbit::test::throws_error;

TEST(IndexPacking, KnownLayouts) {
  std::vector<uint8_t> idx(32);
  for (int j = 0; j < 32; ++j) idx[j] = static_cast<uint8_t>(j % 16);
  std::vector<uint8_t> p4(16);
  pack_indices(4, idx, p4);
  EXPECT_EQ(p4[0], 0x10);  // idx[0] = 0 low nibble, idx[1] = 1 high nibble
  EXPECT_EQ(p4[1], 0x32);
  EXPECT_EQ(p4[7], 0xFE);
  EXPECT_EQ(p4[8], 0x10);

  for (int j = 0; j < 32; ++j) idx[j] = static_cast<uint8_t>(j % 4);
  std::vector<uint8_t> p2(8);
  pack_indices(2, idx, p2);
  for (uint8_t b : p2) EXPECT_EQ(b, 0xE4);  // 3<<6 | 2<<4 | 1<<2 | 0

  // 3 bits: a 2-bit plane (d/4 bytes) then the high bits (d/8 bytes).
  for (int j = 0; j < 32; ++j) idx[j] = static_cast<uint8_t>(j % 8);
  std::vector<uint8_t> p3(12);
  pack_indices(3, idx, p3);
  for (int b = 0; b < 8; ++b) EXPECT_EQ(p3[b], 0xE4) << b;   // low bits of 0..7 repeat 0,1,2,3
  for (int b = 8; b < 12; ++b) EXPECT_EQ(p3[b], 0xF0) << b;  // idx 4..7 of each group of 8 have bit 2 set
}

TEST(IndexPacking, RoundTripsEveryWidth) {
  std::mt19937 rng(3);
  for (int bits : {2, 3, 4})
    for (int dim : {8, 32, 128, 1024}) {
      std::vector<uint8_t> idx(static_cast<size_t>(dim)), back(idx.size());
      for (auto& v : idx) v = static_cast<uint8_t>(rng() % (1u << bits));
      std::vector<uint8_t> packed(packed_index_bytes(bits, dim));
      EXPECT_EQ(packed.size(), static_cast<size_t>(dim * bits / 8));
      pack_indices(bits, idx, packed);
      unpack_indices(bits, packed, back);
      EXPECT_EQ(idx, back) << bits << " bits, dim " << dim;
    }
}

std::vector<float> random_unit_vector(std::mt19937_64& rng, int d) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(d));
  double n2 = 0;
  for (auto& v : x) {
    v = normal(rng);
    n2 += static_cast<double>(v) * v;
  }
  for (auto& v : x) v = static_cast<float>(v / std::sqrt(n2));
  return x;
}

double mean_relative_mse(const VectorQuantizer& q, const Rotation& r,
                         const std::vector<std::vector<float>>& xs) {
  std::vector<uint8_t> codes(q.code_bytes());
  std::vector<std::byte> scale(q.scale_bytes());
  std::vector<float> back(static_cast<size_t>(q.dim()));
  double total = 0;
  for (const auto& x : xs) {
    q.quantize(r, x, codes, scale);
    q.dequantize(r, codes, scale, back);
    double err = 0, norm = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      err += (static_cast<double>(x[j]) - back[j]) * (static_cast<double>(x[j]) - back[j]);
      norm += static_cast<double>(x[j]) * x[j];
    }
    total += err / norm;
  }
  return total / static_cast<double>(xs.size());
}

double mse_bound(int bits) {
  return bits == 4 ? test::kRoundTripMseTq4 : bits == 3 ? test::kRoundTripMseTq3 : test::kRoundTripMseTq2;
}

TEST(VectorQuantizer, RoundTripMseOnRandomUnitVectorsD128) {
  std::mt19937_64 rng(11);
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 4000; ++i) xs.push_back(random_unit_vector(rng, 128));
  for (RotationKind kind : {RotationKind::haar, RotationKind::hadamard})
    for (int bits : {2, 3, 4})
      for (bool renormalize : {true, false}) {
        const VectorQuantizer q(bits, 128, {ScaleDType::f16, renormalize});
        const double mse = mean_relative_mse(q, Rotation::make(kind, 128, 42), xs);
        SCOPED_TRACE(std::string(rotation_kind_name(kind)) + ", " + std::to_string(bits) +
                     " bits, renormalize " + std::to_string(renormalize) + ": mse " + std::to_string(mse));
        EXPECT_LE(mse, mse_bound(bits));
        EXPECT_GE(mse, test::kRoundTripMseMinFractionOfTheory * q.codebook().unit_vector_mse);
      }
}

TEST(VectorQuantizer, RotationMakesOutlierChannelsHarmless) {
  // Without a rotation a per-vector scalar quantizer spends its range on the
  // outlier channels; after it, every unit vector looks alike.
  const std::vector<float> rows = kvtest::random_rows(2000, 1, 128, 5, kvtest::DataKind::outliers, true);
  std::vector<std::vector<float>> xs;
  for (int i = 0; i < 2000; ++i) xs.emplace_back(rows.begin() + i * 128, rows.begin() + (i + 1) * 128);
  for (RotationKind kind : {RotationKind::haar, RotationKind::hadamard}) {
    const double mse = mean_relative_mse(VectorQuantizer(4, 128), Rotation::make(kind, 128, 42), xs);
    EXPECT_LE(mse, test::kRoundTripMseTq4) << rotation_kind_name(kind);
  }
}

TEST(VectorQuantizer, QuantizeFollowsTheDocumentedSteps) {
  const Rotation r = Rotation::haar(64, 9);
  std::mt19937_64 rng(2);
  std::vector<float> x = random_unit_vector(rng, 64);
  for (auto& v : x) v *= 3.5f;  // norm 3.5
  for (bool renormalize : {false, true}) {
    const VectorQuantizer q(4, 64, {ScaleDType::f32, renormalize});
    std::vector<uint8_t> codes(q.code_bytes());
    std::vector<std::byte> scale(q.scale_bytes());
    q.quantize(r, x, codes, scale);
    // Steps 1-4 by hand.
    double n2 = 0;
    for (float v : x) n2 += static_cast<double>(v) * v;
    const float gamma = static_cast<float>(std::sqrt(n2));
    std::vector<float> unit(64), y(64);
    for (int j = 0; j < 64; ++j) unit[j] = x[j] / gamma;
    r.rotate(unit, y);
    std::vector<uint8_t> idx(64), stored(64);
    for (int j = 0; j < 64; ++j) idx[j] = static_cast<uint8_t>(bucketize(q.codebook().boundaries_f32, y[j]));
    unpack_indices(4, codes, stored);
    EXPECT_EQ(stored, idx);
    // Step 5: the scale, and the reconstruction's norm.
    double c2 = 0;
    for (uint8_t i : idx)
      c2 += static_cast<double>(q.codebook().centroids_f32[i]) * q.codebook().centroids_f32[i];
    const float expected = renormalize ? static_cast<float>(std::sqrt(n2) / std::sqrt(c2)) : gamma;
    EXPECT_EQ(q.load_scale(scale), expected);
    std::vector<float> back(64);
    q.dequantize(r, codes, scale, back);
    double b2 = 0;
    for (float v : back) b2 += static_cast<double>(v) * v;
    if (renormalize) {
      EXPECT_NEAR(std::sqrt(b2), 3.5, 1e-5);
    } else {
      EXPECT_LT(std::sqrt(b2), 3.5);  // Lloyd-Max centroids shrink toward the cell means
    }
  }
  // f16 scale: the f32 value rounded to nearest even.
  const VectorQuantizer q32(3, 64, {ScaleDType::f32, true}), q16(3, 64, {ScaleDType::f16, true});
  std::vector<uint8_t> c32(q32.code_bytes()), c16(q16.code_bytes());
  std::vector<std::byte> s32(4), s16(2);
  q32.quantize(r, x, c32, s32);
  q16.quantize(r, x, c16, s16);
  EXPECT_EQ(c32, c16);
  uint16_t bits16;
  std::memcpy(&bits16, s16.data(), 2);
  EXPECT_EQ(bits16, float_to_f16(q32.load_scale(s32)).bits);
}

TEST(VectorQuantizer, ZeroVectorHasScaleZero) {
  const VectorQuantizer q(4, 32);
  const Rotation r = Rotation::hadamard(32, 1);
  std::vector<float> x(32, 0.0f), back(32, 1.0f);
  std::vector<uint8_t> codes(q.code_bytes());
  std::vector<std::byte> scale(q.scale_bytes());
  q.quantize(r, x, codes, scale);
  EXPECT_EQ(q.load_scale(scale), 0.0f);
  q.dequantize(r, codes, scale, back);
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

TEST(VectorQuantizer, BytesPerVector) {
  EXPECT_EQ(kv_vector_bytes(KvFormat::tq4, 128, ScaleDType::f16), 66u);  // the target: <= 68
  EXPECT_EQ(kv_vector_bytes(KvFormat::tq4, 128, ScaleDType::f32), 68u);
  EXPECT_EQ(kv_vector_bytes(KvFormat::tq3, 128, ScaleDType::f16), 50u);
  EXPECT_EQ(kv_vector_bytes(KvFormat::tq2, 128, ScaleDType::f16), 34u);
  EXPECT_EQ(kv_vector_bytes(KvFormat::fp16, 128, ScaleDType::f16), 256u);
  EXPECT_EQ(kv_vector_bytes(KvFormat::tq4, 64, ScaleDType::f16), 34u);
  const VectorQuantizer q(4, 128);
  EXPECT_EQ(q.code_bytes() + q.scale_bytes(), 66u);
  EXPECT_EQ(kv_format_bits(KvFormat::tq3), 3);
  EXPECT_EQ(parse_kv_format("tq2"), KvFormat::tq2);
  EXPECT_EQ(parse_kv_format("int4"), std::nullopt);
  EXPECT_EQ(parse_scale_dtype("f32"), ScaleDType::f32);
}

TEST(VectorQuantizer, MeasureRoundTripAgreesWithTheory) {
  RoundTripOptions o;
  o.n = 3000;
  o.seed = 4;
  const RoundTripReport r = measure_round_trip(o);
  EXPECT_LE(r.relative_mse, test::kRoundTripMseTq4);
  EXPECT_GE(r.relative_mse, test::kRoundTripMseMinFractionOfTheory * r.theory_mse);
  EXPECT_NEAR(r.theory_mse, 0.0095, 1e-4);
  EXPECT_NEAR(r.cosine_mean, std::sqrt(1.0 - r.relative_mse), 2e-3);
  // An isotropic error gives RMS(<y, e>) / (||y|| ||x||) = sqrt(MSE / d).
  EXPECT_NEAR(r.ip_rmse / r.ip_rmse_theory, 1.0, 0.1);
  EXPECT_LT(std::abs(r.ip_bias), 3 * r.ip_rmse / std::sqrt(3000.0));
  EXPECT_EQ(r.bytes_per_vector, 66);
  // Same seed, same numbers; another seed, other numbers.
  EXPECT_EQ(measure_round_trip(o).relative_mse, r.relative_mse);
  o.seed = 5;
  EXPECT_NE(measure_round_trip(o).relative_mse, r.relative_mse);
}

TEST(VectorQuantizer, ErrorsNameTheArgument) {
  EXPECT_TRUE(throws_error([] { (void)VectorQuantizer(5, 128); }, ErrorKind::invalid_argument,
                           {"'bits' = 5", "2, 3 or 4"}));
  EXPECT_TRUE(throws_error([] { (void)VectorQuantizer(4, 100); }, ErrorKind::invalid_argument,
                           {"'dim' = 100", "multiple of 32"}));
  EXPECT_TRUE(
      throws_error([] { (void)VectorQuantizer(4, 2048); }, ErrorKind::invalid_argument, "'dim' = 2048"));
  const VectorQuantizer q(4, 32);
  const Rotation r = Rotation::haar(32, 1);
  std::vector<uint8_t> codes(q.code_bytes());
  std::vector<std::byte> scale(q.scale_bytes());
  std::vector<float> x(32, 1.0f);
  x[5] = std::nanf("");
  EXPECT_TRUE(throws_error([&] { q.quantize(r, x, codes, scale); }, ErrorKind::invalid_argument,
                           {"'x'", "x[5]", "finite"}));
  x[5] = 1e5f;  // norm ~1e5: beyond f16's 65504
  EXPECT_TRUE(
      throws_error([&] { q.quantize(r, x, codes, scale); }, ErrorKind::invalid_argument, {"65504", "f32"}));
  x[5] = 1.0f;
  std::vector<float> short_x(31);
  EXPECT_TRUE(throws_error([&] { q.quantize(r, short_x, codes, scale); }, ErrorKind::invalid_argument,
                           "'x' has 31 values"));
  std::vector<uint8_t> short_codes(15);
  EXPECT_TRUE(throws_error([&] { q.quantize(r, x, short_codes, scale); }, ErrorKind::invalid_argument,
                           "'codes' has 15"));
  EXPECT_TRUE(throws_error([&] { q.quantize(Rotation::haar(64, 1), x, codes, scale); },
                           ErrorKind::invalid_argument, "'rotation.dim()' = 64"));
  std::vector<uint8_t> idx(32, 16), packed(16);
  EXPECT_TRUE(
      throws_error([&] { pack_indices(4, idx, packed); }, ErrorKind::invalid_argument, {"indices[0] = 16"}));
  EXPECT_TRUE(
      throws_error([] { (void)packed_index_bytes(4, 12); }, ErrorKind::invalid_argument, "'dim' = 12"));
}

}  // namespace
}  // namespace lowbit::kv
