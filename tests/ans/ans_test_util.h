// Helpers shared by the ans test suites: random int8 matrices with chosen
// distributions, the conformance data folder, files and the CLI.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "lowbit/ans/chain.h"

namespace lowbit::test::ans {

namespace fs = std::filesystem;

// The seed authors' conformance files (read only; tests skip without them):
// $LOWBIT_TESTDATA_DIR/matvans, else ../shared/testdata/matvans beside the
// source tree.
inline fs::path conformance_dir() {
  if (const char* dir = std::getenv("LOWBIT_TESTDATA_DIR"); dir != nullptr && *dir != '\0')
    return fs::path(dir) / "matvans";
  return fs::path(LOWBIT_SOURCE_DIR) / ".." / "shared" / "testdata" / "matvans";
}
inline bool have_conformance() {
  return fs::exists(conformance_dir() / "compressed_matrices_512.bin") &&
         fs::exists(conformance_dir() / "raw-matrices_512.bin");
}
#define LOWBIT_REQUIRE_CONFORMANCE()                                                                       \
  do {                                                                                                     \
    if (!::lowbit::test::ans::have_conformance())                                                          \
      GTEST_SKIP() << "conformance data not found in " << ::lowbit::test::ans::conformance_dir()          \
                   << " (the MATVANS files written by the seed authors' tools)";                          \
  } while (0)

inline std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

enum class Dist { uniform_all, uniform_127, peaked, single, two_values, gaussian, sparse_grid };

inline const char* dist_name(Dist d) {
  switch (d) {
    case Dist::uniform_all: return "uniform_all_256";
    case Dist::uniform_127: return "uniform_-127..127";
    case Dist::peaked: return "peaked";
    case Dist::single: return "single_symbol";
    case Dist::two_values: return "two_values";
    case Dist::gaussian: return "gaussian";
    case Dist::sparse_grid: return "sparse_grid";
  }
  return "?";
}

// A rows x cols matrix of codes drawn from `d`.
inline ::lowbit::ans::Int8Matrix random_matrix(int64_t rows, int64_t cols, Dist d, uint32_t seed) {
  ::lowbit::ans::Int8Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(static_cast<size_t>(rows * cols));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> all(-128, 127), sym(-127, 127);
  std::geometric_distribution<int> geo(0.6);
  std::normal_distribution<double> normal(0.0, 20.0);
  std::bernoulli_distribution coin(0.5);
  const int single_value = static_cast<int>(seed % 255) - 127;
  for (auto& v : m.data) {
    int x = 0;
    switch (d) {
      case Dist::uniform_all: x = all(rng); break;
      case Dist::uniform_127: x = sym(rng); break;
      case Dist::peaked: x = (coin(rng) ? 1 : -1) * std::min(geo(rng), 127); break;  // most mass at 0
      case Dist::single: x = single_value; break;
      case Dist::two_values: x = coin(rng) ? -3 : 100; break;
      case Dist::gaussian: x = static_cast<int>(std::clamp(std::nearbyint(normal(rng)), -127.0, 127.0)); break;
      case Dist::sparse_grid: x = 2 * (std::uniform_int_distribution<int>(-20, 20)(rng)); break;  // every other code
    }
    v = static_cast<int8_t>(x);
  }
  return m;
}

// A chain of square-ish matrices with the given row counts (cols follow the chain).
inline ::lowbit::ans::Chain random_chain(const std::vector<int64_t>& dims, Dist d, uint32_t seed) {
  ::lowbit::ans::Chain c;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> v(-127, 127);
  c.v0.resize(static_cast<size_t>(dims.front()));
  for (auto& x : c.v0) x = static_cast<int8_t>(v(rng));
  for (size_t k = 1; k < dims.size(); ++k)
    c.matrices.push_back(random_matrix(dims[k], dims[k - 1], d, seed + static_cast<uint32_t>(k)));
  return c;
}

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("lowbit-ans-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

using ::lowbit::test::CliResult;

inline bool have_cli() { return fs::exists(LOWBIT_CLI_PATH); }
#define LOWBIT_REQUIRE_CLI()                                                                         \
  do {                                                                                               \
    if (!::lowbit::test::ans::have_cli())                                                            \
      GTEST_SKIP() << "the lowbit command was not built (" << LOWBIT_CLI_PATH                        \
                   << "): build the lowbit_cli target too";                                          \
  } while (0)

inline CliResult run_cli(const std::string& args) { return run_lowbit(args); }

}  // namespace lowbit::test::ans
