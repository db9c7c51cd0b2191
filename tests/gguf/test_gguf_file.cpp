#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <random>

#include "cli_runner.h"
#include "error_matchers.h"
#include "gguf/gguf_builder.h"
#include "lowbit/core/half.h"
#include "lowbit/formats/float_zero.h"
#include "lowbit/gguf/gguf_file.h"

namespace lowbit::gguf {
namespace {

using lowbit::test::expect_error;
using test::as_bytes;
using test::GgufBuilder;

GgufFile parse(const GgufBuilder& b) {
  const auto bytes = b.build();
  return GgufFile::from_bytes(bytes, "test.gguf");
}

uint16_t h(float x) { return float_to_f16(x).bits; }

// Random blocks of a type whose f16 scale fields are set to finite values in
// a sane range (random bytes there would be NaN/inf now and then).
std::vector<std::byte> random_q4_blocks(GgmlType type, size_t blocks, std::mt19937& rng) {
  const size_t ts = type == GgmlType::Q4_1 ? 20 : 18;
  std::vector<std::byte> out(blocks * ts);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (size_t i = 0; i < blocks; ++i) {
    std::byte* b = out.data() + i * ts;
    const uint16_t d = h(scale(rng)), m = h(scale(rng) * 8);
    std::memcpy(b, &d, 2);
    size_t at = 2;
    if (type == GgmlType::Q4_1) {
      std::memcpy(b + 2, &m, 2);
      at = 4;
    }
    for (size_t j = at; j < ts; ++j) b[j] = static_cast<std::byte>(rng() & 0xFF);
  }
  return out;
}

GgufBuilder small_file() {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  b.kv_u32("llama.block_count", 2);
  b.kv_f32("llama.rope.freq_base", 10000.0f);
  b.kv_bool("tokenizer.ggml.add_bos_token", true);
  b.kv_strings("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  b.kv_i32s("tokenizer.ggml.token_type", {1, 1, 3});
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i) - 3.0f;
  b.tensor("norm.weight", {64}, 0, as_bytes(w));
  std::mt19937 rng(7);
  b.tensor("q.weight", {64, 3}, 3, random_q4_blocks(GgmlType::Q4_1, 6, rng));
  return b;
}

// ---- metadata ------------------------------------------------------------------

TEST(GgufMetadata, TypedGettersAndTypeErrors) {
  GgufBuilder b = small_file();
  b.kv_i8("x.i8", -5);
  b.kv_u16("x.u16", 65535);
  b.kv_u64("x.u64", 1ull << 40);
  b.kv_u64("x.huge", ~0ull);
  b.kv_f64("x.f64", 0.125);
  b.kv_f32s("x.floats", {1.5f, -2.0f});
  const GgufFile f = parse(b);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_EQ(f.get_int("x.i8"), -5);
  EXPECT_EQ(f.get_int("x.u16"), 65535);
  EXPECT_EQ(f.get_int("x.u64"), int64_t{1} << 40);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(f.get_float("x.f64"), 0.125);
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "b", "<s>"}));
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 1, 3}));
  EXPECT_EQ(f.get_float_array("x.floats"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.array_size("tokenizer.ggml.tokens"), 3u);
  EXPECT_EQ(*f.type_of("llama.block_count"), ValueType::u32);
  EXPECT_EQ(*f.array_type_of("tokenizer.ggml.tokens"), ValueType::string);
  EXPECT_FALSE(f.type_of("nope").has_value());
  EXPECT_EQ(f.get_int_or("nope", 42), 42);
  EXPECT_EQ(f.get_string_or("nope", "x"), "x");
  EXPECT_EQ(f.metadata_keys().front(), "general.architecture");
  EXPECT_EQ(f.describe_value("tokenizer.ggml.tokens"), "array[string] x 3 [\"a\", \"b\", \"<s>\"]");

  expect_error([&] { (void)f.get_int("general.architecture"); }, ErrorKind::invalid_argument,
               {"'general.architecture'", "is a string", "expected an integer"});
  expect_error([&] { (void)f.get_string("llama.block_count"); }, ErrorKind::invalid_argument,
               {"'llama.block_count'", "is a u32", "expected a string"});
  expect_error([&] { (void)f.get_float("llama.block_count"); }, ErrorKind::invalid_argument,
               {"is a u32", "expected a float"});
  expect_error([&] { (void)f.get_int_array("tokenizer.ggml.tokens"); }, ErrorKind::invalid_argument,
               {"is a array[string]", "expected an array of integers"});
  expect_error([&] { (void)f.get_bool("nope"); }, ErrorKind::invalid_argument, {"no metadata key 'nope'"});
  expect_error([&] { (void)f.get_int("x.huge"); }, ErrorKind::invalid_argument, {"'x.huge'", "above 2^63-1"});
  expect_error([&] { (void)f.get_int_or("general.architecture", 1); }, ErrorKind::invalid_argument,
               {"is a string"});
}

TEST(GgufMetadata, VersionTwoAndAlignment) {
  GgufBuilder b = small_file();
  b.version = 2;
  b.alignment = 64;
  b.kv_u32("general.alignment", 64);
  const GgufFile f = parse(b);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  const TensorInfo& q = f.tensor("q.weight");
  EXPECT_EQ(q.offset % 64, 0u);
  EXPECT_EQ(q.nbytes, 6u * 20);
  EXPECT_EQ(q.describe(), "q.weight Q4_1 [64, 3]");
}

// ---- tensors and dequantization ------------------------------------------------

TEST(GgufTensors, TableAndBytes) {
  const GgufBuilder b = small_file();
  const GgufFile f = parse(b);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "norm.weight");
  EXPECT_EQ(f.tensors()[0].shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(f.tensors()[1].type, GgmlType::Q4_1);
  EXPECT_EQ(f.tensors()[1].num_rows(), 3);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
  expect_error([&] { (void)f.tensor("missing"); }, ErrorKind::format,
               {"no tensor 'missing'", "'norm.weight'"});
  const auto bytes = f.tensor_bytes(f.tensor("q.weight"));
  ASSERT_EQ(bytes.size(), 120u);
  EXPECT_EQ(std::memcmp(bytes.data(), b.tensors[1].data.data(), 120), 0);
  const auto norm = dequantize_to_f32(f, f.tensor("norm.weight"));
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(norm[i], 0.25f * static_cast<float>(i) - 3.0f);
}

// Hand-made blocks with the weights written out from the block definitions.
TEST(GgufDequantize, KnownBlocks) {
  GgufBuilder b;
  std::vector<std::byte> q40(18), q41(20), q80(34), f16s(64), bf16s(64);
  const uint16_t d = h(0.5f), m = h(-1.25f);
  std::memcpy(q40.data(), &d, 2);
  std::memcpy(q41.data(), &d, 2);
  std::memcpy(q41.data() + 2, &m, 2);
  std::memcpy(q80.data(), &d, 2);
  for (int j = 0; j < 16; ++j) {
    // low nibble j (element j), high nibble 15 - j (element j + 16)
    q40[2 + static_cast<size_t>(j)] = static_cast<std::byte>(j | (15 - j) << 4);
    q41[4 + static_cast<size_t>(j)] = static_cast<std::byte>(j | (15 - j) << 4);
  }
  for (int j = 0; j < 32; ++j) {
    q80[2 + static_cast<size_t>(j)] = static_cast<std::byte>(static_cast<int8_t>(j * 7 - 100));
    const uint16_t hv = h(static_cast<float>(j) * 0.125f - 1.0f);
    const uint16_t bv = static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(j) - 7.5f) >> 16);
    std::memcpy(f16s.data() + 2 * j, &hv, 2);
    std::memcpy(bf16s.data() + 2 * j, &bv, 2);
  }
  b.tensor("q40", {32}, 2, q40);
  b.tensor("q41", {32}, 3, q41);
  b.tensor("q80", {32}, 8, q80);
  b.tensor("f16", {32}, 1, f16s);
  b.tensor("bf16", {32}, 30, bf16s);
  const GgufFile f = parse(b);
  const auto a = dequantize_to_f32(f, f.tensor("q40"));
  const auto c = dequantize_to_f32(f, f.tensor("q41"));
  const auto e = dequantize_to_f32(f, f.tensor("q80"));
  const auto g = dequantize_to_f32(f, f.tensor("f16"));
  const auto k = dequantize_to_f32(f, f.tensor("bf16"));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(a[static_cast<size_t>(j)], 0.5f * static_cast<float>(j - 8));
    EXPECT_EQ(a[static_cast<size_t>(j + 16)], 0.5f * static_cast<float>(15 - j - 8));
    EXPECT_EQ(c[static_cast<size_t>(j)], 0.5f * static_cast<float>(j) - 1.25f);
    EXPECT_EQ(c[static_cast<size_t>(j + 16)], 0.5f * static_cast<float>(15 - j) - 1.25f);
  }
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(e[static_cast<size_t>(j)], 0.5f * static_cast<float>(j * 7 - 100));
    EXPECT_EQ(g[static_cast<size_t>(j)], static_cast<float>(j) * 0.125f - 1.0f);
    EXPECT_EQ(k[static_cast<size_t>(j)], static_cast<float>(j) - 7.5f);
  }
  EXPECT_TRUE(can_dequantize(GgmlType::Q6_K));
  EXPECT_FALSE(can_dequantize(GgmlType::IQ2_XXS));
}

TEST(GgufDequantize, RowsMatchWholeTensorAndRejectBadRanges) {
  GgufBuilder b;
  std::mt19937 rng(3);
  b.tensor("w", {64, 37}, 3, random_q4_blocks(GgmlType::Q4_1, 2 * 37, rng));
  const GgufFile f = parse(b);
  const TensorInfo& t = f.tensor("w");
  const auto all = dequantize_to_f32(f, t);
  std::vector<float> part(5 * 64, std::nanf(""));
  dequantize_rows_to_f32(f, t, 30, 35, part);
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], all[30 * 64 + i]);
  expect_error([&] { dequantize_rows_to_f32(f, t, 30, 38, part); }, ErrorKind::invalid_argument, {"rows"});
  expect_error([&] { dequantize_rows_to_f32(f, t, 0, 4, part); }, ErrorKind::invalid_argument, {"out.size()"});
}

TEST(GgufDequantize, UnsupportedTypeIsAClearError) {
  GgufBuilder b;
  b.tensor("iq", {256}, 16, std::vector<std::byte>(66));
  const GgufFile f = parse(b);
  expect_error([&] { (void)dequantize_to_f32(f, f.tensor("iq")); }, ErrorKind::unsupported,
               {"'iq'", "IQ2_XXS", "cannot dequantize"});
}

// Q4_1 and Q4_0 map onto QuantizedLinear without changing a single weight:
// lowbit's W[k][n] must equal ggml's element k of row n, bit for bit.
TEST(GgufQuantizedLinear, Q4_1AndQ4_0AreExact) {
  for (const GgmlType type : {GgmlType::Q4_1, GgmlType::Q4_0}) {
    SCOPED_TRACE(ggml_type_name(type));
    const int64_t K = 96, N = 5;
    GgufBuilder b;
    std::mt19937 rng(11);
    b.tensor("w", {uint64_t(K), uint64_t(N)}, static_cast<uint32_t>(type),
             random_q4_blocks(type, static_cast<size_t>(N * K / 32), rng));
    const GgufFile f = parse(b);
    const auto ref = dequantize_to_f32(f, f.tensor("w"));
    const formats::QuantizedLinear q = to_quantized_linear(f, f.tensor("w"));
    EXPECT_EQ(q.K, K);
    EXPECT_EQ(q.N, N);
    EXPECT_EQ(q.group_size, 32);
    EXPECT_EQ(q.zero_point, type == GgmlType::Q4_1 ? formats::ZeroPoint::float_min
                                                   : formats::ZeroPoint::symmetric);
    // Q4_1: the same operations (d*q + m), so the same bits. Q4_0: ggml's
    // (q - 8)*d gives -0 for q = 8 and d < 0 where lowbit's s*q + m gives +0
    // (quantized_linear.h allows that sign), so compare values there.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float want = ref[static_cast<size_t>(n * K + k)], got = q.dequant(k, n);
        if (type == GgmlType::Q4_1)
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "k=" << k << " n=" << n;
        else
          ASSERT_EQ(got, want) << "k=" << k << " n=" << n;
      }
    if (type == GgmlType::Q4_1) {
      // Back to ggml blocks: the same bytes; and f16 mins pack without rounding.
      const auto blocks = formats::pack_q4_1(q);
      ASSERT_EQ(blocks.size() * sizeof(formats::BlockQ4_1), b.tensors[0].data.size());
      EXPECT_EQ(std::memcmp(blocks.data(), b.tensors[0].data.data(), b.tensors[0].data.size()), 0);
      formats::FloatZeroOptions opt;
      opt.mins_dtype = DType::f16;
      EXPECT_NO_THROW((void)formats::pack_float_zero(q, opt));
    }
  }
}

TEST(GgufQuantizedLinear, OtherTypesAndShapesAreRejected) {
  GgufBuilder b;
  b.tensor("q8", {32, 2}, 8, std::vector<std::byte>(68));
  std::mt19937 rng(1);
  b.tensor("q41_3d", {32, 2, 2}, 3, random_q4_blocks(GgmlType::Q4_1, 4, rng));
  const GgufFile f = parse(b);
  expect_error([&] { (void)to_quantized_linear(f, f.tensor("q8")); }, ErrorKind::unsupported,
               {"'q8'", "Q8_0", "only Q4_1 and Q4_0"});
  expect_error([&] { (void)to_quantized_linear(f, f.tensor("q41_3d")); }, ErrorKind::format,
               {"'q41_3d'", "3 dimensions"});
}

// ---- malformed files -------------------------------------------------------------

void expect_format_error(const std::vector<std::byte>& bytes, std::initializer_list<std::string_view> needles) {
  expect_error([&] { (void)GgufFile::from_bytes(bytes, "bad.gguf"); }, ErrorKind::format, needles);
}

TEST(GgufMalformed, HeaderErrors) {
  GgufBuilder b = small_file();
  b.magic = "GGML";
  expect_format_error(b.build(), {"bad.gguf", "bad magic 'GGML'", "expected 'GGUF'"});
  b = small_file();
  b.version = 7;
  expect_format_error(b.build(), {"version 7", "expected 2 or 3"});
  b.version = 1;
  expect_error([&] { (void)GgufFile::from_bytes(b.build(), "old.gguf"); }, ErrorKind::unsupported,
               {"version 1"});
  b = small_file();
  b.kv_count_override = uint64_t{1} << 60;
  expect_format_error(b.build(), {"metadata count", "absurd"});
  b = small_file();
  b.tensor_count_override = uint64_t{1} << 59;
  expect_format_error(b.build(), {"tensor count", "absurd"});
}

TEST(GgufMalformed, EveryTruncationIsAFormatError) {
  const auto bytes = small_file().build();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<std::byte> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    try {
      (void)GgufFile::from_bytes(cut, "cut.gguf");
      ADD_FAILURE() << "a file cut to " << n << " of " << bytes.size() << " bytes was accepted";
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::format) << n << ": " << e.what();
    }
  }
}

TEST(GgufMalformed, MetadataErrors) {
  auto with = [](auto&& add) {
    GgufBuilder b = small_file();
    add(b);
    return b.build();
  };
  expect_format_error(with([](GgufBuilder& b) { b.kv_u32("llama.block_count", 3); }),
                      {"'llama.block_count' appears twice"});
  expect_format_error(with([](GgufBuilder& b) { b.add_kv("k", 13, [](test::Bytes& x) { x.put<uint32_t>(0); }); }),
                      {"'k'", "value type 13"});
  expect_format_error(with([](GgufBuilder& b) { b.add_kv("k", 7, [](test::Bytes& x) { x.put<uint8_t>(2); }); }),
                      {"'k'", "bool with value 2"});
  expect_format_error(with([](GgufBuilder& b) {
                        b.add_kv("k", 8, [](test::Bytes& x) { x.put<uint64_t>(uint64_t{1} << 62); });
                      }),
                      {"'k'", "has length 4611686018427387904"});
  expect_format_error(with([](GgufBuilder& b) {
                        b.add_kv("k", 9, [](test::Bytes& x) {
                          x.put<uint32_t>(4);
                          x.put<uint64_t>(uint64_t{1} << 61);
                        });
                      }),
                      {"'k'", "claims 2305843009213693952 elements"});
  expect_error([&] {
    (void)GgufFile::from_bytes(with([](GgufBuilder& b) {
      b.add_kv("k", 9, [](test::Bytes& x) {
        x.put<uint32_t>(9);
        x.put<uint64_t>(0);
      });
    }));
  }, ErrorKind::unsupported, {"'k'", "array of arrays"});
  expect_format_error(with([](GgufBuilder& b) { b.kv_u32("general.alignment", 48); }),
                      {"general.alignment = 48", "power of two"});
  expect_format_error(with([](GgufBuilder& b) { b.kv_string("general.alignment", "32"); }),
                      {"'general.alignment' is a string"});
}

TEST(GgufMalformed, TensorErrors) {
  std::mt19937 rng(5);
  const auto q41 = random_q4_blocks(GgmlType::Q4_1, 2, rng);
  auto one = [&](std::vector<uint64_t> shape, uint32_t type, std::vector<std::byte> data,
                 std::optional<uint64_t> offset = std::nullopt) {
    GgufBuilder b;
    b.tensor("t", std::move(shape), type, std::move(data), offset);
    return b;
  };
  expect_format_error(one({}, 0, {}).build(), {"'t'", "0 dimensions"});
  expect_format_error(one({1, 1, 1, 1, 1}, 0, std::vector<std::byte>(4)).build(), {"'t'", "5 dimensions"});
  expect_format_error(one({uint64_t{1} << 40, uint64_t{1} << 40}, 0, {}).build(), {"'t'", "overflows"});
  expect_format_error(one({~0ull}, 0, {}).build(), {"'t'", "absurd"});
  expect_format_error(one({32}, 4, std::vector<std::byte>(20)).build(), {"'t'", "ggml type id 4"});
  expect_format_error(one({32}, 99, std::vector<std::byte>(20)).build(), {"'t'", "ggml type id 99"});
  expect_format_error(one({48}, 3, std::vector<std::byte>(40)).build(), {"'t'", "multiple of its block size 32"});
  expect_format_error(one({64}, 3, q41, 16).build(), {"'t'", "offset 16", "alignment 32"});
  GgufBuilder far = one({64}, 3, q41, uint64_t{1} << 40);
  far.tensors[0].place = false;  // the info says 2^40, the file holds nothing there
  expect_format_error(far.build(), {"'t'", "beyond the data section"});
  GgufBuilder b = one({64}, 3, q41);
  b.tensor("u", {64}, 3, q41, 32);  // bytes 32..72 overlap t's 0..40
  expect_format_error(b.build(), {"'t'", "'u'", "overlap"});
  b = one({64}, 3, q41);
  b.tensor("t", {64}, 3, q41);
  expect_format_error(b.build(), {"tensor 't' appears twice"});
}

// Random corruption of a valid file: the reader either accepts it or throws
// lowbit::Error; it must never crash, hang or throw anything else.
TEST(GgufMalformed, RandomByteFlipsNeverCrash) {
  const auto good = small_file().build();
  std::mt19937 rng(2024);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) bytes[rng() % bytes.size()] = static_cast<std::byte>(rng() & 0xFF);
    try {
      const GgufFile f = GgufFile::from_bytes(bytes);
      for (const auto& t : f.tensors())
        if (can_dequantize(t.type)) (void)dequantize_to_f32(f, t);
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);  // most flips in the header area are caught
}

TEST(GgufOpen, FileSystemErrors) {
  expect_error([] { (void)GgufFile::open("/nonexistent/dir/x.gguf"); }, ErrorKind::io,
               {"cannot open", "x.gguf"});
  expect_error([] { (void)GgufFile::open(LOWBIT_SOURCE_DIR); }, ErrorKind::io, {"not a regular file"});
  const auto path = std::filesystem::temp_directory_path() / ("lowbit_gguf_test_" + std::to_string(::getpid()) + ".gguf");
  {
    std::ofstream out(path, std::ios::binary);
    out << "GGUF";
  }
  expect_error([&] { (void)GgufFile::open(path); }, ErrorKind::format, {"4 bytes long"});
  const auto bytes = small_file().build();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.file_size(), bytes.size());
  EXPECT_EQ(f.tensors().size(), 2u);
  std::filesystem::remove(path);
}

// ---- the default model ---------------------------------------------------------------

TEST(GgufDefaultModel, MetadataAndTensorTable) {
  LOWBIT_DEFAULT_MODEL_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.get_int("llama.context_length"), 8192);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 64);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f.get_int("general.file_type"), 3);  // mostly Q4_1
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.array_size("tokenizer.ggml.tokens"), 49152u);
  EXPECT_EQ(f.array_size("tokenizer.ggml.merges"), 48900u);

  ASSERT_EQ(f.tensors().size(), 272u);  // 30 blocks x 9 + token_embd + output_norm (tied output)
  const TensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(f.tensor("output_norm.weight").type, GgmlType::F32);
  for (int l = 0; l < 30; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(f.tensor(p + "attn_q.weight").shape, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(f.tensor(p + "attn_k.weight").shape, (std::vector<int64_t>{576, 192}));
    EXPECT_EQ(f.tensor(p + "attn_v.weight").shape, (std::vector<int64_t>{576, 192}));
    EXPECT_EQ(f.tensor(p + "attn_output.weight").shape, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(f.tensor(p + "ffn_gate.weight").shape, (std::vector<int64_t>{576, 1536}));
    EXPECT_EQ(f.tensor(p + "ffn_up.weight").shape, (std::vector<int64_t>{576, 1536}));
    EXPECT_EQ(f.tensor(p + "ffn_down.weight").shape, (std::vector<int64_t>{1536, 576}));
    EXPECT_EQ(f.tensor(p + "ffn_down.weight").type, GgmlType::Q4_1);
    EXPECT_EQ(f.tensor(p + "attn_norm.weight").type, GgmlType::F32);
  }
}

TEST(GgufDefaultModel, Q4_1LayersMapExactlyAndEmbeddingRowsDecode) {
  LOWBIT_DEFAULT_MODEL_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  for (const char* name : {"blk.0.attn_q.weight", "blk.29.ffn_down.weight"}) {
    const TensorInfo& t = f.tensor(name);
    const auto ref = dequantize_to_f32(f, t);
    const auto q = to_quantized_linear(f, t);
    const int64_t K = t.shape[0], N = t.shape[1];
    ASSERT_EQ(q.K, K);
    ASSERT_EQ(q.N, N);
    int64_t mismatches = 0;
    double sum_abs = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float r = ref[static_cast<size_t>(n * K + k)];
        mismatches += std::bit_cast<uint32_t>(q.dequant(k, n)) != std::bit_cast<uint32_t>(r);
        sum_abs += std::fabs(r);
      }
    EXPECT_EQ(mismatches, 0) << name;
    // Real trained weights: not all zero, of a plausible size.
    const double mean_abs = sum_abs / static_cast<double>(K * N);
    EXPECT_GT(mean_abs, 1e-3) << name;
    EXPECT_LT(mean_abs, 1.0) << name;
  }
  const TensorInfo& emb = f.tensor("token_embd.weight");
  std::vector<float> row(576);
  dequantize_rows_to_f32(f, emb, 1, 2, row);  // <|im_start|>
  double norm = 0;
  for (float x : row) norm += double(x) * x;
  EXPECT_GT(norm, 0.0);
  EXPECT_TRUE(std::isfinite(norm));
}

}  // namespace
}  // namespace lowbit::gguf

// ---- `lowbit inspect` on a GGUF file ----------------------------------------------------

namespace lowbit::gguf {
namespace {

TEST(GgufInspect, DescribesArchitectureMetadataAndTensors) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("lowbit_gguf_inspect_" + std::to_string(::getpid()) + ".gguf");
  {
    const auto bytes = small_file().build();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const auto r = lowbit::test::run_lowbit("inspect " + path.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle : {"GGUF v3, 2 tensors", "1 x F32, 1 x Q4_1", "architecture: llama",
                             "llama.block_count = 2", "q.weight", "[64, 3]"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << " not in:\n" << r.output;
  // A corrupt file: exit code 1 and the reader's message.
  {
    auto bytes = small_file().build();
    bytes.resize(bytes.size() - 7);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const auto bad = lowbit::test::run_lowbit("inspect " + path.string());
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("beyond the data section"), std::string::npos) << bad.output;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace lowbit::gguf
