// parse_decode_gemv_splits: what `lowbit bench model --gemv-splits` and
// CudaEngineOptions::decode_gemv_splits take. Every malformed entry is
// refused with a message that names it.
#include <gtest/gtest.h>

#include "error_matchers.h"
#include "lowbit/engine/decode_gemv_splits.h"

namespace lowbit::engine {
namespace {

using test::throws_error;

TEST(DecodeGemvSplits, ParsesRolesAndSplitsAndFormatsThemBack) {
  EXPECT_TRUE(parse_decode_gemv_splits("").empty());
  const auto one = parse_decode_gemv_splits("qkv=4");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one.at("qkv"), 4);
  const auto all = parse_decode_gemv_splits("lm_head=2,down=12,o=1,gate_up=1024,qkv=5");
  EXPECT_EQ(all.size(), 5u);
  EXPECT_EQ(all.at("down"), 12);
  EXPECT_EQ(all.at("gate_up"), kMaxDecodeGemvSplit);
  EXPECT_EQ(all.at("lm_head"), 2);
  // Formatted in the roles' order, whatever order they were given in.
  EXPECT_EQ(format_decode_gemv_splits(all), "qkv=5,o=1,gate_up=1024,down=12,lm_head=2");
  EXPECT_EQ(parse_decode_gemv_splits(format_decode_gemv_splits(all)), all);
  EXPECT_EQ(format_decode_gemv_splits({}), "");
}

TEST(DecodeGemvSplits, RefusesMalformedEntriesByName) {
  const auto bad = [](const char* text, std::initializer_list<std::string_view> needles) {
    return throws_error([&] { parse_decode_gemv_splits(text); }, ErrorKind::invalid_argument, needles);
  };
  EXPECT_TRUE(bad("qkv", {"'qkv' is not role=split"}));
  EXPECT_TRUE(bad("qkv=", {"'qkv=' is not role=split"}));
  EXPECT_TRUE(bad("=4", {"'=4' is not role=split"}));
  EXPECT_TRUE(bad(",qkv=4", {"'' is not role=split"}));
  EXPECT_TRUE(bad("qkv=4,,o=2", {"'' is not role=split"}));
  EXPECT_TRUE(bad("qkv=4,", {"ends with a comma"}));
  EXPECT_TRUE(bad("attention=4", {"unknown role 'attention'", "gate_up"}));
  EXPECT_TRUE(bad("QKV=4", {"unknown role 'QKV'"}));
  EXPECT_TRUE(bad("qkv=0", {"'qkv=0'", "from 1 to 1024"}));
  EXPECT_TRUE(bad("qkv=-3", {"'qkv=-3'", "from 1 to 1024"}));
  EXPECT_TRUE(bad("qkv=1025", {"'qkv=1025'"}));
  EXPECT_TRUE(bad("qkv=4x", {"'qkv=4x'"}));
  EXPECT_TRUE(bad("qkv=4.5", {"'qkv=4.5'"}));
  EXPECT_TRUE(bad("qkv=99999999999", {"'qkv=99999999999'"}));
  EXPECT_TRUE(bad("qkv=4,o=2,qkv=5", {"role 'qkv' given twice"}));
}

}  // namespace
}  // namespace lowbit::engine
