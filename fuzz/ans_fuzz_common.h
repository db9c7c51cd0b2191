// Shared by the ans libFuzzer entry points (fuzz/ans_fuzz_*.cpp): what to do
// with a file that parsed. Built with -DLOWBIT_BUILD_FUZZ=ON (a replay driver); see each entry point's top
// comment for the build line.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <span>
#include <vector>

#include "lowbit/ans/ans_file.h"
#include "lowbit/core/error.h"

namespace lowbit::ans::fuzz {

// Decoding work is rows x cols and a tiny file can describe a huge matrix
// (a one-symbol model costs nothing), so the fuzzer skips decoding beyond this
// to stay fast; parsing is always exercised.
inline constexpr uint64_t kMaxDecodedWeights = uint64_t{1} << 20;

inline uint64_t weights_of(const AnsFile& f) {
  uint64_t n = 0;
  if (const auto* b = std::get_if<BaselineFile>(&f))
    for (const auto& m : b->chain.matrices) n += static_cast<uint64_t>(m.rows * m.cols);
  if (const auto* s = std::get_if<SeedFile>(&f))
    for (const auto& m : s->matrices) n += uint64_t{m.rows} * m.cols;
  if (const auto* l = std::get_if<LowbitFile>(&f))
    for (const auto& m : l->matrices) n += uint64_t{m.rows} * m.cols;
  return n;
}

// A parsed file must serialize back to the exact input (the parsers accept
// only the canonical bytes), and decode / run must either work or throw
// lowbit::Error; anything else aborts and libFuzzer reports it.
inline void exercise(std::span<const uint8_t> input, const AnsFile& f, bool expect_identical) {
  if (expect_identical) {
    const std::vector<uint8_t> back = serialize_ans_file(f, /*drop_scales=*/true);
    if (back.size() != input.size() || !std::equal(back.begin(), back.end(), input.begin())) std::abort();
  }
  if (weights_of(f) > kMaxDecodedWeights) return;
  try {
    (void)decode_ans_file(f, "fuzz");
    (void)run_chain_cpu(f, "fuzz");
    (void)inspect_ans_file(f, "fuzz");
  } catch (const Error&) {
  }
}

}  // namespace lowbit::ans::fuzz
