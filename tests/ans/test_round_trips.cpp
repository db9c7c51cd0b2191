// Encode -> decode is bit-exact for both entropy-coded containers on random
// distributions and awkward shapes; the fused decode + product equals the
// plain product; files read back byte-identical; every container runs the
// chain to the same final vector.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "ans_test_util.h"
#include "tolerances.h"
#include "error_matchers.h"
#include "lowbit/ans/ans_file.h"
#include "lowbit/ans/baseline_format.h"
#include "lowbit/ans/lowbit_format.h"
#include "lowbit/ans/seed_format.h"
#include "lowbit/ans/synthetic.h"

namespace {

using namespace lowbit::ans;
using lowbit::ErrorKind;
using lowbit::test::expect_error;
using lowbit::test::ans::Dist;
using lowbit::test::ans::dist_name;
using lowbit::test::ans::random_chain;
using lowbit::test::ans::random_matrix;

constexpr Dist kAllDists[] = {Dist::uniform_all, Dist::uniform_127, Dist::peaked, Dist::single,
                              Dist::two_values,  Dist::gaussian,    Dist::sparse_grid};

// rows x cols: one element, rows of length 1, a single row, columns that are
// not a multiple of 4 or of a block (32 streams x 4 columns), and wider.
const std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {9, 1}, {1, 7}, {5, 130}, {17, 257}, {40, 1024}};

std::vector<int64_t> reference_product(const Int8Matrix& m, const std::vector<int8_t>& v) {
  std::vector<int64_t> y(static_cast<size_t>(m.rows));
  matvec_int8(m, v, y);
  return y;
}

std::vector<int8_t> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-128, 127);
  std::vector<int8_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int8_t>(d(rng));
  return v;
}

TEST(SeedRoundTrip, EveryDistributionAndShapeDecodesExactly) {
  uint32_t seed = 100;
  for (Dist d : kAllDists)
    for (auto [rows, cols] : kShapes) {
      SCOPED_TRACE(std::string(dist_name(d)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
      const Int8Matrix m = random_matrix(rows, cols, d, ++seed);
      if (SymbolCounts::of(m.data).max_value() - SymbolCounts::of(m.data).min_value() == 255) {
        // All 256 codes: |G| = 256 does not fit the seed's u8.
        expect_error([&] { encode_seed_matrix(m); }, ErrorKind::unsupported, {"256 grid points"});
        continue;
      }
      for (bool tail : {false, true}) {
        SeedEncodeOptions o;
        o.zero_tail = tail;
        const SeedMatrix s = encode_seed_matrix(m, o);
        ASSERT_EQ(s.cursors.size(), static_cast<size_t>(rows));
        const Int8Matrix back = decode_seed_matrix(s, "round trip");
        ASSERT_EQ(back.data, m.data);
        const std::vector<int8_t> v = random_vector(cols, seed);
        std::vector<int64_t> y(static_cast<size_t>(rows));
        seed_matvec(s, v, y, "round trip");
        EXPECT_EQ(y, reference_product(m, v));
      }
    }
}

TEST(LowbitRoundTrip, EveryDistributionShapeAndLayoutDecodesExactly) {
  uint32_t seed = 500;
  struct Layout {
    int precision, states_per_lane;
    int64_t rows_per_tile, symbols_per_stream;
  };
  const Layout layouts[] = {{12, 1, 0, 0}, {8, 1, 1, 1024}, {15, 2, 3, 1024}, {12, 4, 0, 16}, {10, 8, 2, 1024}};
  for (Dist d : kAllDists)
    for (auto [rows, cols] : kShapes)
      for (const Layout& l : layouts) {
        SCOPED_TRACE(std::string(dist_name(d)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " P=" +
                     std::to_string(l.precision) + " k=" + std::to_string(l.states_per_lane) +
                     " R=" + std::to_string(l.rows_per_tile));
        const Int8Matrix m = random_matrix(rows, cols, d, ++seed);
        LowbitOptions o;
        o.precision = l.precision;
        o.states_per_lane = l.states_per_lane;
        o.rows_per_tile = l.rows_per_tile;
        o.target_symbols_per_stream = l.symbols_per_stream;
        const LowbitMatrix e = encode_lowbit_matrix(m, o);
        EXPECT_EQ(e.precision, l.precision);
        EXPECT_EQ(e.streams_per_tile(), 32 * l.states_per_lane);
        EXPECT_EQ(e.rows_per_tile, static_cast<uint32_t>(lowbit_rows_per_tile(
                                       rows, cols, o, SymbolCounts::of(m.data).entropy_bits())));
        const Int8Matrix back = decode_lowbit_matrix(e, "round trip");
        ASSERT_EQ(back.data, m.data);
        const std::vector<int8_t> v = random_vector(cols, seed);
        std::vector<int64_t> y(static_cast<size_t>(rows));
        lowbit_matvec(e, v, y, "round trip");
        EXPECT_EQ(y, reference_product(m, v));
      }
}

TEST(LowbitRoundTrip, TheSmallestPrecisionsWork) {
  // P = 1 holds two symbols of probability 1/2; P = 8 with all 256 codes gives each exactly 1/256.
  const Int8Matrix two = random_matrix(7, 300, Dist::two_values, 1);
  LowbitOptions o;
  o.precision = 1;
  EXPECT_EQ(decode_lowbit_matrix(encode_lowbit_matrix(two, o), "p1").data, two.data);
  Int8Matrix all;
  all.rows = 4;
  all.cols = 256;
  for (int i = 0; i < 1024; ++i) all.data.push_back(static_cast<int8_t>(i % 256 - 128));
  o.precision = 8;
  const LowbitMatrix e = encode_lowbit_matrix(all, o);
  EXPECT_EQ(e.freq, std::vector<uint16_t>(256, 1));
  EXPECT_EQ(decode_lowbit_matrix(e, "p8").data, all.data);
  o.precision = 7;
  expect_error([&] { encode_lowbit_matrix(all, o); }, ErrorKind::invalid_argument, {"precision", "256 distinct"});
}

TEST(LowbitRoundTrip, ASingleSymbolCostsOnlyTheStates) {
  const Int8Matrix m = random_matrix(64, 64, Dist::single, 9);
  const LowbitMatrix e = encode_lowbit_matrix(m, {});
  // Every stream stays at 2^16: the payload is the tiles' states and nothing else.
  EXPECT_EQ(e.payload.size(), static_cast<size_t>(e.tiles()) * 4 * e.streams_per_tile());
  EXPECT_EQ(decode_lowbit_matrix(e, "single").data, m.data);
}

TEST(LowbitLayout, StreamLengthFollowsTheEntropyUnlessTold) {
  LowbitOptions o;
  // Automatic: states may cost 0.4% of the entropy, 32 bits each, 1024..8192 symbols per stream.
  EXPECT_EQ(lowbit_rows_per_tile(4096, 4096, o, 6.56), 10);  // 32/(0.004*6.56) = 1220 symbols -> 9.5 rows
  EXPECT_EQ(lowbit_rows_per_tile(4096, 4096, o, 2.59), 25);  // 3089 symbols
  EXPECT_EQ(lowbit_rows_per_tile(4096, 4096, o, 9.0), 8);    // at least 1024 symbols
  EXPECT_EQ(lowbit_rows_per_tile(4096, 4096, o, 0.0), 64);   // at most 8192
  EXPECT_EQ(lowbit_rows_per_tile(5, 4096, o, 0.0), 5);       // no more rows than the matrix has
  EXPECT_EQ(lowbit_rows_per_tile(100000, 1, o, 0.0), 65536); // nor than a tile may hold
  o.states_per_lane = 2;
  EXPECT_EQ(lowbit_rows_per_tile(4096, 4096, o, 6.56), 20);  // twice the streams per tile
  o.target_symbols_per_stream = 1024;
  EXPECT_EQ(lowbit_rows_per_tile(4096, 4096, o, 6.56), 16);
  o.rows_per_tile = 3;
  EXPECT_EQ(lowbit_rows_per_tile(4096, 4096, o, 6.56), 3);
}

TEST(LowbitRoundTrip, BadOptionsAreNamed) {
  const Int8Matrix m = random_matrix(4, 4, Dist::gaussian, 1);
  LowbitOptions o;
  o.states_per_lane = 3;
  expect_error([&] { encode_lowbit_matrix(m, o); }, ErrorKind::invalid_argument, {"'states_per_lane' = 3", "1, 2, 4 or 8"});
  o = {};
  o.precision = 16;
  expect_error([&] { encode_lowbit_matrix(m, o); }, ErrorKind::invalid_argument, {"'precision' = 16"});
  o = {};
  o.rows_per_tile = -2;
  expect_error([&] { encode_lowbit_matrix(m, o); }, ErrorKind::invalid_argument, {"'rows_per_tile' = -2"});
}

TEST(LowbitRoundTrip, TheEncoderDoesNotDependOnTheThreadCount) {
  const Int8Matrix m = random_matrix(300, 200, Dist::gaussian, 4);
  LowbitOptions o;
  o.rows_per_tile = 3;
  ::setenv("LOWBIT_NUM_THREADS", "1", 1);
  const LowbitMatrix one = encode_lowbit_matrix(m, o);
  const SeedMatrix seed_one = encode_seed_matrix(m);
  ::setenv("LOWBIT_NUM_THREADS", "3", 1);
  const LowbitMatrix three = encode_lowbit_matrix(m, o);
  const SeedMatrix seed_three = encode_seed_matrix(m);
  ::unsetenv("LOWBIT_NUM_THREADS");
  EXPECT_EQ(one.payload, three.payload);
  EXPECT_EQ(one.tile_offsets, three.tile_offsets);
  EXPECT_EQ(seed_one.payload, seed_three.payload);
  EXPECT_EQ(seed_one.cursors, seed_three.cursors);
}

TEST(FileRoundTrip, EveryContainerReadsBackByteIdenticalAndRunsTheSameChain) {
  Chain chain = random_chain({70, 33, 70, 1, 9}, Dist::gaussian, 77);
  chain.result_hash = fxhash32(run_chain_reference(chain));
  for (const char* name : {"seed", "seed-nohash", "baseline", "baseline-rowmajor", "lowbit"}) {
    SCOPED_TRACE(name);
    EncodeOptions o;
    o.container = *parse_container(name);
    o.lowbit.rows_per_tile = 4;
    const AnsFile file = encode_ans_file(chain, o);
    EXPECT_EQ(container_of(file), o.container);
    const std::vector<uint8_t> bytes = serialize_ans_file(file);
    ReadOptions r;
    r.baseline_order = o.container == Container::baseline_rowmajor ? BaselineOrder::row_major
                                                                     : BaselineOrder::column_major;
    const AnsFile back = parse_ans_file(bytes, "mem", r);  // detected, not told
    EXPECT_EQ(container_of(back), o.container);
    EXPECT_EQ(serialize_ans_file(back), bytes);
    const Chain decoded = decode_ans_file(back, "mem");
    ASSERT_EQ(decoded.matrices.size(), chain.matrices.size());
    for (size_t k = 0; k < chain.matrices.size(); ++k) EXPECT_EQ(decoded.matrices[k].data, chain.matrices[k].data);
    const ChainRun run = run_chain_cpu(back, "mem");
    EXPECT_EQ(run.hash, *chain.result_hash);
    EXPECT_EQ(run.final_vector, run_chain_reference(chain));
    const bool stores_hash = o.container == Container::seed || o.container == Container::lowbit;
    EXPECT_EQ(run.recorded_hash.has_value(), stores_hash);
    if (stores_hash) {
      EXPECT_EQ(*run.recorded_hash, *chain.result_hash);
    }
  }
}

TEST(FileRoundTrip, BaselineOrdersDifferOnDiskOnly) {
  const Chain chain = random_chain({3, 5}, Dist::uniform_127, 2);
  BaselineFile col{chain, BaselineOrder::column_major}, row{chain, BaselineOrder::row_major};
  const auto col_bytes = serialize_baseline_file(col), row_bytes = serialize_baseline_file(row);
  ASSERT_EQ(col_bytes.size(), row_bytes.size());
  // Header 8 + v0 3 + pad 1 + matrix header 12 = 24: then W[0][1] is the second code row-major, W[1][0] column-major.
  const Int8Matrix& w = chain.matrices[0];
  EXPECT_EQ(static_cast<int8_t>(row_bytes[24 + 1]), w.at(0, 1));
  EXPECT_EQ(static_cast<int8_t>(col_bytes[24 + 1]), w.at(1, 0));
  // Read with the wrong order, the codes come out transposed-and-reshaped, not equal.
  EXPECT_NE(parse_baseline_file(col_bytes, BaselineOrder::row_major, "x").chain.matrices[0].data, w.data);
  EXPECT_EQ(parse_baseline_file(col_bytes, BaselineOrder::column_major, "x").chain.matrices[0].data, w.data);
}

TEST(FileRoundTrip, ScalesTravelInLowbitFilesAndMustBeDroppedExplicitlyElsewhere) {
  SyntheticOptions so;
  so.layers = 2;
  so.dim = 48;
  so.granularity = Granularity::per_group;
  so.group_size = 20;  // 48 columns: groups of 20, 20, 8
  so.bits = 4;
  const Chain chain = make_synthetic_chain(so);
  ASSERT_EQ(chain.matrices[0].scales.size(), 48u * 3);
  const AnsFile lowbit = encode_ans_file(chain, {Container::lowbit, {}, false});
  const AnsFile back = parse_ans_file(serialize_ans_file(lowbit), "mem");
  const Chain decoded = decode_ans_file(back, "mem");
  EXPECT_EQ(decoded.matrices[1].scale_kind, ScaleKind::per_group);
  EXPECT_EQ(decoded.matrices[1].group_size, 20);
  EXPECT_EQ(decoded.matrices[1].scales, chain.matrices[1].scales);
  expect_error([&] { encode_ans_file(chain, {Container::seed, {}, false}); }, ErrorKind::invalid_argument,
               {"per-group", "drop"});
  expect_error([&] { encode_ans_file(chain, {Container::baseline, {}, false}); }, ErrorKind::invalid_argument,
               {"per-group", "drop"});
  const AnsFile dropped = encode_ans_file(chain, {Container::seed, {}, true});
  EXPECT_EQ(run_chain_cpu(dropped, "mem").hash, *chain.result_hash);
}

TEST(LowbitSize, WithinTwoPercentOfTheEntropyOnTheSeedsData) {
  // The size target on the seed's synthetic data (per-tensor int8 of
  // Gaussian weights) and on heavier-tailed and 4-bit per-group codes: all of
  // the matrix's bytes but the quantization's scales (so states, padding,
  // tables) over the empirical entropy.
  struct Case {
    WeightDistribution dist;
    int bits;
    Granularity granularity;
  };
  for (const Case c : {Case{WeightDistribution::gaussian, 8, Granularity::per_tensor},
                       Case{WeightDistribution::laplace, 8, Granularity::per_channel},
                       Case{WeightDistribution::student_t4, 8, Granularity::per_tensor},  // H ~ 2.6 on 255 codes
                       Case{WeightDistribution::student_t4, 4, Granularity::per_group}}) {
    SyntheticOptions so;
    so.layers = 1;
    so.dim = 1024;
    so.distribution = c.dist;
    so.bits = c.bits;
    so.granularity = c.granularity;
    const Chain chain = make_synthetic_chain(so);
    const FileStats st = inspect_ans_file(encode_ans_file(chain, {Container::lowbit, {}, false}), "mem");
    const MatrixStats& m = st.matrices[0];
    SCOPED_TRACE(std::string(distribution_name(c.dist)) + " " + std::to_string(c.bits) + "-bit " +
                 granularity_name(c.granularity) + ": H = " + std::to_string(m.entropy_bits) +
                 ", coding = " + std::to_string(m.coding_bits()));
    EXPECT_LE(m.coding_bits(), m.entropy_bits * (1 + lowbit::test::kAnsLowbitMaxOverEntropy));
    // The decomposition adds up.
    EXPECT_NEAR(m.entropy_bits + m.model_loss_bits() + m.coder_loss_bits() + m.bits(m.padding_bytes) +
                    m.bits(m.table_bytes) + m.bits(m.scale_bytes),
                m.total_bits(), 1e-9);
  }
}

}  // namespace
