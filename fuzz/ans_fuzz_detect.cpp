// libFuzzer entry point for container detection (lowbit/ans/ans_file.h
// parse_ans_file): whatever the bytes, the reader either recognizes one
// container or throws lowbit::Error. CI replays it under ASan (make test-asan); as a libFuzzer target, from the
// repository root:
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       fuzz/ans_fuzz_detect.cpp src/ans/*.cpp src/core/*.cpp -lpthread -o ans_fuzz_detect
//   ./ans_fuzz_detect -max_len=4096 corpus-any   # seeds: small files of every container
#include <cstddef>
#include <cstdint>

#include "ans_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit::ans;
  const std::span<const uint8_t> input(data, size);
  try {
    const AnsFile f = parse_ans_file(input, "fuzz");
    fuzz::exercise(input, f, /*expect_identical=*/true);
  } catch (const lowbit::Error&) {
  }
  return 0;
}
