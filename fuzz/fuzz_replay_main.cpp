// A driver for the libFuzzer entry points (fuzz/*_fuzz_*.cpp) without
// libFuzzer: it runs LLVMFuzzerTestOneInput on each file given and on
// deterministic mutations of it (truncations, byte flips, 32-bit fields set to
// extreme values, spans deleted or repeated). Built by CMake with
// -DLOWBIT_BUILD_FUZZ=ON and run in CI under AddressSanitizer and UBSan
// (`make test-asan`), so every parser meets malformed input on every change;
// coverage-guided fuzzing is the clang line at the top of each entry point.
//
//   ans_fuzz_seed [--mutations N] [--seed S] FILE...
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<uint8_t> mutate(const std::vector<uint8_t>& input, std::mt19937_64& rng) {
  std::vector<uint8_t> out = input;
  const auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 5) {
      case 0:  // truncate
        out.resize(pick(out.size() + 1));
        break;
      case 1:  // flip bits of a byte
        if (!out.empty()) out[pick(out.size())] ^= static_cast<uint8_t>(1u + rng() % 255u);
        break;
      case 2: {  // a 32-bit field (sizes, counts, offsets) set to an extreme value
        if (out.size() < 4) break;
        static constexpr uint32_t kExtremes[] = {0u, 1u, 0x7fffffffu, 0x80000000u, 0xffffffffu, 0xfffffff0u};
        const uint32_t v = kExtremes[rng() % std::size(kExtremes)];
        std::memcpy(&out[pick(out.size() - 3)], &v, 4);
        break;
      }
      case 3: {  // delete a span
        if (out.empty()) break;
        const size_t at = pick(out.size());
        const size_t n = 1 + pick(std::min<size_t>(64, out.size() - at));
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(at), out.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      default: {  // repeat a span
        if (out.empty() || out.size() > (1u << 20)) break;
        const size_t at = pick(out.size());
        const size_t n = 1 + pick(std::min<size_t>(64, out.size() - at));
        const std::vector<uint8_t> span(out.begin() + static_cast<std::ptrdiff_t>(at),
                                        out.begin() + static_cast<std::ptrdiff_t>(at + n));
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), span.begin(), span.end());
        break;
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 2000;
  unsigned long long seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutations" && i + 1 < argc) {
      mutations = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: %s [--mutations N] [--seed S] FILE...\n", argv[0]);
      return 0;
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "%s: no input files (usage: %s [--mutations N] [--seed S] FILE...)\n", argv[0], argv[0]);
    return 2;
  }
  std::mt19937_64 rng(seed);
  long runs = 0;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], path.c_str());
      return 1;
    }
    const std::vector<uint8_t> input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(input.data(), input.size());
    ++runs;
    for (long m = 0; m < mutations; ++m, ++runs) {
      const std::vector<uint8_t> variant = mutate(input, rng);
      LLVMFuzzerTestOneInput(variant.data(), variant.size());
    }
  }
  std::printf("%s: %ld inputs from %zu files, no crash\n", argv[0], runs, files.size());
  return 0;
}
