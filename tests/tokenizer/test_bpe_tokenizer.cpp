#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "error_matchers.h"
#include "gguf/gguf_builder.h"
#include "lowbit/gguf/gguf_file.h"
#include "lowbit/tokenizer/bpe_tokenizer.h"

namespace lowbit::tokenizer {
namespace {

using gguf::GgufFile;
using gguf::test::GgufBuilder;
using lowbit::test::expect_error;

// ---- a tiny synthetic vocabulary (no model file needed) ---------------------------

// GPT-2's byte -> code point table, written out independently of the library.
std::string byte_char(int b) {
  const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!direct) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      const bool d = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
      if (!d) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Vocabulary: <s>, </s> (control), the 256 byte tokens, then merged tokens.
GgufBuilder tiny_vocab(const std::vector<std::string>& merges, std::string pre = "gpt2",
                       std::string chat_template = "") {
  std::vector<std::string> tokens = {"<s>", "</s>"};
  std::vector<int32_t> types = {3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_char(b));
    types.push_back(1);
  }
  for (const auto& m : merges) {
    const size_t sp = m.find(' ');
    tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    types.push_back(1);
  }
  GgufBuilder g;
  g.kv_string("tokenizer.ggml.model", "gpt2");
  g.kv_string("tokenizer.ggml.pre", pre);
  g.kv_strings("tokenizer.ggml.tokens", tokens);
  g.kv_i32s("tokenizer.ggml.token_type", types);
  g.kv_strings("tokenizer.ggml.merges", merges);
  g.kv_u32("tokenizer.ggml.bos_token_id", 0);
  g.kv_u32("tokenizer.ggml.eos_token_id", 1);
  g.kv_bool("tokenizer.ggml.add_bos_token", true);
  if (!chat_template.empty()) g.kv_string("tokenizer.chat_template", chat_template);
  return g;
}

BpeTokenizer from(const GgufBuilder& g) {
  const GgufFile f = GgufFile::from_bytes(g.build(), "tiny.gguf");
  return BpeTokenizer::from_gguf(f);
}

std::vector<std::string> pieces(const BpeTokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(t.id_to_token(id));
  return out;
}

TEST(BpeTiny, MergesApplyByRankLeftmostFirst) {
  // Ranks: "a a" first, so "aaa" -> "aa" + "a" (leftmost pair first), and
  // "b c" before "a b": "abc" -> "a" + "bc", not "ab" + "c".
  const BpeTokenizer t = from(tiny_vocab({"a a", "b c", "a b", "aa a"}));
  EXPECT_EQ(pieces(t, t.encode("aa")), (std::vector<std::string>{"aa"}));
  EXPECT_EQ(pieces(t, t.encode("aaa")), (std::vector<std::string>{"aaa"}));  // aa + a, then merge 3
  EXPECT_EQ(pieces(t, t.encode("aaaa")), (std::vector<std::string>{"aa", "aa"}));  // rank 0 before 3
  EXPECT_EQ(pieces(t, t.encode("abc")), (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(pieces(t, t.encode("ab")), (std::vector<std::string>{"ab"}));
  // A space is the byte-level character U+0120 and starts a new piece before letters.
  EXPECT_EQ(pieces(t, t.encode("ab ab")), (std::vector<std::string>{"ab", "\xC4\xA0", "ab"}));
}

// "abc" is in the vocabulary, but merging stops at "ab" + "c" ("a bc" never
// fires because "a b" outranks "b c"). Llama 3 vocabularies ignore merges for
// a piece that is a token; GPT-2 style ones do not.
TEST(BpeTiny, IgnoreMergesForLlama3) {
  const std::vector<std::string> merges = {"a b", "b c", "a bc"};
  const BpeTokenizer gpt2 = from(tiny_vocab(merges, "gpt2"));
  const BpeTokenizer llama3 = from(tiny_vocab(merges, "llama-bpe"));
  EXPECT_EQ(pieces(gpt2, gpt2.encode("abc")), (std::vector<std::string>{"ab", "c"}));
  EXPECT_EQ(pieces(llama3, llama3.encode("abc")), (std::vector<std::string>{"abc"}));
  EXPECT_EQ(pieces(llama3, llama3.encode("abcb")), (std::vector<std::string>{"ab", "c", "b"}));
}

TEST(BpeTiny, SpecialTokensBosAndDecode) {
  const BpeTokenizer t = from(tiny_vocab({"a b"}));
  EXPECT_EQ(t.vocab_size(), 2 + 256 + 1);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_TRUE(t.add_bos());
  const auto ids = t.encode("<s>ab</s>", true);
  EXPECT_EQ(pieces(t, ids), (std::vector<std::string>{"<s>", "<s>", "ab", "</s>"}));
  EXPECT_EQ(t.decode(ids), "<s><s>ab</s>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "ab");
  EXPECT_TRUE(t.is_special(1));
  EXPECT_TRUE(t.is_end_of_generation(1));
  EXPECT_FALSE(t.is_end_of_generation(2));
  EXPECT_EQ(t.token_to_id("ab"), 2 + 256);
  EXPECT_FALSE(t.token_to_id("zz").has_value());
  EXPECT_EQ(t.token_bytes(2 + ' '), " ");
  const std::vector<int32_t> bad = {5, 100000};
  expect_error([&] { (void)t.decode(bad); }, ErrorKind::invalid_argument, {"token id", "100000"});
  expect_error([&] { (void)t.id_to_token(-1); }, ErrorKind::invalid_argument, {"token id"});
}

TEST(BpeTiny, EveryByteStringRoundTrips) {
  const BpeTokenizer t = from(tiny_vocab({"a b", "\xC4\xA0 a"}, "smollm"));
  std::mt19937 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(static_cast<size_t>(rng() % 40), '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);  // mostly invalid UTF-8
    ASSERT_EQ(t.decode(t.encode(s)), s) << "iteration " << iter;
  }
}

TEST(BpeTiny, BadVocabulariesAreClearErrors) {
  // Replace the (empty) merges entry with one naming an unknown token.
  GgufBuilder h = tiny_vocab({});
  h.kvs.erase(h.kvs.begin() + 4);
  h.kv_strings("tokenizer.ggml.merges", {"a zz"});
  expect_error([&] { (void)from(h); }, ErrorKind::format, {"merge 0", "'a zz'", "not in the vocabulary"});
  GgufBuilder m = tiny_vocab({});
  m.kvs.erase(m.kvs.begin());
  m.kv_string("tokenizer.ggml.model", "llama");
  expect_error([&] { (void)from(m); }, ErrorKind::unsupported, {"tokenizer.ggml.model = 'llama'"});
  expect_error([&] { (void)from(tiny_vocab({}, "falcon")); }, ErrorKind::unsupported,
               {"tokenizer.ggml.pre = 'falcon'"});
}

TEST(BpeTokenizerJson, MalformedFilesAreClearErrors) {
  const auto dir = std::filesystem::temp_directory_path() / ("lowbit_tokjson_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "tokenizer.json";
  auto load = [&](const std::string& text) {
    std::ofstream(path) << text;
    return BpeTokenizer::from_tokenizer_json(path);
  };
  const std::string byte_level = R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false})";
  expect_error([&] { (void)load("{not json"); }, ErrorKind::format, {"not valid JSON"});
  expect_error([&] { (void)load("{}"); }, ErrorKind::format, {"unexpected structure"});
  expect_error([&] { (void)load(R"({"model": {"type": "WordPiece", "vocab": {}}})"); }, ErrorKind::unsupported,
               {"model.type = 'WordPiece'"});
  expect_error([&] { (void)load(R"({"model": {"type": "BPE", "vocab": {"a": -3}}, )" + byte_level + "}"); },
               ErrorKind::format, {"token 'a' has id -3"});
  expect_error([&] { (void)load(R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}}, )" + byte_level + "}"); },
               ErrorKind::format, {"ids reach 2000000000"});
  expect_error([&] { (void)load(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a c"]}, )" +
                                byte_level + "}"); },
               ErrorKind::format, {"merge 0", "not in the vocabulary"});
  expect_error([&] { (void)load(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Whitespace"}})"); },
               ErrorKind::unsupported, {"pre_tokenizer"});
  expect_error([&] { (void)load(R"({"normalizer": {"type": "NFKC"}, "model": {"type": "BPE", "vocab": {"a": 0}}, )" +
                                byte_level + "}"); },
               ErrorKind::unsupported, {"normalizer"});
  expect_error([] { (void)BpeTokenizer::from_tokenizer_json("/nonexistent/tokenizer.json"); }, ErrorKind::io,
               {"cannot open"});
  std::filesystem::remove_all(dir);
}

TEST(BpeTiny, ChatTemplates) {
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  const BpeTokenizer t = from(tiny_vocab({}, "gpt2", smol));
  EXPECT_EQ(t.apply_chat_template({{"user", "Hi"}}, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(t.apply_chat_template({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n");
  const std::string plain =
      "{% for message in messages %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  EXPECT_EQ(from(tiny_vocab({}, "gpt2", plain)).apply_chat_template({{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  expect_error([&] { (void)from(tiny_vocab({}, "gpt2", "{{ bos_token }}[INST]")).apply_chat_template({}, true); },
               ErrorKind::unsupported, {"chat template not supported", "[INST]"});
  expect_error([&] { (void)from(tiny_vocab({})).apply_chat_template({}, true); }, ErrorKind::unsupported,
               {"no chat template"});
}

TEST(Utf8, CompletePrefix) {
  EXPECT_EQ(complete_utf8_prefix(""), 0u);
  EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
  EXPECT_EQ(complete_utf8_prefix("a\xC3"), 1u);             // lead of a 2-byte char
  EXPECT_EQ(complete_utf8_prefix("a\xC3\xA9"), 3u);         // é complete
  EXPECT_EQ(complete_utf8_prefix("\xF0\x9F\x98"), 0u);      // 3 of 4 bytes of an emoji
  EXPECT_EQ(complete_utf8_prefix("\xF0\x9F\x98\x80"), 4u);
  EXPECT_EQ(complete_utf8_prefix("x\x80"), 2u);             // a stray continuation byte never completes
}

// ---- the default model: exact ids against Hugging Face tokenizers -------------------

struct Golden {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Golden> load_golden() {
  std::ifstream in(std::string(LOWBIT_SOURCE_DIR) + "/tests/tokenizer/golden_smollm2.json");
  EXPECT_TRUE(in.good()) << "tests/tokenizer/golden_smollm2.json is missing";
  const auto j = nlohmann::json::parse(in);
  std::vector<Golden> out;
  for (const auto& c : j.at("cases")) out.push_back({c.at("text").get<std::string>(), c.at("ids").get<std::vector<int32_t>>()});
  return out;
}

TEST(BpeDefaultModel, IdsEqualHuggingFaceTokenizers) {
  LOWBIT_DEFAULT_MODEL_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  const BpeTokenizer t = BpeTokenizer::from_gguf(f);
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pad_id(), 2);
  EXPECT_FALSE(t.add_bos());
  const auto golden = load_golden();
  ASSERT_GE(golden.size(), 30u);
  for (const auto& g : golden) {
    EXPECT_EQ(t.encode(g.text), g.ids) << "text: \"" << g.text << "\"";
    EXPECT_EQ(t.decode(g.ids), g.text);
  }
}

TEST(BpeDefaultModel, ChatTemplateStreamingAndEndTokens) {
  LOWBIT_DEFAULT_MODEL_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  const BpeTokenizer t = BpeTokenizer::from_gguf(f);
  const std::string prompt = t.apply_chat_template({{"user", "What is the capital of France?"}}, true);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  const auto ids = t.encode(prompt);
  EXPECT_EQ(ids.front(), 1);  // <|im_start|> as one id
  EXPECT_EQ(t.id_to_token(ids.front()), "<|im_start|>");
  EXPECT_TRUE(t.is_end_of_generation(2));  // <|im_end|>
  EXPECT_TRUE(t.is_end_of_generation(0));  // <|endoftext|>

  // Streaming: each chunk is complete UTF-8 and together they are the text.
  const std::string text = "Emoji 😀👍🏽 and 日本語 and café.";
  BpeTokenizer::StreamDecoder stream(t);
  std::string joined;
  int held_back = 0;
  for (int32_t id : t.encode(text)) {
    const std::string chunk = stream.push(id);
    EXPECT_EQ(complete_utf8_prefix(chunk), chunk.size());
    const std::string whole = t.token_bytes(id);
    held_back += chunk.empty() && !whole.empty();
    joined += chunk;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, text);
  EXPECT_GT(held_back, 0);  // some emoji bytes are split across tokens in this vocabulary
  // A stream cut inside a character ends with U+FFFD.
  BpeTokenizer::StreamDecoder cut(t);
  const auto emoji = t.encode("😀");
  ASSERT_GT(emoji.size(), 1u);
  EXPECT_EQ(cut.push(emoji[0]), "");
  EXPECT_EQ(cut.finish(), "\xEF\xBF\xBD");
}

TEST(BpeDefaultModel, TokenizerJsonGivesTheSameIds) {
  LOWBIT_DEFAULT_MODEL_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  const BpeTokenizer from_gguf = BpeTokenizer::from_gguf(f);
  // Write SmolLM2's tokenizer.json / tokenizer_config.json structure from the
  // GGUF vocabulary and read it back through the other loader.
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  const auto types = f.get_int_array("tokenizer.ggml.token_type");
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = i;
    if (types[i] == 3) added.push_back({{"id", i}, {"content", tokens[i]}, {"special", true}});
  }
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", f.get_string_array("tokenizer.ggml.merges")}}},
  };
  const auto dir = std::filesystem::temp_directory_path() / ("lowbit_tok_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  std::ofstream(dir / "tokenizer_config.json")
      << nlohmann::json({{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"},
                         {"pad_token", "<|im_end|>"}, {"add_bos_token", false},
                         {"chat_template", f.get_string("tokenizer.chat_template")}})
             .dump();
  const BpeTokenizer from_json = BpeTokenizer::from_tokenizer_json(dir / "tokenizer.json");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(from_json.vocab_size(), from_gguf.vocab_size());
  EXPECT_EQ(from_json.bos_id(), 1);
  EXPECT_EQ(from_json.eos_id(), 2);
  for (const auto& g : load_golden()) EXPECT_EQ(from_json.encode(g.text), g.ids) << g.text;
  EXPECT_EQ(from_json.apply_chat_template({{"user", "x"}}, false),
            from_gguf.apply_chat_template({{"user", "x"}}, false));
}

// Not a benchmark: a guard that encoding stays far from mattering (the
// target is a 1000-token prompt in a few ms; the bound is loose for slow CI).
TEST(BpeDefaultModel, EncodingIsFast) {
  LOWBIT_DEFAULT_MODEL_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  const BpeTokenizer t = BpeTokenizer::from_gguf(f);
  std::string text;
  for (const auto& g : load_golden()) text += g.text + "\n";
  while (text.size() < 6000) text += text;
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = t.encode(text);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), 1000u);
  EXPECT_LT(ms, 500.0) << ids.size() << " tokens took " << ms << " ms";
  std::cout << "[ info ] encoded " << ids.size() << " tokens (" << text.size() << " bytes) in " << ms << " ms\n";
}

}  // namespace
}  // namespace lowbit::tokenizer
