// libFuzzer entry point for the seed's uncompressed baseline container
// parser (report appendix A), in both element orders (the first input byte
// picks one; the rest is the file). CI replays it under ASan (make test-asan); as a libFuzzer target, from the
// repository root:
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       fuzz/ans_fuzz_baseline.cpp src/ans/*.cpp src/core/*.cpp -lpthread -o ans_fuzz_baseline
//   mkdir -p corpus-baseline   # seeds: a 0 or 1 byte followed by a small baseline file
//   ./ans_fuzz_baseline -max_len=4096 corpus-baseline
#include <cstddef>
#include <cstdint>

#include "ans_fuzz_common.h"
#include "lowbit/ans/baseline_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit::ans;
  if (size == 0) return 0;
  const BaselineOrder order = (data[0] & 1) ? BaselineOrder::row_major : BaselineOrder::column_major;
  const std::span<const uint8_t> input(data + 1, size - 1);
  try {
    const BaselineFile f = parse_baseline_file(input, order, "fuzz");
    fuzz::exercise(input, AnsFile{f}, /*expect_identical=*/true);
  } catch (const lowbit::Error&) {
  }
  return 0;
}
