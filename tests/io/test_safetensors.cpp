#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "error_matchers.h"
#include "io/io_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::io {
namespace {

using testing::le64;
using testing::read_file;
using testing::safetensors_bytes;
using testing::TempDir;
using testing::write_file;

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

using lowbit::test::expect_error;

const DType kSafetensorsDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::i8,
                                    DType::u8,  DType::i32, DType::u32};

// ---- round trips -----------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDtypeAndShape) {
  TempDir dir;
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {7}, {3, 5}, {2, 0, 4}, {2, 3, 1, 2}, {1, 1, 1, 1, 1, 3}};
  SafetensorsWriter w;
  std::vector<std::tuple<std::string, DType, std::vector<int64_t>, std::vector<std::byte>>> want;
  uint32_t seed = 1;
  for (DType t : kSafetensorsDTypes) {
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (auto e : shape) n *= e;
      std::string name = std::string(dtype_name(t)) + ".shape" + std::to_string(seed);
      want.emplace_back(name, t, shape, random_bytes(dtype_bytes(t, static_cast<size_t>(n)), seed++));
    }
  }
  for (const auto& [name, t, shape, data] : want) w.add(name, t, shape, data);
  w.set_metadata({{"format", "pt"}, {"note", "héllo \"quoted\"\n"}});
  const auto path = dir / "round.safetensors";
  w.write(path);

  const auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), want.size());
  for (const auto& [name, t, shape, data] : want) {
    SCOPED_TRACE(name);
    const auto* info = f.find(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, t);
    EXPECT_EQ(info->shape, shape);
    EXPECT_TRUE(same_bytes(f.bytes(name), data));
    const TensorView v = f.view(name);
    EXPECT_EQ(v.dtype, t);
    EXPECT_EQ(v.rank, static_cast<int>(shape.size()));
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_EQ(v.nbytes(), data.size());
    // Each tensor is aligned to its element size (8-aligned data start, largest types first).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(dtype_bits(t) / 8), 0u);
  }
  EXPECT_TRUE(f.has_metadata());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "héllo \"quoted\"\n");
  EXPECT_EQ(f.data_offset() % 8, 0u);
  // tensors() is in offset order.
  for (size_t i = 1; i < f.tensors().size(); ++i)
    EXPECT_LE(f.tensors()[i - 1].data_end, f.tensors()[i].data_begin);
}

TEST(SafetensorsRoundTrip, ViewsAndCopies) {
  TempDir dir;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  SafetensorsWriter w;
  w.add("a", TensorView::contiguous(a.data(), DType::f32, {2, 3}));
  std::vector<std::byte> temp = random_bytes(10, 7);
  const std::vector<std::byte> keep = temp;
  w.add_copy("copied", DType::u8, {10}, temp);
  temp.assign(temp.size(), std::byte{0});  // the writer kept its own copy
  SafetensorsWriter moved = std::move(w);  // moving keeps add_copy's bytes valid
  moved.write(dir / "v.safetensors");
  const auto f = SafetensorsFile::open(dir / "v.safetensors");
  const TensorView v = f.view("a");
  EXPECT_EQ(v.shape_string(), "[2, 3]");
  EXPECT_EQ(v.as<const float>()[2], 3.25f);
  EXPECT_TRUE(same_bytes(f.bytes("copied"), keep));
  EXPECT_FALSE(f.has_metadata());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(SafetensorsRoundTrip, MovedFileKeepsViews) {
  TempDir dir;
  std::vector<int32_t> x = {1, 2, 3};
  SafetensorsWriter w;
  w.add("x", TensorView::contiguous(x.data(), DType::i32, {3}));
  w.write(dir / "m.safetensors");
  auto f = SafetensorsFile::open(dir / "m.safetensors");
  const TensorView v = f.view("x");
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(v.as<const int32_t>()[2], 3);
  EXPECT_EQ(g.view("x").data, v.data);
  SafetensorsFile h = SafetensorsFile::open(dir / "m.safetensors");
  h = std::move(g);
  EXPECT_EQ(h.view("x").as<const int32_t>()[0], 1);
}

TEST(SafetensorsRoundTrip, RankAboveTensorViewLimit) {
  TempDir dir;
  std::vector<std::byte> d(2);
  SafetensorsWriter w;
  w.add("r7", DType::u8, {1, 1, 1, 1, 1, 1, 2}, d);
  w.write(dir / "r7.safetensors");
  const auto f = SafetensorsFile::open(dir / "r7.safetensors");
  EXPECT_EQ(f.find("r7")->shape.size(), 7u);
  EXPECT_EQ(f.bytes("r7").size(), 2u);
  expect_error([&] { (void)f.view("r7"); }, ErrorKind::unsupported, {"r7", "rank 7"});
}

// ---- known answers -------------------------------------------------------------------

TEST(SafetensorsKnownAnswer, ReaderParsesHandBuiltFile) {
  TempDir dir;
  // Unsorted header keys, a gap of 2 bytes before "b", metadata last, padding spaces.
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("s":{"dtype":"BF16","shape":[],"data_offsets":[8,10]},)"
      R"("__metadata__":{"format":"pt","x":""}}  )";
  const std::string data("\x00\x00\x80\x3f" "\xee\xee" "\x07\x09" "\x80\x3f", 10);
  write_file(dir / "hand.safetensors", safetensors_bytes(header, data));

  const auto f = SafetensorsFile::open(dir / "hand.safetensors");
  EXPECT_EQ(f.file_size(), 8 + header.size() + 10);
  EXPECT_EQ(f.header_size(), header.size());
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(f.tensors()[2].name, "s");
  EXPECT_EQ(f.tensors()[1].data_begin, 6u);
  EXPECT_EQ(f.tensors()[1].data_end, 8u);
  EXPECT_EQ(f.view("a").as<const float>()[0], 1.0f);
  EXPECT_EQ(f.view("b").as<const uint8_t>()[1], 9);
  const TensorView s = f.view("s");
  EXPECT_EQ(s.rank, 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.dtype, DType::bf16);
  EXPECT_EQ(s.as<const uint16_t>()[0], 0x3f80);
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata().at("x"), "");
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(SafetensorsKnownAnswer, WriterProducesExactBytes) {
  TempDir dir;
  const uint8_t b[] = {1, 2, 3};
  const float a = 1.0f;
  const int32_t c = -2;
  const uint16_t d[] = {0x3C00, 0xC000};  // f16 1.0, -2.0
  SafetensorsWriter w;
  w.add("b", DType::u8, {3}, std::as_bytes(std::span(b)));
  w.add("a", DType::f32, {}, std::as_bytes(std::span(&a, 1)));
  w.add("c", DType::i32, {1}, std::as_bytes(std::span(&c, 1)));
  w.add("d", DType::f16, {2}, std::as_bytes(std::span(d)));
  w.set_metadata({{"format", "pt"}});
  w.write(dir / "w.safetensors");
  // Also what safetensors.numpy.save writes for the same arrays (checked when this test was made).
  const std::string expected_header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("c":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},)"
      R"("d":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[12,15]}}   )";
  ASSERT_EQ(expected_header.size(), 248u);
  const std::string expected = std::string("\xF8\0\0\0\0\0\0\0", 8) + expected_header +
                               std::string("\x00\x00\x80\x3f\xfe\xff\xff\xff\x00\x3c\x00\xc0\x01\x02\x03", 15);
  EXPECT_EQ(read_file(dir / "w.safetensors"), expected);
  EXPECT_EQ(w.header_bytes(), expected.substr(0, 8 + 248));
}

TEST(SafetensorsKnownAnswer, EmptyFileAndEscapes) {
  TempDir dir;
  SafetensorsWriter empty;
  empty.write(dir / "e.safetensors");
  EXPECT_EQ(read_file(dir / "e.safetensors"), le64(8) + "{}      ");
  EXPECT_TRUE(SafetensorsFile::open(dir / "e.safetensors").tensors().empty());

  SafetensorsWriter w;
  const uint8_t one = 1;
  w.add("q\"\\\n\x01\x1f/\x7f\xc3\xa9", DType::u8, {1}, std::as_bytes(std::span(&one, 1)));
  w.set_metadata({});
  // serde_json's escaping: \" \\ \n \u0001 \u001f, '/', DEL and UTF-8 verbatim.
  const std::string want = "{\"__metadata__\":{},\"q\\\"\\\\\\n\\u0001\\u001f/\x7f\xc3\xa9\":"
                           "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  std::string padded = want;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  EXPECT_EQ(w.header_bytes(), le64(padded.size()) + padded);
  w.write(dir / "q.safetensors");
  const auto f = SafetensorsFile::open(dir / "q.safetensors");
  EXPECT_NE(f.find("q\"\\\n\x01\x1f/\x7f\xc3\xa9"), nullptr);
  EXPECT_TRUE(f.has_metadata());
}

// ---- writer errors and atomicity -----------------------------------------------------

TEST(SafetensorsWriterErrors, BadArguments) {
  std::vector<std::byte> four(4);
  SafetensorsWriter w;
  w.add("x", DType::f32, {1}, four);
  expect_error([&] { w.add("x", DType::f32, {1}, four); }, ErrorKind::invalid_argument,
               {"'x'", "duplicate"});
  expect_error([&] { w.add("y", DType::f32, {2}, four); }, ErrorKind::invalid_argument,
               {"data.size()", "= 4", "8 bytes", "'y'"});
  expect_error([&] { w.add("u", DType::u4x2, {8}, four); }, ErrorKind::invalid_argument,
               {"u4x2", "safetensors name"});
  expect_error([&] { w.add("__metadata__", DType::u8, {4}, four); },
               ErrorKind::invalid_argument, {"__metadata__"});
  expect_error([&] { w.add("n", DType::u8, {-4}, four); }, ErrorKind::invalid_argument,
               {"non-negative", "[-4]"});
  expect_error([&] { w.add("big", DType::u8, {int64_t{1} << 40, int64_t{1} << 40}, four); },
               ErrorKind::invalid_argument, {"fits in int64"});
  expect_error([&] { w.add("bad\xff", DType::u8, {4}, four); }, ErrorKind::invalid_argument,
               {"UTF-8"});
  expect_error([&] { w.set_metadata({{"k", "\xc3"}}); }, ErrorKind::invalid_argument, {"UTF-8"});

  std::vector<float> m(6);
  TensorView t = TensorView::contiguous(m.data(), DType::f32, {2, 3});
  std::swap(t.strides[0], t.strides[1]);
  std::swap(t.shape[0], t.shape[1]);  // a transposed view
  expect_error([&] { w.add("t", t); }, ErrorKind::invalid_argument, {"contiguous"});
  TensorView g = TensorView::contiguous(m.data(), DType::f32, {6});
  g.device = Device::cuda;
  expect_error([&] { w.add("g", g); }, ErrorKind::invalid_argument, {"host"});
  EXPECT_EQ(w.size(), 1u);  // failed adds leave nothing behind
}

TEST(SafetensorsWriterErrors, FailedWriteLeavesNoTraceAndKeepsOldFile) {
  TempDir dir;
  std::vector<std::byte> four(4);
  SafetensorsWriter w;
  w.add("x", DType::f32, {1}, four);
  // Into a folder that does not exist.
  expect_error([&] { w.write(dir / "missing" / "a.safetensors"); }, ErrorKind::io,
               {"temporary file"});
  // Over a non-empty folder: the rename fails, the folder and its content stay.
  std::filesystem::create_directory(dir / "target.safetensors");
  write_file(dir / "target.safetensors" / "keep", "data");
  expect_error([&] { w.write(dir / "target.safetensors"); }, ErrorKind::io, {"rename"});
  EXPECT_EQ(read_file(dir / "target.safetensors" / "keep"), "data");
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "target.safetensors");
  }
  EXPECT_EQ(entries, 1u);  // no temporary files left
  // Replacing an existing file works and leaves only the new file.
  write_file(dir / "old.safetensors", "old content");
  w.write(dir / "old.safetensors");
  EXPECT_EQ(SafetensorsFile::open(dir / "old.safetensors").tensors().size(), 1u);
}

// ---- malformed files: one test per check ---------------------------------------------

class SafetensorsMalformed : public ::testing::Test {
 protected:
  // Writes raw bytes and expects open() to throw `kind` with every part in the message
  // (the file path is always expected too).
  void expect_open_error(const std::string& bytes, ErrorKind kind,
                         std::initializer_list<std::string_view> parts) {
    const auto path = dir_ / "bad.safetensors";
    write_file(path, bytes);
    expect_error([&] { (void)SafetensorsFile::open(path); }, kind, parts);
    expect_error([&] { (void)SafetensorsFile::open(path); }, kind, {path.string()});
  }
  // A header of one tensor entry `entry` named "w", with `data` bytes after it.
  void expect_entry_error(const std::string& entry, size_t data, ErrorKind kind,
                          std::initializer_list<std::string_view> parts) {
    expect_open_error(safetensors_bytes("{\"w\":" + entry + "}", std::string(data, '\0')), kind,
                      parts);
  }
  TempDir dir_;
};

TEST_F(SafetensorsMalformed, ShorterThan8Bytes) {
  expect_open_error("", ErrorKind::format, {"0 bytes", "at least 8"});
  expect_open_error(std::string("\x10\0\0\0\0\0\0", 7), ErrorKind::format, {"7 bytes", "at least 8"});
}

TEST_F(SafetensorsMalformed, HeaderLengthBeyondFile) {
  expect_open_error(le64(100) + "{}", ErrorKind::format,
                    {"header length 100", "exceeds the 2 bytes", "truncated"});
}

TEST_F(SafetensorsMalformed, HeaderLengthAbsurd) {
  expect_open_error(le64(uint64_t{1} << 40) + "{}", ErrorKind::format, {"absurd", "1099511627776"});
  expect_open_error(le64(~uint64_t{0}) + "{}", ErrorKind::format, {"absurd"});
}

TEST_F(SafetensorsMalformed, HeaderEmpty) {
  expect_open_error(le64(0), ErrorKind::format, {"header is empty"});
}

TEST_F(SafetensorsMalformed, HeaderNotStartingWithBrace) {
  expect_open_error(safetensors_bytes("[1,2]   ", ""), ErrorKind::format, {"0x5b", "expected '{'"});
  expect_open_error(safetensors_bytes(" {}", ""), ErrorKind::format, {"0x20", "expected '{'"});
}

TEST_F(SafetensorsMalformed, HeaderNotJson) {
  expect_open_error(safetensors_bytes("{\"w\":{\"dtype\":", ""), ErrorKind::format,
                    {"not valid JSON"});
  expect_open_error(safetensors_bytes("{} trailing", ""), ErrorKind::format, {"not valid JSON"});
  expect_open_error(safetensors_bytes(std::string("{}\0\0", 4), ""), ErrorKind::format,
                    {"NUL byte at header offset 2", "not valid JSON"});
}

TEST_F(SafetensorsMalformed, HeaderNotUtf8) {
  expect_open_error(safetensors_bytes("{\"w\xff\":1}", ""), ErrorKind::format,
                    {"not valid UTF-8", "offset 3"});
  // An overlong encoding of '/'.
  expect_open_error(safetensors_bytes("{\"\xc0\xaf\":1}", ""), ErrorKind::format, {"UTF-8"});
}

TEST_F(SafetensorsMalformed, HeaderTooDeep) {
  const std::string deep = "{\"__metadata__\":" + std::string(100, '[') + std::string(100, ']') + "}";
  expect_open_error(safetensors_bytes(deep, ""), ErrorKind::format, {"nests deeper"});
}

TEST_F(SafetensorsMalformed, DuplicateTensorName) {
  expect_open_error(
      safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                        "ab"),
      ErrorKind::format, {"'w'", "twice"});
}

TEST_F(SafetensorsMalformed, EntryNotObject) {
  expect_entry_error("[1]", 0, ErrorKind::format, {"tensor 'w'", "JSON array", "expected an object"});
}

TEST_F(SafetensorsMalformed, MissingDtype) {
  expect_entry_error(R"({"shape":[1],"data_offsets":[0,4]})", 4, ErrorKind::format,
                     {"tensor 'w'", "missing \"dtype\""});
}

TEST_F(SafetensorsMalformed, MissingShape) {
  expect_entry_error(R"({"dtype":"F32","data_offsets":[0,4]})", 4, ErrorKind::format,
                     {"tensor 'w'", "missing \"shape\""});
}

TEST_F(SafetensorsMalformed, MissingDataOffsets) {
  expect_entry_error(R"({"dtype":"F32","shape":[1]})", 4, ErrorKind::format,
                     {"tensor 'w'", "missing \"data_offsets\""});
}

TEST_F(SafetensorsMalformed, DtypeWrongType) {
  expect_entry_error(R"({"dtype":32,"shape":[1],"data_offsets":[0,4]})", 4, ErrorKind::format,
                     {"tensor 'w'", "\"dtype\" is a JSON number", "(32)"});
}

TEST_F(SafetensorsMalformed, ShapeWrongType) {
  expect_entry_error(R"({"dtype":"F32","shape":"1","data_offsets":[0,4]})", 4, ErrorKind::format,
                     {"tensor 'w'", "\"shape\" is a JSON string"});
  expect_entry_error(R"({"dtype":"F32","shape":[[1]],"data_offsets":[0,4]})", 4,
                     ErrorKind::format, {"tensor 'w'", "shape[0] = [1]", "not an integer"});
}

TEST_F(SafetensorsMalformed, DataOffsetsWrongType) {
  expect_entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":{"a":0}})", 4,
                     ErrorKind::format, {"tensor 'w'", "[begin, end]"});
  expect_entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", 4, ErrorKind::format,
                     {"tensor 'w'", "data_offsets\" is [0]", "two"});
  expect_entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", 4,
                     ErrorKind::format, {"tensor 'w'", "two"});
  expect_entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":["0",4]})", 4,
                     ErrorKind::format, {"tensor 'w'", "data_offsets[0] = \"0\""});
  expect_entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", 4,
                     ErrorKind::format, {"tensor 'w'", "data_offsets[0] = -4"});
  expect_entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4.0]})", 4,
                     ErrorKind::format, {"tensor 'w'", "data_offsets[1] = 4.0"});
}

TEST_F(SafetensorsMalformed, UnknownDtype) {
  expect_entry_error(R"({"dtype":"F33","shape":[1],"data_offsets":[0,4]})", 4, ErrorKind::format,
                     {"tensor 'w'", "unknown dtype 'F33'", "F32, F16, BF16, I8, U8, I32, U32"});
  expect_entry_error(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})", 4, ErrorKind::format,
                     {"unknown dtype 'f32'"});
}

TEST_F(SafetensorsMalformed, UnsupportedDtypes) {
  for (const char* dt : {"F8_E8M0", "F6_E2M3", "F4", "C64"}) {
    SCOPED_TRACE(dt);
    expect_entry_error(std::string(R"({"dtype":")") + dt + R"(","shape":[1],"data_offsets":[0,8]})",
                       8, ErrorKind::unsupported,
                       {"tensor 'w'", std::string("unsupported dtype ") + dt, "F32, F16, BF16"});
  }
}

TEST_F(SafetensorsMalformed, NegativeShape) {
  expect_entry_error(R"({"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]})", 0, ErrorKind::format,
                     {"tensor 'w'", "shape[1] = -1", "negative"});
}

TEST_F(SafetensorsMalformed, NonIntegerShape) {
  expect_entry_error(R"({"dtype":"U8","shape":[2.5],"data_offsets":[0,2]})", 2, ErrorKind::format,
                     {"tensor 'w'", "shape[0] = 2.5", "not an integer"});
  expect_entry_error(R"({"dtype":"U8","shape":[true],"data_offsets":[0,1]})", 1, ErrorKind::format,
                     {"tensor 'w'", "shape[0] = true", "not an integer"});
  expect_entry_error(R"({"dtype":"U8","shape":[1e30],"data_offsets":[0,1]})", 1,
                     ErrorKind::format, {"tensor 'w'", "not an integer"});
}

TEST_F(SafetensorsMalformed, ShapeEntryTooLarge) {
  expect_entry_error(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]})", 1,
                     ErrorKind::format, {"tensor 'w'", "shape[0] = 18446744073709551615", "too large"});
}

TEST_F(SafetensorsMalformed, ShapeProductOverflow) {
  expect_entry_error(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})", 0,
                     ErrorKind::format, {"tensor 'w'", "[4294967296, 4294967296]", "more elements"});
  // A zero extent does not excuse the others from fitting.
  expect_entry_error(R"({"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]})",
                     0, ErrorKind::format, {"tensor 'w'", "more elements"});
  // Elements fit in int64 but bytes overflow 64 bits.
  expect_entry_error(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})", 0,
                     ErrorKind::format, {"tensor 'w'", "more bytes than fit in 64 bits"});
}

TEST_F(SafetensorsMalformed, DataOffsetsBeginAfterEnd) {
  expect_entry_error(R"({"dtype":"U8","shape":[0],"data_offsets":[4,2]})", 4, ErrorKind::format,
                     {"tensor 'w'", "[4, 2]", "begin > end"});
}

TEST_F(SafetensorsMalformed, DataBeyondEndTruncated) {
  expect_entry_error(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", 10, ErrorKind::format,
                     {"tensor 'w'", "[0, 16]", "10 bytes", "truncated"});
  expect_entry_error(
      R"({"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]})", 0,
      ErrorKind::format, {"tensor 'w'", "truncated"});
}

TEST_F(SafetensorsMalformed, SizeMismatch) {
  expect_entry_error(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", 24,
                     ErrorKind::format, {"tensor 'w'", "span 20 bytes", "expected 24", "[2, 3]"});
  expect_entry_error(R"({"dtype":"BF16","shape":[],"data_offsets":[0,0]})", 24, ErrorKind::format,
                     {"tensor 'w'", "span 0 bytes", "expected 2"});
}

TEST_F(SafetensorsMalformed, OverlappingTensors) {
  expect_open_error(
      safetensors_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                        "abcdef"),
      ErrorKind::format, {"'a'", "'b'", "overlap", "[0, 4)", "[2, 6)"});
  // Contained in a larger range, with a non-overlapping range between in sort order.
  expect_open_error(
      safetensors_bytes(R"({"big":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                        R"("x":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})",
                        "abcdefgh"),
      ErrorKind::format, {"'big'", "'x'", "overlap"});
}

TEST_F(SafetensorsMalformed, MetadataNotStringMap) {
  expect_open_error(safetensors_bytes(R"({"__metadata__":{"k":1}})", ""), ErrorKind::format,
                    {"__metadata__", "'k'", "JSON number", "expected a string"});
  expect_open_error(safetensors_bytes(R"({"__metadata__":{"k":{"n":"v"}}})", ""),
                    ErrorKind::format, {"__metadata__", "'k'", "expected a string"});
  expect_open_error(safetensors_bytes(R"({"__metadata__":["a"]})", ""), ErrorKind::format,
                    {"__metadata__", "JSON array", "expected an object"});
}

TEST_F(SafetensorsMalformed, NotAFile) {
  expect_error([&] { (void)SafetensorsFile::open(dir_ / "absent.safetensors"); }, ErrorKind::io,
               {"absent.safetensors", "No such file"});
  expect_error([&] { (void)SafetensorsFile::open(dir_.path()); }, ErrorKind::io, {"directory"});
}

// ---- tolerated irregularities ---------------------------------------------------------

TEST(SafetensorsTolerated, GapsTrailingBytesEmptyRangesNullMetadata) {
  TempDir dir;
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
      R"("z":{"dtype":"U8","shape":[0],"data_offsets":[5,5]},)"
      R"("e":{"dtype":"I32","shape":[0,3],"data_offsets":[10,10]},"__metadata__":null})";
  write_file(dir / "g.safetensors", safetensors_bytes(header, "....ab....tail"));
  const auto f = SafetensorsFile::open(dir / "g.safetensors");
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.bytes("a")[1], std::byte{'b'});
  EXPECT_EQ(f.bytes("z").size(), 0u);
  EXPECT_EQ(f.view("e").numel(), 0);
  EXPECT_FALSE(f.has_metadata());
}

TEST(SafetensorsTolerated, MissingTensorNamesFileAndAlternatives) {
  TempDir dir;
  SafetensorsWriter w;
  std::vector<std::byte> one(1);
  for (const char* n : {"model.embed", "model.norm", "lm_head"}) w.add(n, DType::u8, {1}, one);
  w.write(dir / "n.safetensors");
  const auto f = SafetensorsFile::open(dir / "n.safetensors");
  expect_error([&] { (void)f.view("model.nrom"); }, ErrorKind::format,
               {"no tensor 'model.nrom'", "n.safetensors", "3 tensors", "'lm_head'"});
  expect_error([&] { (void)f.bytes("x"); }, ErrorKind::format, {"no tensor 'x'"});
}

// ---- never crash: every truncation and many random corruptions ------------------------

TEST(SafetensorsRobustness, TruncationsAndCorruptionsThrowOrOpen) {
  TempDir dir;
  SafetensorsWriter w;
  std::vector<std::byte> data = random_bytes(64, 3);
  w.add("a", DType::f32, {2, 4}, std::span(data).subspan(0, 32));
  w.add("b", DType::f16, {3}, std::span(data).subspan(32, 6));
  w.add("c", DType::u8, {}, std::span(data).subspan(40, 1));
  w.set_metadata({{"k", "v"}});
  w.write(dir / "ok.safetensors");
  const std::string good = read_file(dir / "ok.safetensors");
  const auto path = dir / "t.safetensors";

  auto try_open = [&](const std::string& bytes) {
    write_file(path, bytes);
    try {
      const auto f = SafetensorsFile::open(path);
      for (const auto& t : f.tensors()) {
        const auto span = f.bytes(t);
        volatile std::byte sink{};
        for (auto b : span) sink = sink ^ b;  // touch every byte: must stay in bounds
        EXPECT_LE(f.data_offset() + t.data_end, f.file_size());
      }
    } catch (const Error&) {
      // fine: malformed
    }
  };
  for (size_t n = 0; n < good.size(); ++n) try_open(good.substr(0, n));
  const size_t header_end = 8 + w.header_bytes().size();
  std::mt19937 rng(42);
  for (int i = 0; i < 1000; ++i) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      const size_t pos = rng() % std::min(bad.size(), header_end);
      bad[pos] = static_cast<char>(rng() & 0xFF);
    }
    try_open(bad);
  }
}

}  // namespace
}  // namespace lowbit::io
