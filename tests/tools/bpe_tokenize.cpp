// bpe_tokenize MODEL.gguf|tokenizer.json < lines > lines
// Reads one JSON string per input line, encodes it with lowbit's BpeTokenizer
// (add_special_tokens = false) and writes one JSON line per input:
//   {"ids": [...], "ids_special": [...], "round_trip": true|false}
// ids_special with add_special_tokens = true (BOS when the vocabulary asks
// for it); round_trip says whether decode(ids) gave the input bytes back.
// An input the tokenizer refuses gives {"error": "message"}.
// Driven by tests/python/test_tokenizer_compat.py, which compares the ids with
// the Hugging Face `tokenizers` package on random strings.
// Exit codes: 0 success, 1 any error (message on stderr), 2 usage.
#include <exception>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/gguf/gguf_file.h"
#include "lowbit/tokenizer/bpe_tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: bpe_tokenize MODEL.gguf|tokenizer.json < json-lines\n";
    return 2;
  }
  try {
    const std::string path = argv[1];
    const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
    const auto tok = is_json ? lowbit::tokenizer::BpeTokenizer::from_tokenizer_json(path)
                             : lowbit::tokenizer::BpeTokenizer::from_gguf(lowbit::gguf::GgufFile::open(path));
    std::string line;
    while (std::getline(std::cin, line)) {
      const std::string text = nlohmann::json::parse(line).get<std::string>();
      nlohmann::json out;
      try {
        const auto ids = tok.encode(text);
        out = {{"ids", ids}, {"ids_special", tok.encode(text, true)}, {"round_trip", tok.decode(ids) == text}};
      } catch (const lowbit::Error& e) {
        out = {{"error", e.what()}};
      }
      std::cout << out.dump() << "\n";
    }
  } catch (const lowbit::Error& e) {
    std::cerr << "bpe_tokenize: " << lowbit::error_kind_name(e.kind()) << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "bpe_tokenize: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
