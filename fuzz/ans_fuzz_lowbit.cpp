// libFuzzer entry point for lowbit's interleaved container parser and its
// decoder. The first input byte picks whether checksums are verified: with
// them off the fuzzer reaches every field check and the payload decoder
// (it cannot forge CRC-32s); with them on, an accepted file must serialize
// back to the exact input. CI replays it under ASan (make test-asan); as a libFuzzer target, from the repository root:
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       fuzz/ans_fuzz_lowbit.cpp src/ans/*.cpp src/core/*.cpp -lpthread -o ans_fuzz_lowbit
//   mkdir -p corpus-lowbit   # seeds: a 0 or 1 byte followed by a small lowbit file, e.g. from
//                            # lowbit ans make-synthetic --layers 2 --dim 24 --rows-per-tile 4 --out x
//   ./ans_fuzz_lowbit -max_len=8192 corpus-lowbit
#include <cstddef>
#include <cstdint>

#include "ans_fuzz_common.h"
#include "lowbit/ans/lowbit_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit::ans;
  if (size == 0) return 0;
  LowbitReadOptions options;
  options.verify_checksums = (data[0] & 1) != 0;
  const std::span<const uint8_t> input(data + 1, size - 1);
  try {
    const LowbitFile f = parse_lowbit_file(input, "fuzz", options);
    fuzz::exercise(input, AnsFile{f}, /*expect_identical=*/options.verify_checksums);
  } catch (const lowbit::Error&) {
  }
  return 0;
}
