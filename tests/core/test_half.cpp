#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "lowbit/core/half.h"

namespace lowbit {
namespace {

// Every binary16 value converts to float and back to the same bits (NaNs stay NaN).
TEST(Half, F16RoundTripsAllBitPatterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const f16 h = f16::from_bits(static_cast<uint16_t>(b));
    const float f = f16_to_float(h);
    const f16 back = float_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(back))) << b;
    } else {
      ASSERT_EQ(back.bits, b) << "bits 0x" << std::hex << b;
    }
  }
}

TEST(Half, F16KnownValues) {
  EXPECT_EQ(float_to_f16(1.0f).bits, 0x3C00);
  EXPECT_EQ(float_to_f16(-2.0f).bits, 0xC000);
  EXPECT_EQ(float_to_f16(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7C00);  // rounds up to inf
  EXPECT_EQ(float_to_f16(5.9604645e-8f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(2.9802322e-8f).bits, 0x0000);  // exactly half of it: ties to even (0)
  EXPECT_EQ(float_to_f16(1.0f + 1.0f / 2048).bits, 0x3C00);  // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + 3.0f / 2048).bits, 0x3C02);  // tie -> even (up)
  EXPECT_FLOAT_EQ(f16_to_float(f16::from_bits(0x3555)), 0.333251953125f);
}

// Rounding is to nearest: for random floats in range, the result is one of the
// two neighbours and the nearer one.
TEST(Half, F16RoundsToNearest) {
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    // Positive values from 2^-26 to 2^15 (subnormals, normals, near overflow).
    const float f = std::ldexp(static_cast<float>(state >> 8) / (1 << 24),
                               static_cast<int>(state % 41) - 25);
    const uint16_t bits = float_to_f16(f).bits;
    const float r = f16_to_float(f16::from_bits(bits));
    const float up = f16_to_float(f16::from_bits(static_cast<uint16_t>(bits + 1)));
    ASSERT_LE(std::fabs(r - f), std::fabs(up - f)) << f;
    if (bits > 0) {
      const float down = f16_to_float(f16::from_bits(static_cast<uint16_t>(bits - 1)));
      ASSERT_LE(std::fabs(r - f), std::fabs(down - f)) << f;
    }
  }
}

TEST(Half, Bf16RoundTripAndRounding) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const bf16 h = bf16::from_bits(static_cast<uint16_t>(b));
    const float f = bf16_to_float(h);
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f).bits, b);
    }
  }
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3F80);
  // 1 + 2^-8 is a tie between 1 and 1+2^-7: rounds to even (1).
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256).bits, 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256).bits, 0x3F82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace lowbit
