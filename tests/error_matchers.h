// EXPECT_TRUE(throws_error([&] { ... }, ErrorKind::invalid_argument, "group_size"))
// checks that the call throws lowbit::Error of that kind whose message
// contains the substring (each substring given, in any order).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "lowbit/core/error.h"

namespace lowbit::test {

template <typename F>
::testing::AssertionResult throws_error(F&& call, ErrorKind kind,
                                        std::initializer_list<std::string_view> needles) {
  try {
    call();
  } catch (const Error& e) {
    const std::string message = e.what();
    if (e.kind() != kind)
      return ::testing::AssertionFailure() << "threw " << error_kind_name(e.kind())
                                           << " instead of " << error_kind_name(kind) << ": "
                                           << message;
    for (std::string_view needle : needles)
      if (message.find(needle) == std::string::npos)
        return ::testing::AssertionFailure()
               << "message lacks \"" << needle << "\": " << message;
    return ::testing::AssertionSuccess() << message;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-lowbit exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

template <typename F>
::testing::AssertionResult throws_error(F&& call, ErrorKind kind, std::string_view needle) {
  return throws_error(std::forward<F>(call), kind, {needle});
}

// expect_error([&] { ... }, ErrorKind::format, {"tensor 'w'", "truncated"}): a
// non-fatal expectation with the same check.
template <typename F>
void expect_error(F&& call, ErrorKind kind, std::initializer_list<std::string_view> needles) {
  EXPECT_TRUE(throws_error(std::forward<F>(call), kind, needles));
}

}  // namespace lowbit::test
