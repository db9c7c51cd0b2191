// One error type for the whole library. Every message names the offending
// argument (or file, or tensor), the value it had, and what was expected, so a
// user can fix the input without reading our source.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lowbit {

enum class ErrorKind {
  invalid_argument,  // a caller passed a value outside the documented domain
  format,            // a file or tensor does not follow its format (malformed input)
  io,                // the operating system refused (open, read, write, mmap)
  unsupported,       // valid input that this build or device cannot handle
  cuda,              // a CUDA runtime or library call failed
  internal,          // a broken invariant inside lowbit: a bug, please report it
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// Throws Error(kind, concat(parts...)).
template <typename... Parts>
[[noreturn]] void fail(ErrorKind kind, const Parts&... parts) {
  throw Error(kind, detail::concat(parts...));
}

// "invalid argument 'group_size' = 48: expected -1 or a divisor of K = 4096".
template <typename Value>
[[noreturn]] void fail_argument(std::string_view name, const Value& value,
                                std::string_view expected) {
  fail(ErrorKind::invalid_argument, "invalid argument '", name, "' = ", value,
       ": expected ", expected);
}

// Checks a precondition on a named argument; the message is built only on failure.
#define LOWBIT_CHECK_ARG(cond, name, value, expected)      \
  do {                                                      \
    if (!(cond)) ::lowbit::fail_argument(name, value, expected); \
  } while (0)

// Checks a precondition; on failure throws Error(invalid_argument) whose
// message is the parts, concatenated (built only on failure).
#define LOWBIT_REQUIRE(cond, ...)                                                  \
  do {                                                                             \
    if (!(cond)) ::lowbit::fail(::lowbit::ErrorKind::invalid_argument, __VA_ARGS__); \
  } while (0)

}  // namespace lowbit
