// The seed authors' own files (../shared/testdata/matvans beside the checkout, written by the
// MATVANS reference encoder): we read them exactly, decode every matrix to
// the raw matrix, reproduce the README's facts, and our encoder rewrites the
// compressed file byte for byte from the raw one.
#include <gtest/gtest.h>

#include <cmath>

#include "ans_test_util.h"
#include "tolerances.h"
#include "lowbit/ans/ans_file.h"

namespace {

using namespace lowbit::ans;
using lowbit::test::ans::conformance_dir;
using lowbit::test::ans::read_bytes;

constexpr uint32_t kReadmeHash = 3721080212u;
constexpr uint32_t kReadmeSMax = 103641;
constexpr int kReadmeGridSizes[] = {251, 251, 251, 255};
constexpr double kReadmeBitsPerWeight[] = {6.2156, 6.1490, 6.2015, 6.2548};

struct Conformance {
  std::vector<uint8_t> compressed_bytes, raw_bytes;
  SeedFile compressed;
  BaselineFile raw;
};

const Conformance& data() {
  static const Conformance c = [] {
    Conformance d;
    d.compressed_bytes = read_bytes(conformance_dir() / "compressed_matrices_512.bin");
    d.raw_bytes = read_bytes(conformance_dir() / "raw-matrices_512.bin");
    d.compressed = parse_seed_file(d.compressed_bytes, "compressed_matrices_512.bin");
    d.raw = parse_baseline_file(d.raw_bytes, BaselineOrder::row_major, "raw-matrices_512.bin");
    return d;
  }();
  return c;
}

TEST(Conformance, HeaderAndTablesAreAsTheReadmeSays) {
  LOWBIT_REQUIRE_CONFORMANCE();
  const SeedFile& f = data().compressed;
  EXPECT_TRUE(f.has_hash) << "the variant with result_hash must be detected from the sizes";
  EXPECT_EQ(f.result_hash, kReadmeHash);
  EXPECT_EQ(f.s_max, kReadmeSMax);
  ASSERT_EQ(f.matrices.size(), 4u);
  EXPECT_EQ(f.v0.size(), 512u);
  uint64_t s_max = 0;
  for (size_t k = 0; k < 4; ++k) {
    const SeedMatrix& m = f.matrices[k];
    EXPECT_EQ(m.rows, 512u);
    EXPECT_EQ(m.cols, 512u);
    EXPECT_EQ(m.grid_size(), kReadmeGridSizes[k]) << "matrix " << k;
    const double bpw = 16.0 * static_cast<double>(m.payload.size()) / (512.0 * 512.0);
    EXPECT_NEAR(bpw, kReadmeBitsPerWeight[k], lowbit::test::kPrintedFourDecimalsSlack) << "matrix " << k;
    s_max = std::max(s_max, m.reference_word_count());
  }
  EXPECT_EQ(s_max, kReadmeSMax) << "S_max as the reference encoder counts it";
}

TEST(Conformance, EveryMatrixDecodesToTheRawMatrix) {
  LOWBIT_REQUIRE_CONFORMANCE();
  const Chain decoded = decode_seed_file(data().compressed, "compressed_matrices_512.bin");
  const Chain& raw = data().raw.chain;
  ASSERT_EQ(raw.matrices.size(), 4u);
  EXPECT_EQ(decoded.v0, raw.v0);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(decoded.matrices[k].rows, raw.matrices[k].rows);
    EXPECT_EQ(decoded.matrices[k].data, raw.matrices[k].data) << "matrix " << k;
  }
}

TEST(Conformance, TheChainEndsInTheRecordedHash) {
  LOWBIT_REQUIRE_CONFORMANCE();
  // From the compressed file (fused decode + product), from the raw file
  // (row-major baseline) and from the plain reference: the header's hash.
  const ChainRun from_seed = run_chain_cpu(data().compressed, "compressed");
  EXPECT_EQ(from_seed.hash, kReadmeHash);
  EXPECT_EQ(*from_seed.recorded_hash, kReadmeHash);
  EXPECT_EQ(run_chain_cpu(data().raw, "raw").hash, kReadmeHash);
  EXPECT_EQ(fxhash32(run_chain_reference(data().raw.chain)), kReadmeHash);
  // Read with the appendix-A (column-major) order, the raw file is a different
  // chain: the order really matters and is not guessed.
  const BaselineFile transposed = parse_baseline_file(data().raw_bytes, BaselineOrder::column_major, "raw");
  EXPECT_NE(run_chain_cpu(transposed, "raw").hash, kReadmeHash);
}

TEST(Conformance, FilesReadBackByteIdentical) {
  LOWBIT_REQUIRE_CONFORMANCE();
  EXPECT_EQ(serialize_seed_file(data().compressed), data().compressed_bytes);
  EXPECT_EQ(serialize_baseline_file(data().raw), data().raw_bytes);
  // Through detection too.
  EXPECT_EQ(serialize_ans_file(parse_ans_file(data().compressed_bytes, "c")), data().compressed_bytes);
  ReadOptions row;
  row.baseline_order = BaselineOrder::row_major;
  EXPECT_EQ(serialize_ans_file(parse_ans_file(data().raw_bytes, "r", row)), data().raw_bytes);
}

TEST(Conformance, OurEncoderReproducesTheReferenceEncoderByteForByte) {
  LOWBIT_REQUIRE_CONFORMANCE();
  Chain chain = data().raw.chain;  // no hash in the raw file: computed by the encoder
  const SeedFile ours = encode_seed_file(chain, seed_encoder_with_hash());
  EXPECT_EQ(ours.result_hash, kReadmeHash);
  EXPECT_EQ(serialize_seed_file(ours), data().compressed_bytes);
  // The report-era layout: no hash (4 bytes) and no two-word zero tail (4
  // bytes per matrix; the payload keeps its parity, so the padding stays).
  const SeedFile old = encode_seed_file(chain, seed_encoder_report_era());
  const std::vector<uint8_t> old_bytes = serialize_seed_file(old);
  EXPECT_EQ(old_bytes.size(), data().compressed_bytes.size() - 4 - 4 * 4);
  const SeedFile old_back = parse_seed_file(old_bytes, "report-era");
  EXPECT_FALSE(old_back.has_hash);
  EXPECT_EQ(decode_seed_file(old_back, "report-era").matrices[3].data, chain.matrices[3].data);
}

TEST(Conformance, LowbitIsSmallerAndRunsTheSameChain) {
  LOWBIT_REQUIRE_CONFORMANCE();
  const Chain chain = decode_seed_file(data().compressed, "c");
  const AnsFile lowbit = encode_ans_file(chain, {Container::lowbit, {}, false});
  const FileStats st = inspect_ans_file(lowbit, "lowbit");
  const FileStats seed = inspect_ans_file(data().compressed, "seed");
  EXPECT_EQ(run_chain_cpu(lowbit, "lowbit").hash, kReadmeHash);
  EXPECT_EQ(*st.result_hash, kReadmeHash);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_DOUBLE_EQ(st.matrices[k].entropy_bits, seed.matrices[k].entropy_bits);
    EXPECT_LT(st.matrices[k].total_bits(), seed.matrices[k].total_bits());
    EXPECT_LE(st.matrices[k].coding_bits(),
              st.matrices[k].entropy_bits * (1 + lowbit::test::kAnsLowbitMaxOverEntropy));
  }
  // The seed's own statistics: its achieved bits per weight are the README's.
  for (size_t k = 0; k < 4; ++k)
    EXPECT_NEAR(seed.matrices[k].achieved_bits(), kReadmeBitsPerWeight[k], lowbit::test::kPrintedFourDecimalsSlack);
}

}  // namespace
