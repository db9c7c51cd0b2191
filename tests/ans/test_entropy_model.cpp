// The entropy models: statistics, the seed's 8-bit quantile tables as its
// reference encoder builds them, lowbit's P-bit model (optimal, within 2% of
// the entropy), and the checks that refuse malformed tables.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "ans_test_util.h"
#include "tolerances.h"
#include "error_matchers.h"
#include "lowbit/ans/checksum.h"
#include "lowbit/ans/entropy_model.h"
#include "lowbit/ans/rans.h"

namespace {

using namespace lowbit::ans;
using lowbit::ErrorKind;
using lowbit::test::expect_error;
using lowbit::test::ans::Dist;
using lowbit::test::ans::random_matrix;

SymbolCounts counts_of(std::initializer_list<std::pair<int, uint64_t>> values) {
  SymbolCounts c;
  for (auto [v, n] : values) {
    c.count[static_cast<size_t>(v + 128)] = n;
    c.total += n;
  }
  return c;
}

TEST(SymbolCounts, EntropyOfKnownDistributions) {
  EXPECT_DOUBLE_EQ(counts_of({{1, 5}, {2, 5}, {3, 5}, {4, 5}}).entropy_bits(), 2.0);
  EXPECT_DOUBLE_EQ(counts_of({{-7, 9}}).entropy_bits(), 0.0);
  EXPECT_NEAR(counts_of({{0, 3}, {1, 1}}).entropy_bits(), 0.8112781244591328, 1e-15);
  const std::vector<int8_t> data = {-128, 127, 0, 0, 5};
  const SymbolCounts c = SymbolCounts::of(data);
  EXPECT_EQ(c.total, 5u);
  EXPECT_EQ(c.distinct(), 4);
  EXPECT_EQ(c.min_value(), -128);
  EXPECT_EQ(c.max_value(), 127);
  EXPECT_EQ(c.of_value(0), 2u);
}

TEST(SymbolCounts, ParallelCountEqualsSerialCount) {
  const auto m = random_matrix(1500, 1500, Dist::gaussian, 3);  // > 1 MiB: counted in chunks by threads
  SymbolCounts serial;
  for (int8_t v : m.data) ++serial.count[static_cast<size_t>(v + 128)];
  serial.total = m.data.size();
  const SymbolCounts parallel = SymbolCounts::of(m.data);
  EXPECT_EQ(parallel.count, serial.count);
  EXPECT_EQ(parallel.total, serial.total);
}

TEST(SeedModel, FollowsTheReferenceEncoder) {
  // 1000 symbols: round(count * 256 / 1000) = 128, 77, 51 (sum 256): no correction.
  FreqModel m = build_seed_model(counts_of({{-2, 500}, {0, 300}, {1, 200}}));
  EXPECT_EQ(m.precision, 8);
  EXPECT_EQ(m.w_min, -2);
  EXPECT_EQ(m.freq, (std::vector<uint32_t>{128, 0, 77, 51}));  // value -1 is absent: probability 0
  // Rounding up overshoots by 1 (3 x 85.33 -> 85, 3 of them 85 = 255 then max(1, .) of a tiny one):
  // counts 333, 333, 333, 1 -> 85.2, 85.2, 85.2, 0.256 -> 85, 85, 85, 1 = 256: exact.
  m = build_seed_model(counts_of({{0, 333}, {1, 333}, {2, 333}, {3, 1}}));
  EXPECT_EQ(m.freq, (std::vector<uint32_t>{85, 85, 85, 1}));
  // An excess is shaved from the most probable entries first: counts 10 x 1 and
  // one big: 10 values round up to 1 each, the big one to 256 - 0 = 255.7 -> 256;
  // the sum 266 is cut by 10 ... from the entries that still hold > 1 (only the big one).
  m = build_seed_model(counts_of({{0, 100000}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}, {8, 1},
                                  {9, 1}, {10, 1}}));
  EXPECT_EQ(m.freq[0], 246u);
  for (int i = 1; i <= 10; ++i) EXPECT_EQ(m.freq[static_cast<size_t>(i)], 1u);
  // A deficit goes to the least probable entries: counts 2,2,2 of 6 -> 85.33 -> 85 each, sum 255:
  // one unit to the last of the ties (ties sort larger value first, so the last is the smallest value).
  m = build_seed_model(counts_of({{4, 2}, {5, 2}, {6, 2}}));
  EXPECT_EQ(m.freq, (std::vector<uint32_t>{86, 85, 85}));
}

TEST(SeedModel, SingleValueGetsTheReferenceDummySymbol) {
  const FreqModel m = build_seed_model(counts_of({{42, 7}}));
  EXPECT_EQ(m.w_min, 42);
  EXPECT_EQ(m.freq, (std::vector<uint32_t>{255, 1}));
  const SeedTables t = seed_tables(m);
  EXPECT_EQ(t.cdf, (std::vector<uint8_t>{0, 255, 0}));
  EXPECT_EQ(t.ppf[254], 0);
  EXPECT_EQ(t.ppf[255], 1);
}

TEST(SeedModel, RefusesAllTwoHundredFiftySixValues) {
  SymbolCounts c;
  for (auto& n : c.count) n = 1;
  c.total = 256;
  expect_error([&] { build_seed_model(c); }, ErrorKind::unsupported, {"-128..127", "256 grid points", "u8"});
  expect_error([&] { build_seed_model(SymbolCounts{}); }, ErrorKind::invalid_argument, {"counts", "empty"});
}

TEST(SeedModel, TablesRoundTripAndInvertEachOther) {
  const auto data = random_matrix(64, 64, Dist::gaussian, 11).data;
  const FreqModel m = build_seed_model(SymbolCounts::of(data));
  const SeedTables t = seed_tables(m);
  ASSERT_EQ(t.cdf.size(), m.freq.size() + 1);
  EXPECT_EQ(t.cdf.front(), 0);
  EXPECT_EQ(t.cdf.back(), 0);  // 256 stored mod 256
  const FreqModel back = model_from_seed_tables(m.w_min, t.cdf, t.ppf, "t");
  EXPECT_EQ(back.freq, m.freq);
  EXPECT_EQ(back.w_min, m.w_min);
  const std::vector<uint32_t> c = m.cdf();
  for (uint32_t q = 0; q < 256; ++q) {
    const uint32_t s = t.ppf[q];
    EXPECT_TRUE(c[s] <= q && q < c[s + 1]) << "q = " << q;
  }
}

TEST(SeedModel, MalformedTablesAreNamed) {
  const FreqModel m = build_seed_model(counts_of({{0, 3}, {1, 1}, {2, 4}}));
  const SeedTables good = seed_tables(m);  // freq 96, 32, 128
  SeedTables t = good;
  t.ppf[100] = 0;  // 100 lies in symbol 1's interval [96, 128)
  expect_error([&] { model_from_seed_tables(0, t.cdf, t.ppf, "file.bin: matrix 3"); }, ErrorKind::format,
               {"file.bin: matrix 3", "ppf[100] = 0", "expected 1"});
  t = good;
  t.cdf[2] = 50;  // below cdf[1] = 96
  expect_error([&] { model_from_seed_tables(0, t.cdf, t.ppf, "w"); }, ErrorKind::format, {"cdf[2] = 50", "non-decreasing"});
  t = good;
  t.cdf[0] = 1;
  expect_error([&] { model_from_seed_tables(0, t.cdf, t.ppf, "w"); }, ErrorKind::format, {"cdf[0] = 1"});
  t = good;
  t.cdf.back() = 7;
  expect_error([&] { model_from_seed_tables(0, t.cdf, t.ppf, "w"); }, ErrorKind::format, {"cdf[3] = 7", "256"});
  // One symbol holding all 256: the seed would decode its probability as 0.
  const std::vector<uint8_t> full = {0, 0, 0};
  std::array<uint8_t, 256> ppf{};
  expect_error([&] { model_from_seed_tables(0, full, ppf, "w"); }, ErrorKind::format, {"probability 256/256"});
  expect_error([&] { model_from_seed_tables(126, good.cdf, good.ppf, "w"); }, ErrorKind::format,
               {"w_min = 126", "127"});
}

TEST(FreqModel, BuildsValidOptimalModels) {
  std::mt19937 rng(5);
  for (Dist d : {Dist::gaussian, Dist::peaked, Dist::uniform_all, Dist::two_values, Dist::sparse_grid, Dist::single}) {
    const SymbolCounts c = SymbolCounts::of(random_matrix(50, 60, d, static_cast<uint32_t>(rng())).data);
    for (int P : {8, 10, 12, 15}) {
      SCOPED_TRACE(std::string(lowbit::test::ans::dist_name(d)) + " P=" + std::to_string(P));
      const FreqModel m = build_freq_model(c, P);
      m.validate("model");
      EXPECT_EQ(m.w_min, c.min_value());
      EXPECT_EQ(m.grid_size(), c.max_value() - c.min_value() + 1);
      for (int i = 0; i < m.grid_size(); ++i)
        EXPECT_EQ(m.freq[static_cast<size_t>(i)] != 0, c.of_value(m.w_min + i) != 0) << "value " << m.w_min + i;
      // Optimal: moving one unit of frequency from any present symbol i to
      // any other present symbol j cannot lower the cost. The change of the
      // total cost (bits) is down[i] - up[j], so check every pair.
      EXPECT_GE(m.cross_entropy_bits(c) * (1 + lowbit::test::kModelOptimalitySlack), c.entropy_bits());
      const int n = m.grid_size();
      std::vector<double> down(static_cast<size_t>(n), INFINITY), up(static_cast<size_t>(n), -INFINITY);
      for (int i = 0; i < n; ++i) {
        const double f = m.freq[static_cast<size_t>(i)], cnt = static_cast<double>(c.of_value(m.w_min + i));
        if (f > 1) down[static_cast<size_t>(i)] = cnt * std::log2(f / (f - 1));
        if (f > 0) up[static_cast<size_t>(i)] = cnt * std::log2((f + 1) / f);
      }
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          if (i == j) continue;
          EXPECT_GE(down[static_cast<size_t>(i)] * (1 + lowbit::test::kModelOptimalitySlack), up[static_cast<size_t>(j)])
              << "moving a unit of frequency from value " << m.w_min + i << " to " << m.w_min + j << " lowers the cost";
        }
    }
  }
}

TEST(FreqModel, TwelveBitsIsWithinTwoPercentOfTheEntropy) {
  for (Dist d : {Dist::gaussian, Dist::peaked, Dist::uniform_127, Dist::sparse_grid}) {
    const SymbolCounts c = SymbolCounts::of(random_matrix(256, 256, d, 21).data);
    const double h = c.entropy_bits();
    const double xent12 = build_freq_model(c, 12).cross_entropy_bits(c);
    EXPECT_LE(xent12, h * (1 + lowbit::test::kAnsModelMaxOverEntropy)) << lowbit::test::ans::dist_name(d);
  }
  // ...which the seed's 8-bit model is not on wide alphabets (why lowbit has its own).
  const SymbolCounts wide = SymbolCounts::of(random_matrix(256, 256, Dist::gaussian, 21).data);
  EXPECT_GT(build_seed_model(wide).cross_entropy_bits(wide),
            wide.entropy_bits() * (1 + lowbit::test::kAnsModelMaxOverEntropy));
}

TEST(FreqModel, SingleSymbolCostsNothingAndBadArgumentsAreNamed) {
  const SymbolCounts one = counts_of({{-5, 1000}});
  const FreqModel m = build_freq_model(one, 12);
  EXPECT_EQ(m.freq, (std::vector<uint32_t>{4096}));
  EXPECT_EQ(m.cross_entropy_bits(one), 0.0);
  expect_error([&] { build_freq_model(one, 0); }, ErrorKind::invalid_argument, {"'precision' = 0", "1..15"});
  expect_error([&] { build_freq_model(one, 16); }, ErrorKind::invalid_argument, {"'precision' = 16"});
  const SymbolCounts five = counts_of({{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}});
  expect_error([&] { build_freq_model(five, 2); }, ErrorKind::invalid_argument, {"precision", "5 distinct values"});
  expect_error([&] { m.cross_entropy_bits(five); }, ErrorKind::invalid_argument, {"value 0", "grid -5..-5"});
  FreqModel bad = m;
  bad.freq = {4095};
  expect_error([&] { bad.validate("f.bin: matrix 1"); }, ErrorKind::format, {"f.bin: matrix 1", "sum to 4095", "4096"});
}

TEST(Rans, EncodeAndDecodeAreInverse) {
  // Pushing a symbol and popping it back restores the state exactly, for
  // random states across [2^16, 2^32), every precision, and any frequency.
  std::mt19937_64 rng(1);
  for (int P = 1; P <= kRansMaxPrecision; ++P) {
    for (int trial = 0; trial < 2000; ++trial) {
      const uint32_t M = 1u << P;
      const uint32_t f = 1 + static_cast<uint32_t>(rng() % M);
      const uint32_t c = static_cast<uint32_t>(rng() % (M - f + 1));
      const uint32_t x0 = kRansLowerBound + static_cast<uint32_t>(rng() % (0x100000000ull - kRansLowerBound));
      uint32_t x = x0;
      std::vector<uint16_t> words;
      rans_encode(x, rans_enc_symbol(f, c, P), P, words);
      ASSERT_LE(words.size(), 1u);
      ASSERT_GE(x, kRansLowerBound);
      const uint32_t q = x & (M - 1);
      ASSERT_TRUE(c <= q && q < c + f);
      uint32_t y = rans_decode_advance(x, f, c, P);
      if (y < kRansLowerBound) {
        ASSERT_EQ(words.size(), 1u) << "the decoder reads a word the encoder never wrote";
        y = y << 16 | words[0];
      } else {
        ASSERT_TRUE(words.empty()) << "the encoder wrote a word the decoder never reads";
      }
      ASSERT_EQ(y, x0) << "P = " << P << " f = " << f << " c = " << c;
    }
  }
}

TEST(Checksum, IsZlibCrc32) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32({reinterpret_cast<const uint8_t*>(check.data()), check.size()}), 0xCBF43926u);
  EXPECT_EQ(crc32({}), 0u);
  std::vector<uint8_t> bytes;
  for (int r = 0; r < 3; ++r)
    for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<uint8_t>(b));
  EXPECT_EQ(crc32(bytes), 0xb0c0df2au);  // python3: zlib.crc32(bytes(range(256)) * 3)
  // Continuation over pieces equals the CRC of the whole, at every split.
  for (size_t split = 0; split <= bytes.size(); split += 37)
    EXPECT_EQ(crc32(std::span(bytes).subspan(split), crc32(std::span(bytes).first(split))), crc32(bytes));
}

}  // namespace
