// libFuzzer entry point for the seed (MATVANS, report Table 1) container
// parser, both layouts (with and without result_hash, detected) and its
// decoder. CI replays it under ASan (make test-asan); as a libFuzzer target, from the repository root:
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       fuzz/ans_fuzz_seed.cpp src/ans/*.cpp src/core/*.cpp -lpthread -o ans_fuzz_seed
//   mkdir -p corpus-seed && cp ../shared/testdata/matvans/compressed_matrices_512.bin corpus-seed/
//   ./ans_fuzz_seed -max_len=4096 corpus-seed
//
// (Small seeds work better than the 800 KB conformance file: `lowbit ans
// make-synthetic --layers 2 --dim 16 --format seed --out corpus-seed/a.bin`.)
#include <cstddef>
#include <cstdint>

#include "ans_fuzz_common.h"
#include "lowbit/ans/seed_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit::ans;
  const std::span<const uint8_t> input(data, size);
  try {
    const SeedFile f = parse_seed_file(input, "fuzz", SeedVariant::detect);
    fuzz::exercise(input, AnsFile{f}, /*expect_identical=*/true);
  } catch (const lowbit::Error&) {
  }
  return 0;
}
