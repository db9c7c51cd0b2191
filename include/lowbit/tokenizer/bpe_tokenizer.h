// Byte-level BPE tokenizer (the GPT-2 scheme used by Llama-3, SmolLM2, Qwen):
//
//  1. Special tokens (added tokens such as "<|im_start|>") are cut out of the
//     text first and become one id each, wherever they appear.
//  2. The rest is split into pieces by the pre-tokenizer regex (Unicode letter
//     and number classes, through PCRE2), e.g. GPT-2's
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     (the pattern is chosen from the vocabulary's pre-tokenizer name).
//  3. Each piece's UTF-8 bytes are mapped to printable code points (GPT-2's
//     byte-to-unicode table: the 188 printable Latin-1 bytes map to
//     themselves, the other 68 to U+0100..U+0143), then merged pairwise,
//     lowest merge rank first, and the resulting symbols looked up in the vocabulary.
// decode() reverses step 3: token strings -> bytes.
//
// Sources: a Hugging Face tokenizer.json (model.type "BPE"; pre-tokenizer
// ByteLevel, Digits(individual) + ByteLevel, or Split(Regex, Isolated) +
// ByteLevel(use_regex=false); normalizer none, or NFC for text that NFC leaves
// unchanged -- other text is refused, lowbit implements no normalization) or
// GGUF metadata (tokenizer.ggml.model "gpt2"; keys tokenizer.ggml.tokens,
// .merges, .token_type, .bos_token_id, .eos_token_id, .padding_token_id,
// .add_bos_token, tokenizer.ggml.pre, tokenizer.chat_template). Details in
// docs/gguf-and-tokenizer.md.
//
// Errors are lowbit::Error: ErrorKind::format for a malformed vocabulary
// (naming the file and the key/entry), ErrorKind::unsupported for a model,
// pre-tokenizer or chat template lowbit does not implement,
// ErrorKind::invalid_argument for an id outside the vocabulary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lowbit::gguf {
class GgufFile;
}

namespace lowbit::tokenizer {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       // special tokens: <|endoftext|>, <|im_start|>, ...
  user_defined = 4,  // added tokens that are matched in text but are not "special"
  unused = 5,
  byte = 6,
};

// Immutable once built: every const method may be called from several threads.
class BpeTokenizer {
 public:
  // From a Hugging Face tokenizer.json. The chat template is read from a
  // tokenizer_config.json beside it when present ("chat_template"), as are
  // bos/eos/pad ("bos_token", ...) and add_bos_token; a TemplateProcessing
  // post-processor that starts with a special token also sets BOS and add_bos.
  static BpeTokenizer from_tokenizer_json(const std::filesystem::path& path);
  // From GGUF metadata (see the top of this file).
  static BpeTokenizer from_gguf(const gguf::GgufFile& file);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // Ids of `text` (any bytes; invalid UTF-8 is tokenized byte by byte).
  // Error(unsupported) only for a tokenizer.json with an NFC normalizer and
  // text that NFC might change (the message names the code point).
  // Special tokens in the text are recognized as single ids. With
  // add_special_tokens, BOS is prepended when the vocabulary asks for it
  // (add_bos_token; false for SmolLM2, as Hugging Face does for it).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // The bytes the ids stand for, concatenated. With skip_special, control
  // tokens are left out. The result may be cut inside a UTF-8 character when
  // the ids end there (decode never replaces bytes, so
  // decode(encode(s)) == s for every byte string s). Error(invalid_argument)
  // for an id outside 0..vocab_size()-1.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  bool add_bos() const;
  // The vocabulary string of a token (byte-level form: a space is "Ġ").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;
  // The bytes one token stands for (for a special token, its text).
  std::string token_bytes(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // True for control tokens (the ones skip_special drops).
  bool is_special(int32_t id) const;
  // True when generation should stop at this id: eos, or <|im_end|> /
  // <|endoftext|> / <|eot_id|> when they exist.
  bool is_end_of_generation(int32_t id) const;

  // The chat template text ("" when the source has none).
  const std::string& chat_template() const;
  // Renders a conversation with the source's chat template. Supported: ChatML
  //   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
  // including the SmolLM2 variant that inserts a default system message when
  // the first message is not a system message (the default text is read from
  // the template). Any other template: Error(unsupported) naming it.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt) const;

  // Streaming decoder for generation: push ids one at a time and get back only
  // text that is complete UTF-8; bytes of a character whose end has not
  // arrived yet are held back. The tokenizer must outlive the decoder.
  class StreamDecoder {
   public:
    explicit StreamDecoder(const BpeTokenizer& tokenizer, bool skip_special = true);
    // The newly completed text (possibly empty).
    std::string push(int32_t id);
    // What is still held back, invalid sequences replaced by U+FFFD; resets.
    std::string finish();

   private:
    const BpeTokenizer* tokenizer_;
    bool skip_special_;
    std::string pending_;
  };

  struct Impl;

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Length of the longest prefix of `bytes` that is complete, valid UTF-8 up to
// a trailing incomplete (but so far valid) sequence; used by StreamDecoder.
// Invalid bytes count as complete (they will never become valid).
size_t complete_utf8_prefix(std::string_view bytes);

}  // namespace lowbit::tokenizer
