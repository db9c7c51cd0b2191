// Runs the built `lowbit` command (LOWBIT_CLI_PATH, set by CMake) the way a
// user does, for the CLI tests of every module.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace lowbit::test {

struct CliResult {
  int exit_code;       // -1 when the command could not be run or was killed
  std::string output;  // stdout and stderr together
};

// `args` is appended to the command line as is (quote paths with spaces).
inline CliResult run_lowbit(const std::string& args) {
  const std::string command = std::string(LOWBIT_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace lowbit::test
