// libFuzzer entry point for the GGUF reader (lowbit/gguf/gguf_file.h): any
// bytes either parse into a file whose every tensor can be read and
// dequantized, or throw lowbit::Error. From the repository root:
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       fuzz/gguf_fuzz_file.cpp src/gguf/*.cpp src/formats/*.cpp src/core/*.cpp -lpthread -o gguf_fuzz_file
//   ./gguf_fuzz_file -max_len=65536 corpus-gguf   # seeds: small .gguf files
#include <cstddef>
#include <cstdint>
#include <span>

#include "lowbit/core/error.h"
#include "lowbit/gguf/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const lowbit::gguf::GgufFile f =
        lowbit::gguf::GgufFile::from_bytes(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz");
    for (const auto& t : f.tensors()) {
      // Bound the work: a tiny file may describe a huge tensor of zeros' worth.
      if (t.nbytes <= (uint64_t{1} << 20)) (void)lowbit::gguf::dequantize_to_f32(f, t);
    }
  } catch (const lowbit::Error&) {
  }
  return 0;
}
