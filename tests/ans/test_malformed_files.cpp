// Truncated, corrupted and oversized-field files give clear lowbit::Error
// messages (format, naming the file and the field), never a crash or an
// out-of-bounds read: every truncation of small files, random corruptions,
// and one hand-made corruption per checked field. (Run under
// -fsanitize=address,undefined to check the "never" part; fuzz/ has the
// libFuzzer entry points for the same parsers.)
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ans_test_util.h"
#include "error_matchers.h"
#include "lowbit/ans/ans_file.h"
#include "lowbit/ans/checksum.h"

namespace {

using namespace lowbit::ans;
using lowbit::Error;
using lowbit::ErrorKind;
using lowbit::test::expect_error;
using lowbit::test::throws_error;
using lowbit::test::ans::Dist;
using lowbit::test::ans::random_chain;

template <typename T>
void put(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}
template <typename T>
T get(const std::vector<uint8_t>& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}

Chain small_chain() {
  Chain c = random_chain({13, 9, 6}, Dist::gaussian, 31);
  c.result_hash = fxhash32(run_chain_reference(c));
  return c;
}

std::vector<uint8_t> small_file(Container container) {
  EncodeOptions o;
  o.container = container;
  o.lowbit.rows_per_tile = 4;
  return serialize_ans_file(encode_ans_file(small_chain(), o));
}

// Parses (detecting the container) and, if that works, decodes and runs.
void parse_and_use(const std::vector<uint8_t>& bytes, const ReadOptions& options = {}) {
  const AnsFile f = parse_ans_file(bytes, "bad.bin", options);
  (void)decode_ans_file(f, "bad.bin");
  (void)run_chain_cpu(f, "bad.bin");
}

// ---- every truncation --------------------------------------------------------------

TEST(Malformed, EveryTruncationOfEveryContainerIsRefused) {
  for (Container c : {Container::seed, Container::seed_nohash, Container::baseline, Container::lowbit}) {
    SCOPED_TRACE(container_name(c));
    const std::vector<uint8_t> whole = small_file(c);
    ReadOptions told;
    told.container = c;
    for (size_t n = 0; n < whole.size(); ++n) {
      const std::vector<uint8_t> cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n));
      ASSERT_TRUE(throws_error([&] { parse_and_use(cut); }, ErrorKind::format, {"bad.bin"})) << n << " bytes";
      ASSERT_TRUE(throws_error([&] { parse_and_use(cut, told); }, ErrorKind::format, {"bad.bin"})) << n << " bytes";
    }
    EXPECT_NO_THROW(parse_and_use(whole, told));
  }
}

TEST(Malformed, TruncationMessagesNameTheField) {
  const std::vector<uint8_t> seed = small_file(Container::seed);
  ReadOptions told;
  told.container = Container::seed;
  // Too short for K matrices at all: refused before reading (or reserving) them.
  const std::vector<uint8_t> cut(seed.begin(), seed.begin() + 40);
  expect_error([&] { parse_and_use(cut, told); }, ErrorKind::format, {"bad.bin", "K = 2", "truncated"});
  // Ten bytes short: inside matrix 1's payload.
  const std::vector<uint8_t> short10(seed.begin(), seed.end() - 10);
  expect_error([&] { parse_and_use(short10, told); }, ErrorKind::format, {"bad.bin", "matrix 1", "payload", "truncated"});
  const std::vector<uint8_t> lb = small_file(Container::lowbit);
  const std::vector<uint8_t> lcut(lb.begin(), lb.end() - 1);
  expect_error([&] { parse_and_use(lcut); }, ErrorKind::format, {"bad.bin", "file has", "truncated"});
}

// ---- random corruption -------------------------------------------------------------

TEST(Malformed, RandomCorruptionsThrowOnlyFormatErrors) {
  std::mt19937 rng(2024);
  for (Container c : {Container::seed, Container::baseline, Container::lowbit}) {
    SCOPED_TRACE(container_name(c));
    const std::vector<uint8_t> whole = small_file(c);
    int detected = 0, trials = 0;
    for (int t = 0; t < 1500; ++t) {
      std::vector<uint8_t> b = whole;
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < flips; ++i) b[rng() % b.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      ++trials;
      try {
        parse_and_use(b);
      } catch (const Error& e) {
        // A changed version field reads as a newer format: unsupported, not malformed.
        const bool newer_version = e.kind() == ErrorKind::unsupported && std::string(e.what()).find("format version") != std::string::npos;
        ASSERT_TRUE(e.kind() == ErrorKind::format || newer_version) << e.what();
        ASSERT_NE(std::string(e.what()).find("bad.bin"), std::string::npos) << e.what();
        ++detected;
      }
      // Anything else (another exception, a crash, a sanitizer report) fails the test.
    }
    // Every byte of a lowbit file is under a CRC-32 or a zero check, so no
    // corruption of 1-3 bytes gets through. The seed and baseline containers
    // have no checksum: a changed v_0, delta or code is a valid file.
    if (c == Container::lowbit) EXPECT_EQ(detected, trials);
    else EXPECT_GT(detected, 0);
  }
}

TEST(Malformed, EverySingleByteChangeOfALowbitFileIsCaught) {
  const std::vector<uint8_t> whole = small_file(Container::lowbit);
  for (size_t i = 0; i < whole.size(); ++i) {
    std::vector<uint8_t> b = whole;
    b[i] ^= 0x01;
    // Bytes 8..9 are the version, 1: flipping bit 0 gives version 0 (malformed);
    // flipping bit 8 gives 257, a newer format this reader does not know.
    const ErrorKind kind = i == 9 ? ErrorKind::unsupported : ErrorKind::format;
    ASSERT_TRUE(throws_error([&] { parse_and_use(b); }, kind, {"bad.bin"})) << "byte " << i;
  }
}

// ---- the seed container, field by field ------------------------------------------------

struct SeedOffsets {  // of the small seed file (with hash): v0 has 13 bytes + 3 pad
  static constexpr size_t K = 0, hash = 4, s_max = 8, n0 = 12, v0 = 16, matrix0 = 32;
  static constexpr size_t rows = matrix0, cols = matrix0 + 4, cursors = matrix0 + 12;
  static constexpr size_t payload_size = cursors + 4 * 9;  // matrix 0 has 9 rows
  static constexpr size_t w_min = payload_size + 4, G = w_min + 1, cdf = G + 1;
};

TEST(Malformed, SeedFieldsAreCheckedAndNamed) {
  const std::vector<uint8_t> good = small_file(Container::seed);
  ASSERT_EQ(get<uint32_t>(good, SeedOffsets::rows), 9u);
  ReadOptions told;
  told.container = Container::seed;
  auto with = [&](auto edit) {
    std::vector<uint8_t> b = good;
    edit(b);
    return b;
  };
  auto expect = [&](const std::vector<uint8_t>& b, std::initializer_list<std::string_view> needles) {
    expect_error([&] { parse_and_use(b, told); }, ErrorKind::format, needles);
  };
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::K, 0xFFFFFFFFu); }), {"K = 4294967295", "cannot fit"});
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::n0, 0x7FFFFFFFu); }), {"v_0", "2147483647 entries"});
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::n0, 0u); }), {"N_0 = 0"});
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::rows, 0xFFFFFFF0u); }), {"matrix 0", "cursors", "4294967280 entries"});
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::cols, 12u); }), {"matrix 0", "N_k = 12", "expected 13"});
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::payload_size, 0xFFFFFFFFu); }),
         {"matrix 0", "payload", "4294967295 entries"});
  expect(with([](auto& b) { b[SeedOffsets::v0 + 13] = 7; }), {"padding after v_0", "expected 0"});
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::cursors, 1u); }), {"matrix 0", "cursors[0] = 1"});
  expect(with([](auto& b) { put<uint32_t>(b, SeedOffsets::cursors + 8, get<uint32_t>(b, SeedOffsets::cursors + 4)); }),
         {"matrix 0", "row 1 spans words", "at least the 2 words"});
  expect(with([](auto& b) { b[SeedOffsets::cdf] = 3; }), {"matrix 0", "cdf[0] = 3"});
  expect(with([](auto& b) { b[SeedOffsets::G] = static_cast<uint8_t>(b[SeedOffsets::G] + 1); }), {"matrix 0"});
  expect(with([](auto& b) { b.push_back(0); }), {"follow the last matrix"});
  // Payload damage: the words of row 2 of matrix 0 zeroed. The row cannot end
  // where its words end with the encoder's initial state.
  expect(with([&](auto& b) {
           const size_t G = b[SeedOffsets::G];
           const size_t payload = SeedOffsets::cdf + G + 1 + (G + 1) % 2 + 256;
           const uint32_t c2 = get<uint32_t>(b, SeedOffsets::cursors + 8), c3 = get<uint32_t>(b, SeedOffsets::cursors + 12);
           for (uint32_t w = c2; w < c3; ++w) put<uint16_t>(b, payload + 2 * w, uint16_t{0x1234});
         }),
         {"matrix 0", "row 2"});
}

TEST(Malformed, UnknownFilesNameEveryContainerTried) {
  std::vector<uint8_t> junk(100, 0xAB);
  expect_error([&] { parse_ans_file(junk, "junk.bin"); }, ErrorKind::format,
               {"junk.bin", "not a lowbit, seed or baseline", "result_hash", "baseline"});
  expect_error([&] { parse_ans_file({}, "empty.bin"); }, ErrorKind::format, {"empty.bin", "truncated"});
}

// ---- the baseline container --------------------------------------------------------------

TEST(Malformed, BaselineFieldsAreCheckedAndNamed) {
  const std::vector<uint8_t> good = small_file(Container::baseline);
  auto expect = [&](size_t at, uint32_t v, std::initializer_list<std::string_view> needles) {
    std::vector<uint8_t> b = good;
    put<uint32_t>(b, at, v);
    expect_error([&] { parse_baseline_file(b, BaselineOrder::column_major, "base.bin"); }, ErrorKind::format, needles);
  };
  expect(0, 0xFFFFFFFFu, {"base.bin", "K = 4294967295"});
  expect(4, 0xFFFFFFFFu, {"base.bin", "v_0"});
  expect(24, 0xFFFFFFFFu, {"base.bin", "matrix 0", "codes"});          // rows
  expect(28, 14u, {"base.bin", "matrix 0", "cols = 14", "expected 13"});  // cols
  std::vector<uint8_t> b = good;
  b[8 + 13] = 1;  // the pad after v_0
  expect_error([&] { parse_baseline_file(b, BaselineOrder::row_major, "base.bin"); }, ErrorKind::format,
               {"padding after v_0"});
}

// ---- the lowbit container ------------------------------------------------------------------

// Offsets in a lowbit file, read from its directory.
struct LowbitOffsets {
  size_t directory, section0;
  explicit LowbitOffsets(const std::vector<uint8_t>& b)
      : directory(static_cast<size_t>(get<uint64_t>(b, 40))), section0(static_cast<size_t>(get<uint64_t>(b, directory))) {}
};

TEST(Malformed, LowbitFieldsAreCheckedAndNamedEvenWithoutChecksums) {
  const std::vector<uint8_t> good = small_file(Container::lowbit);
  const LowbitOffsets at(good);
  ReadOptions unchecked;
  unchecked.verify_checksums = false;
  auto expect = [&](auto edit, ErrorKind kind, std::initializer_list<std::string_view> needles) {
    std::vector<uint8_t> b = good;
    edit(b);
    expect_error([&] { parse_and_use(b, unchecked); }, kind, needles);
  };
  const size_t s = at.section0;
  expect([](auto& b) { put<uint16_t>(b, 8, uint16_t{2}); }, ErrorKind::unsupported, {"version 2", "version 1"});
  expect([](auto& b) { b[0] = 'X'; }, ErrorKind::format, {"magic"});  // now undetectable as lowbit
  expect([](auto& b) { put<uint32_t>(b, 16, 0xFFFFFFFFu); }, ErrorKind::format, {"directory of K = 4294967295"});
  expect([](auto& b) { put<uint32_t>(b, 12, 6u); }, ErrorKind::format, {"flags"});
  expect([](auto& b) { put<uint64_t>(b, 32, uint64_t{1} << 40); }, ErrorKind::format, {"1099511627776 bytes", "truncated"});
  expect([&](auto& b) { put<uint64_t>(b, at.directory, uint64_t{at.section0 + 256}); }, ErrorKind::format,
         {"matrix 0 section offset"});
  expect([&](auto& b) { b[s + 12] = 0; }, ErrorKind::format, {"matrix 0", "precision = 0"});
  expect([&](auto& b) { b[s + 12] = 16; }, ErrorKind::format, {"matrix 0", "precision = 16"});
  expect([&](auto& b) { b[s + 13] = 3; }, ErrorKind::format, {"matrix 0", "states_per_lane = 3"});
  expect([&](auto& b) { b[s + 15] = 7; }, ErrorKind::format, {"matrix 0", "scale_kind = 7"});
  expect([&](auto& b) { put<uint16_t>(b, s + 16, uint16_t{0}); }, ErrorKind::format, {"matrix 0", "grid_size = 0"});
  expect([&](auto& b) { put<uint32_t>(b, s + 4, 5u); }, ErrorKind::format, {"matrix 0", "cols = 5", "expected 13"});
  expect([&](auto& b) { put<uint32_t>(b, s + 20, 0u); }, ErrorKind::format, {"matrix 0", "rows_per_tile = 0"});
  expect([&](auto& b) { put<uint32_t>(b, s + 24, 1u); }, ErrorKind::format, {"matrix 0", "tiles = 1", "expected"});
  expect([&](auto& b) { put<uint64_t>(b, s + 32, get<uint64_t>(b, s + 32) + 8); }, ErrorKind::format,
         {"matrix 0", "payload_bytes"});
  expect([&](auto& b) { b[s + 50] = 1; }, ErrorKind::format, {"matrix 0", "reserved bytes 40..63"});
  // freq: matrix 0's first frequency one larger: no longer sums to 2^P.
  expect([&](auto& b) { put<uint16_t>(b, s + 64, static_cast<uint16_t>(get<uint16_t>(b, s + 64) + 1)); },
         ErrorKind::format, {"matrix 0", "frequencies sum to"});
  // Payload: the first state of tile 0 (the payload follows the 16-aligned tables).
  const uint16_t grid = get<uint16_t>(good, s + 16);
  const uint32_t tiles = get<uint32_t>(good, s + 24);
  const size_t offsets = ((64 + 2 * size_t{grid} + 15) / 16 * 16);  // no scales in this file
  const size_t payload = (offsets + 4 * (tiles + 1) + 15) / 16 * 16;
  expect([&](auto& b) { put<uint32_t>(b, s + offsets + 4, 1u); }, ErrorKind::format,
         {"matrix 0", "tile_offsets[1] = 1", "at least 8 more"});
  expect([&](auto& b) { put<uint32_t>(b, s + payload, 0x00012345u); }, ErrorKind::format,
         {"matrix 0", "tile 0", "the payload is corrupt"});
  expect([&](auto& b) { put<uint32_t>(b, s + payload, 5u); }, ErrorKind::format,
         {"matrix 0", "tile 0 stream 0 starts from the state 0x00000005"});
  // With checksums on, the same damage is reported as a checksum mismatch.
  std::vector<uint8_t> b = good;
  b[s + 12] = 0;
  expect_error([&] { parse_and_use(b); }, ErrorKind::format, {"matrix 0", "checksum mismatch"});
}

}  // namespace
