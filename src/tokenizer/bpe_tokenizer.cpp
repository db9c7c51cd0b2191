#include "lowbit/tokenizer/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/gguf/gguf_file.h"

namespace lowbit::tokenizer {

namespace {

// ---- pre-tokenizer patterns ------------------------------------------------------

// GPT-2's split (Hugging Face ByteLevel with use_regex, and llama.cpp "gpt2").
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3 ("llama-bpe") and Qwen2: letters may take one leading non-letter,
// numbers are split in groups of up to three (Qwen2: one).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Isolates every number character (Hugging Face Digits(individual_digits=true),
// used before the GPT-2 split by SmolLM/StarCoder vocabularies).
constexpr const char* kDigitPattern = R"(\p{N})";

// A compiled PCRE2 pattern; split() cuts text into matched pieces and the
// (rare) gaps between them, both kept (Hugging Face's "Isolated" behaviour).
class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    // UTF + UCP: \s, \p{L} etc. by Unicode properties; MATCH_INVALID_UTF:
    // invalid UTF-8 in the text never matches (it ends up in a gap) instead of
    // making pcre2_match fail.
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (code_ == nullptr) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      fail(ErrorKind::format, "pre-tokenizer regex /", pattern, "/ does not compile at offset ",
           offset, ": ", reinterpret_cast<const char*>(msg.data()));
    }
    (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // a speed-up only; the interpreter is the fallback
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  void split(std::string_view text, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    if (md == nullptr) fail(ErrorKind::internal, "pcre2_match_data_create failed (out of memory)");
    PCRE2_SIZE pos = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (pos < text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), pos, 0, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        fail(ErrorKind::internal, "pre-tokenizer regex match failed: ",
             reinterpret_cast<const char*>(msg.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      PCRE2_SIZE begin = ov[0], end = ov[1];
      if (begin > pos) out.push_back(text.substr(pos, begin - pos));
      if (end == begin) {  // an empty match (no pattern here has one): step over one byte
        end = begin + 1;
      }
      out.push_back(text.substr(begin, end - begin));
      pos = end;
    }
    if (pos < text.size()) out.push_back(text.substr(pos));
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
};

// GPT-2's byte <-> code point table: printable Latin-1 bytes stand for
// themselves; the others (controls, space, DEL, 0x80-0xA0, soft hyphen) are
// moved to U+0100.. so that every token is a string of visible characters.
struct ByteTable {
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<uint32_t, uint8_t> codepoint_to_byte;
  ByteTable() {
    std::array<int, 256> cp{};
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? b : 256 + n++;
    for (int b = 0; b < 256; ++b) {
      byte_to_utf8[b] = encode_utf8(static_cast<uint32_t>(cp[b]));
      codepoint_to_byte[static_cast<uint32_t>(cp[b])] = static_cast<uint8_t>(b);
    }
  }
  static std::string encode_utf8(uint32_t c) {
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else if (c < 0x800) {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      s += static_cast<char>(0xE0 | (c >> 12));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (c >> 18));
      s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    return s;
  }
};

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

// Next code point of valid UTF-8 at s[i], or nullopt (advancing one byte).
std::optional<uint32_t> next_codepoint(std::string_view s, size_t& i) {
  const auto c0 = static_cast<unsigned char>(s[i]);
  int len = c0 < 0x80 ? 1 : (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : (c0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + static_cast<size_t>(len) > s.size()) {
    ++i;
    return std::nullopt;
  }
  uint32_t c = len == 1 ? c0 : len == 2 ? (c0 & 0x1Fu) : len == 3 ? (c0 & 0x0Fu) : (c0 & 0x07u);
  for (int k = 1; k < len; ++k) {
    const auto ck = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((ck & 0xC0) != 0x80) {
      ++i;
      return std::nullopt;
    }
    c = (c << 6) | (ck & 0x3Fu);
  }
  i += static_cast<size_t>(len);
  return c;
}

enum class PreTokenizer { gpt2, digits_then_gpt2, custom };

// lowbit implements no Unicode normalization. A tokenizer.json that asks for
// NFC (Qwen2/Qwen3) is still accepted, because NFC leaves most text alone:
// these ranges hold only characters that NFC never changes, that never
// combine with a neighbour and are never reordered (ASCII and Latin-1 up to
// the combining marks, precomposed Latin, Greek and Cyrillic letters, Hebrew
// and Arabic letters, CJK ideographs, kana, Hangul syllables, punctuation,
// symbols, full-width forms, emoji). Text with any other character (a
// combining accent, a compatibility singleton such as U+212B ANGSTROM SIGN,
// Devanagari, Hangul jamo...) is refused with a clear error rather than
// tokenized differently from the reference.
bool nfc_stable(uint32_t c) {
  static constexpr uint32_t kRanges[][2] = {
      {0x0000, 0x02FF}, {0x0388, 0x03FF}, {0x0400, 0x0482}, {0x048A, 0x052F}, {0x05D0, 0x05EA},
      {0x0621, 0x064A}, {0x1E00, 0x1EFF}, {0x2002, 0x206F}, {0x2070, 0x20CF}, {0x2190, 0x22FF},
      {0x2500, 0x27BF}, {0x3000, 0x3029}, {0x3030, 0x303F}, {0x3041, 0x3096}, {0x30A0, 0x30FF},
      {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xFE00, 0xFE0F}, {0xFF00, 0xFFEF}, {0x1F000, 0x1FAFF},
  };
  for (const auto& r : kRanges)
    if (c >= r[0] && c <= r[1]) return true;
  return false;
}

}  // namespace

// ---- Impl ------------------------------------------------------------------------

struct BpeTokenizer::Impl {
  std::string source;  // for messages
  std::vector<std::string> tokens;
  std::vector<TokenType> types;
  std::vector<std::string> bytes;  // what each token decodes to
  std::unordered_map<std::string, int32_t> ids;
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id)
  std::array<int32_t, 256> byte_ids{};
  // Added tokens matched in the text, by first byte, longest first.
  std::array<std::vector<int32_t>, 256> specials_by_first_byte;
  bool has_specials = false;
  std::optional<int32_t> bos, eos, pad;
  bool add_bos = false;
  std::string chat_template;
  std::vector<int32_t> end_ids;
  bool add_prefix_space = false;
  bool nfc = false;  // the tokenizer.json asks for NFC normalization (see nfc_stable)
  // Llama 3: a piece that is itself in the vocabulary becomes that token
  // without merging (Hugging Face "ignore_merges", llama.cpp does the same
  // for its llama3 pre-tokenizer). Merging can end elsewhere for some pieces.
  bool ignore_merges = false;
  std::unique_ptr<Regex> digits;  // when the pre-tokenizer isolates digits first
  std::unique_ptr<Regex> split;

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void check_id(int32_t id) const {
    if (id < 0 || id >= static_cast<int32_t>(tokens.size()))
      fail_argument("token id", id, "0.." + std::to_string(tokens.size() - 1) + " (the vocabulary of " + source + ")");
  }

  // After tokens/types/merge strings are set: the derived tables.
  void finish(const std::vector<std::pair<std::string, std::string>>& merge_pairs) {
    const ByteTable& bt = byte_table();
    ids.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] == TokenType::unused && tokens[i].empty()) continue;  // a hole in a sparse vocabulary
      ids.emplace(tokens[i], static_cast<int32_t>(i));  // the first id wins on duplicates
    }
    bytes.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] == TokenType::control || types[i] == TokenType::user_defined) {
        bytes[i] = tokens[i];  // added tokens are literal text
        continue;
      }
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        const size_t start = p;
        const auto c = next_codepoint(t, p);
        const auto it = c ? bt.codepoint_to_byte.find(*c) : bt.codepoint_to_byte.end();
        if (it != bt.codepoint_to_byte.end()) out += static_cast<char>(it->second);
        else out.append(t, start, p - start);  // not a byte-level character: keep as is
      }
      bytes[i] = std::move(out);
    }
    byte_ids.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const auto it = ids.find(bt.byte_to_utf8[b]);
      if (it != ids.end()) byte_ids[b] = it->second;
    }
    merges.reserve(merge_pairs.size());
    for (size_t r = 0; r < merge_pairs.size(); ++r) {
      const auto& [a, b] = merge_pairs[r];
      const auto ia = ids.find(a), ib = ids.find(b), ic = ids.find(a + b);
      if (ia == ids.end() || ib == ids.end() || ic == ids.end())
        fail(ErrorKind::format, source, ": merge ", r, " '", a, " ", b,
             "' names a token that is not in the vocabulary");
      merges.emplace(key(ia->second, ib->second),
                     Merge{static_cast<int32_t>(r), ic->second});  // first (lowest) rank wins
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if ((types[i] == TokenType::control || types[i] == TokenType::user_defined) && !tokens[i].empty()) {
        specials_by_first_byte[static_cast<unsigned char>(tokens[i][0])].push_back(static_cast<int32_t>(i));
        has_specials = true;
      }
    }
    for (auto& list : specials_by_first_byte)
      std::stable_sort(list.begin(), list.end(), [&](int32_t x, int32_t y) {
        return tokens[static_cast<size_t>(x)].size() > tokens[static_cast<size_t>(y)].size();
      });
    for (const char* name : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"}) {
      const auto it = ids.find(name);
      if (it != ids.end() && types[static_cast<size_t>(it->second)] == TokenType::control)
        end_ids.push_back(it->second);
    }
    if (eos) end_ids.push_back(*eos);
    for (auto* id : {&bos, &eos, &pad})
      if (*id && (**id < 0 || **id >= static_cast<int32_t>(tokens.size())))
        fail(ErrorKind::format, source, ": special token id ", **id, " is outside the vocabulary (",
             tokens.size(), " tokens)");
  }

  void set_pre_tokenizer(PreTokenizer kind, const std::string& pattern) {
    if (kind == PreTokenizer::digits_then_gpt2) digits = std::make_unique<Regex>(kDigitPattern);
    split = std::make_unique<Regex>(kind == PreTokenizer::custom ? pattern : std::string(kGpt2Pattern));
  }

  // Byte-level BPE of one piece: start from one symbol per byte, then apply
  // the lowest-ranked merge among adjacent pairs (leftmost on ties) until none
  // applies. A heap of candidate pairs keeps this O(n log n) even for long
  // runs of spaces; stale entries are recognized by their ids and skipped.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    if (ignore_merges) {
      std::string mapped;
      for (char c : piece) mapped += byte_table().byte_to_utf8[static_cast<unsigned char>(c)];
      const auto it = ids.find(mapped);
      if (it != ids.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Sym {
      int32_t id;
      int32_t prev;
      int32_t next;
    };
    std::vector<Sym> syms;
    syms.reserve(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) {
      const int32_t id = byte_ids[static_cast<unsigned char>(piece[i])];
      if (id < 0)
        fail(ErrorKind::format, source, ": the vocabulary has no token for byte 0x", std::hex,
             int(static_cast<unsigned char>(piece[i])), " (a byte-level BPE vocabulary has all 256)");
      syms.push_back({id, static_cast<int32_t>(i) - 1, static_cast<int32_t>(i) + 1});
    }
    syms.back().next = -1;
    struct Cand {
      int32_t rank;
      int32_t pos;
      int32_t left;
      int32_t right;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
    auto push = [&](int32_t pos) {
      if (pos < 0) return;
      const int32_t nx = syms[static_cast<size_t>(pos)].next;
      if (nx < 0) return;
      const int32_t l = syms[static_cast<size_t>(pos)].id, r = syms[static_cast<size_t>(nx)].id;
      const auto it = merges.find(key(l, r));
      if (it != merges.end()) heap.push({it->second.rank, pos, l, r});
    };
    for (int32_t i = 0; i < static_cast<int32_t>(syms.size()); ++i) push(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      Sym& s = syms[static_cast<size_t>(c.pos)];
      if (s.id != c.left || s.next < 0 || syms[static_cast<size_t>(s.next)].id != c.right) continue;
      Sym& nx = syms[static_cast<size_t>(s.next)];
      s.id = merges.at(key(c.left, c.right)).result;
      nx.id = -1;  // dead
      s.next = nx.next;
      if (s.next >= 0) syms[static_cast<size_t>(s.next)].prev = c.pos;
      push(s.prev);
      push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) out.push_back(syms[static_cast<size_t>(i)].id);
  }

  void check_nfc(std::string_view text) const {
    for (size_t i = 0; i < text.size();) {
      const size_t at = i;
      const auto c = next_codepoint(text, i);
      if (c && !nfc_stable(*c)) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(*c));
        fail(ErrorKind::unsupported, source, " asks for NFC normalization, which lowbit does "
             "not implement, and the text has ", hex, " at byte ", at,
             ", which NFC may change: normalize the text to NFC first or use a GGUF vocabulary");
      }
    }
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out) const {
    if (nfc) check_nfc(text);
    std::vector<std::string_view> coarse, pieces;
    std::string prefixed;
    if (add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    if (digits) {
      digits->split(text, coarse);
    } else {
      coarse.push_back(text);
    }
    for (std::string_view c : coarse) split->split(c, pieces);
    for (std::string_view p : pieces) bpe(p, out);
  }
};

// ---- construction ------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

namespace {

std::pair<std::string, std::string> split_merge(const std::string& m, const std::string& source,
                                                size_t rank) {
  // "left right": the separator is the first space after the first character
  // (byte-level tokens contain no spaces; a space stands as "Ġ").
  const size_t sp = m.find(' ', 1);
  if (sp == std::string::npos || sp + 1 >= m.size())
    fail(ErrorKind::format, source, ": merge ", rank, " '", m,
         "' is not two tokens separated by a space");
  return {m.substr(0, sp), m.substr(sp + 1)};
}

PreTokenizer gguf_pre_tokenizer(const std::string& pre, std::string& pattern, bool& ignore_merges,
                                const std::string& source) {
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2") return PreTokenizer::gpt2;
  // llama.cpp's names: these vocabularies isolate each digit, then split as GPT-2.
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell")
    return PreTokenizer::digits_then_gpt2;
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "smaug-bpe") {
    pattern = kLlama3Pattern;
    ignore_merges = true;
    return PreTokenizer::custom;
  }
  if (pre == "qwen2") {
    pattern = kQwen2Pattern;
    return PreTokenizer::custom;
  }
  fail(ErrorKind::unsupported, source, ": tokenizer.ggml.pre = '", pre,
       "': lowbit knows the pre-tokenizers gpt2/default, smollm/starcoder/refact/codeshell, "
       "llama3/llama-bpe/smaug-bpe and qwen2");
}

}  // namespace

BpeTokenizer BpeTokenizer::from_gguf(const gguf::GgufFile& file) {
  auto impl = std::make_unique<Impl>();
  impl->source = "GGUF file '" + file.path().string() + "'";
  const std::string model = file.get_string_or("tokenizer.ggml.model", "");
  if (model != "gpt2")
    fail(ErrorKind::unsupported, impl->source, ": tokenizer.ggml.model = '", model,
         "': lowbit reads byte-level BPE vocabularies ('gpt2') only");
  impl->tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (impl->tokens.empty() || impl->tokens.size() > (size_t{1} << 31) - 1)
    fail(ErrorKind::format, impl->source, ": tokenizer.ggml.tokens has ", impl->tokens.size(),
         " entries");
  impl->types.assign(impl->tokens.size(), TokenType::normal);
  if (file.has("tokenizer.ggml.token_type")) {
    const auto t = file.get_int_array("tokenizer.ggml.token_type");
    if (t.size() != impl->tokens.size())
      fail(ErrorKind::format, impl->source, ": tokenizer.ggml.token_type has ", t.size(),
           " entries, tokenizer.ggml.tokens ", impl->tokens.size());
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] < 0 || t[i] > 6)
        fail(ErrorKind::format, impl->source, ": tokenizer.ggml.token_type[", i, "] = ", t[i],
             ": expected 0..6");
      impl->types[i] = static_cast<TokenType>(t[i]);
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (file.has("tokenizer.ggml.merges")) {
    const auto m = file.get_string_array("tokenizer.ggml.merges");
    merges.reserve(m.size());
    for (size_t r = 0; r < m.size(); ++r) merges.push_back(split_merge(m[r], impl->source, r));
  }
  auto opt_id = [&](const char* key) -> std::optional<int32_t> {
    if (!file.has(key)) return std::nullopt;
    const int64_t v = file.get_int(key);
    if (v < 0 || v >= static_cast<int64_t>(impl->tokens.size()))
      fail(ErrorKind::format, impl->source, ": ", key, " = ", v, " is outside the vocabulary (",
           impl->tokens.size(), " tokens)");
    return static_cast<int32_t>(v);
  };
  impl->bos = opt_id("tokenizer.ggml.bos_token_id");
  impl->eos = opt_id("tokenizer.ggml.eos_token_id");
  impl->pad = opt_id("tokenizer.ggml.padding_token_id");
  impl->add_bos = file.get_bool_or("tokenizer.ggml.add_bos_token", false);
  impl->chat_template = file.get_string_or("tokenizer.chat_template", "");
  std::string pattern;
  const PreTokenizer kind =
      gguf_pre_tokenizer(file.get_string_or("tokenizer.ggml.pre", ""), pattern, impl->ignore_merges,
                         impl->source);
  impl->set_pre_tokenizer(kind, pattern);
  impl->finish(merges);
  return BpeTokenizer(std::move(impl));
}

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::io, "cannot open '", path.string(), "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::format, "'", path.string(), "' is not valid JSON: ", e.what());
  }
}

// A special-token entry of tokenizer_config.json: "text" or {"content": "text"}.
std::optional<std::string> config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

// The pre-tokenizer of a tokenizer.json: ByteLevel alone, Digits(individual)
// then ByteLevel, or Split(Regex, Isolated) then ByteLevel(use_regex=false).
PreTokenizer json_pre_tokenizer(const nlohmann::json& pt, std::string& pattern, bool& add_prefix_space,
                                const std::string& source) {
  auto unsupported = [&]() {
    fail(ErrorKind::unsupported, source, ": pre_tokenizer ", pt.dump().substr(0, 300),
         " is not one lowbit implements (ByteLevel; Digits(individual_digits) + ByteLevel; "
         "Split(Regex, Isolated) + ByteLevel(use_regex=false))");
  };
  if (!pt.is_object()) unsupported();
  std::vector<nlohmann::json> seq;
  if (pt.value("type", "") == "Sequence" && pt.contains("pretokenizers")) {
    for (const auto& p : pt["pretokenizers"]) seq.push_back(p);
  } else {
    seq.push_back(pt);
  }
  PreTokenizer kind = PreTokenizer::gpt2;
  bool saw_byte_level = false;
  for (size_t i = 0; i < seq.size(); ++i) {
    const auto& p = seq[i];
    const std::string type = p.value("type", "");
    const bool last = i + 1 == seq.size();
    if (type == "ByteLevel" && last) {
      saw_byte_level = true;
      add_prefix_space = p.value("add_prefix_space", false);
      const bool use_regex = p.value("use_regex", true);
      if (kind == PreTokenizer::custom && use_regex) unsupported();
      if (kind != PreTokenizer::custom && !use_regex) unsupported();
    } else if (type == "Digits" && i == 0 && p.value("individual_digits", false)) {
      kind = PreTokenizer::digits_then_gpt2;
    } else if (type == "Split" && i == 0 && p.value("behavior", "") == "Isolated" &&
               !p.value("invert", false) && p.contains("pattern") &&
               p["pattern"].contains("Regex")) {
      kind = PreTokenizer::custom;
      pattern = p["pattern"]["Regex"].get<std::string>();
    } else {
      unsupported();
    }
  }
  if (!saw_byte_level) unsupported();
  return kind;
}

}  // namespace

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->source = "tokenizer file '" + path.string() + "'";
  const nlohmann::json j = read_json(path);
  try {
    const auto& model = j.at("model");
    if (model.value("type", "") != "BPE")
      fail(ErrorKind::unsupported, impl->source, ": model.type = '", model.value("type", ""),
           "': lowbit reads byte-level BPE only");
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      if (j["normalizer"].value("type", "") != "NFC")
        fail(ErrorKind::unsupported, impl->source, ": normalizer ", j["normalizer"].dump().substr(0, 200),
             ": lowbit implements no normalizers (null, or NFC with the limits of nfc_stable)");
      impl->nfc = true;
    }
    int64_t max_id = -1, entries = 0;
    auto check_entry_id = [&](const std::string& tok, int64_t id) {
      if (id < 0) fail(ErrorKind::format, impl->source, ": token '", tok, "' has id ", id);
      max_id = std::max(max_id, id);
      ++entries;
    };
    for (const auto& [tok, id] : model.at("vocab").items()) check_entry_id(tok, id.get<int64_t>());
    if (j.contains("added_tokens"))
      for (const auto& a : j["added_tokens"])
        check_entry_id(a.at("content").get<std::string>(), a.at("id").get<int64_t>());
    // Ids may leave holes, but not absurd ones (that would allocate gigabytes).
    if (max_id < 0 || max_id >= 2 * entries + 1024)
      fail(ErrorKind::format, impl->source, ": vocabulary ids reach ", max_id, " for ", entries,
           " tokens: expected ids below ", 2 * entries + 1024);
    impl->tokens.assign(static_cast<size_t>(max_id + 1), std::string());
    impl->types.assign(static_cast<size_t>(max_id + 1), TokenType::unused);
    for (const auto& [tok, id] : model.at("vocab").items()) {
      const int64_t i = id.get<int64_t>();
      impl->tokens[static_cast<size_t>(i)] = tok;
      impl->types[static_cast<size_t>(i)] = TokenType::normal;
    }
    if (j.contains("added_tokens"))
      for (const auto& a : j["added_tokens"]) {
        const auto i = static_cast<size_t>(a.at("id").get<int64_t>());
        impl->tokens[i] = a.at("content").get<std::string>();
        impl->types[i] = a.value("special", false) ? TokenType::control : TokenType::user_defined;
      }
    impl->ignore_merges = model.value("ignore_merges", false);
    std::vector<std::pair<std::string, std::string>> merges;
    if (model.contains("merges")) {
      size_t r = 0;
      for (const auto& m : model["merges"]) {
        if (m.is_string()) merges.push_back(split_merge(m.get<std::string>(), impl->source, r));
        else merges.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
        ++r;
      }
    }
    std::string pattern;
    const PreTokenizer kind =
        json_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json(),
                           pattern, impl->add_prefix_space, impl->source);
    impl->set_pre_tokenizer(kind, pattern);

    // A post-processor that puts a special token first (Llama 3's
    // TemplateProcessing "single": [{"SpecialToken": {"id": "<|begin_of_text|>"}}, ...])
    // means encode(..., add_special_tokens) starts with BOS.
    std::optional<std::string> template_bos;
    const std::function<void(const nlohmann::json&)> find_template = [&](const nlohmann::json& pp) {
      if (!pp.is_object()) return;
      if (pp.value("type", "") == "TemplateProcessing" && pp.contains("single") && pp["single"].is_array() &&
          !pp["single"].empty() && pp["single"][0].contains("SpecialToken"))
        template_bos = pp["single"][0]["SpecialToken"].at("id").get<std::string>();
      if (pp.contains("processors") && pp["processors"].is_array())
        for (const auto& sub : pp["processors"]) find_template(sub);
    };
    if (j.contains("post_processor")) find_template(j["post_processor"]);
    if (template_bos) {
      for (size_t i = 0; i < impl->tokens.size(); ++i)
        if (impl->tokens[i] == *template_bos) impl->bos = static_cast<int32_t>(i);
      impl->add_bos = impl->bos.has_value();
    }

    // tokenizer_config.json beside it: special tokens, add_bos_token, chat template.
    const auto cfg_path = path.parent_path() / "tokenizer_config.json";
    std::error_code ec;
    if (std::filesystem::exists(cfg_path, ec)) {
      const nlohmann::json cfg = read_json(cfg_path);
      auto lookup = [&](const char* key) -> std::optional<int32_t> {
        const auto t = config_token(cfg, key);
        if (!t) return std::nullopt;
        for (size_t i = 0; i < impl->tokens.size(); ++i)
          if (impl->tokens[i] == *t) return static_cast<int32_t>(i);
        fail(ErrorKind::format, "'", cfg_path.string(), "': ", key, " '", *t,
             "' is not in the vocabulary");
      };
      if (const auto b = lookup("bos_token")) impl->bos = b;
      impl->eos = lookup("eos_token");
      impl->pad = lookup("pad_token");
      if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
        impl->add_bos = cfg["add_bos_token"].get<bool>();
      if (cfg.contains("chat_template") && cfg["chat_template"].is_string())
        impl->chat_template = cfg["chat_template"].get<std::string>();
    }
    impl->finish(merges);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::format, impl->source, ": unexpected structure: ", e.what());
  }
  return BpeTokenizer(std::move(impl));
}

// ---- encode / decode ----------------------------------------------------------------

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special_tokens && m.add_bos && m.bos) out.push_back(*m.bos);
  // Cut the text at added tokens (leftmost, then longest match), and run the
  // pre-tokenizer and BPE on the text between them.
  size_t start = 0;
  if (m.has_specials) {
    for (size_t i = 0; i < text.size();) {
      const auto& cands = m.specials_by_first_byte[static_cast<unsigned char>(text[i])];
      int32_t hit = -1;
      for (int32_t id : cands) {
        const std::string& t = m.tokens[static_cast<size_t>(id)];
        if (text.compare(i, t.size(), t) == 0) {
          hit = id;
          break;  // sorted longest first
        }
      }
      if (hit < 0) {
        ++i;
        continue;
      }
      if (i > start) m.encode_text(text.substr(start, i - start), out);
      out.push_back(hit);
      i += m.tokens[static_cast<size_t>(hit)].size();
      start = i;
    }
  }
  if (start < text.size()) m.encode_text(text.substr(start), out);
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    impl_->check_id(id);
    if (skip_special && impl_->types[static_cast<size_t>(id)] == TokenType::control) continue;
    out += impl_->bytes[static_cast<size_t>(id)];
  }
  return out;
}

int32_t BpeTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }
std::optional<int32_t> BpeTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> BpeTokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> BpeTokenizer::pad_id() const { return impl_->pad; }
bool BpeTokenizer::add_bos() const { return impl_->add_bos; }

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->ids.find(std::string(token));
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeTokenizer::id_to_token(int32_t id) const {
  impl_->check_id(id);
  return impl_->tokens[static_cast<size_t>(id)];
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  impl_->check_id(id);
  return impl_->bytes[static_cast<size_t>(id)];
}

TokenType BpeTokenizer::token_type(int32_t id) const {
  impl_->check_id(id);
  return impl_->types[static_cast<size_t>(id)];
}

bool BpeTokenizer::is_special(int32_t id) const { return token_type(id) == TokenType::control; }

bool BpeTokenizer::is_end_of_generation(int32_t id) const {
  const auto& e = impl_->end_ids;
  return std::find(e.begin(), e.end(), id) != e.end();
}

const std::string& BpeTokenizer::chat_template() const { return impl_->chat_template; }

// ---- chat template ---------------------------------------------------------------------

namespace {

// The ChatML loop body and generation prompt as Hugging Face writes them.
constexpr std::string_view kChatMlLoop =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
// SmolLM2's variant: a default system message when the first one is not a system message.
constexpr std::string_view kSmolPrefix =
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n";
constexpr std::string_view kSmolMiddle =
    "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string BpeTokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) const {
  const std::string_view t = trim(impl_->chat_template);
  std::optional<std::string> default_system;
  bool known = t == kChatMlLoop;
  if (!known && t.size() > kSmolPrefix.size() + kSmolMiddle.size() && t.starts_with(kSmolPrefix) &&
      t.ends_with(kSmolMiddle)) {
    const std::string_view text =
        t.substr(kSmolPrefix.size(), t.size() - kSmolPrefix.size() - kSmolMiddle.size());
    // A quote or Jinja syntax inside would mean a different template.
    if (text.find('\'') == std::string_view::npos && text.find("{") == std::string_view::npos) {
      known = true;
      default_system = std::string(text);
    }
  }
  if (!known) {
    if (t.empty())
      fail(ErrorKind::unsupported, impl_->source, " has no chat template (tokenizer.chat_template)");
    fail(ErrorKind::unsupported, impl_->source, ": chat template not supported (lowbit renders "
         "ChatML and SmolLM2's ChatML variant only): \"", std::string(t.substr(0, 120)),
         t.size() > 120 ? "...\"" : "\"");
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && default_system && messages[0].role != "system")
      out += "<|im_start|>system\n" + *default_system + "<|im_end|>\n";
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// ---- streaming ----------------------------------------------------------------------------

size_t complete_utf8_prefix(std::string_view bytes) {
  // Look back at most 3 bytes for the start of a multi-byte sequence that
  // has not ended yet.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead byte
    const size_t need = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return need > back ? n - back : n;  // lead byte whose sequence is still incomplete: hold it
  }
  return n;
}

BpeTokenizer::StreamDecoder::StreamDecoder(const BpeTokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string BpeTokenizer::StreamDecoder::push(int32_t id) {
  const int32_t one[1] = {id};
  pending_ += tokenizer_->decode(one, skip_special_);
  const size_t done = complete_utf8_prefix(pending_);
  std::string out = pending_.substr(0, done);
  pending_.erase(0, done);
  return out;
}

std::string BpeTokenizer::StreamDecoder::finish() {
  // Whatever is left is an incomplete sequence: one U+FFFD for it.
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  return out;
}

}  // namespace lowbit::tokenizer
