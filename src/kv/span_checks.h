// Size checks for the flat spans the KV-cache API takes: the message names the
// span, its size and the shape it should have had.
#pragma once

#include <cstddef>
#include <string_view>

#include "lowbit/core/error.h"

namespace lowbit::kv::detail {

// "invalid argument 'q' has 100 values: expected 5120 = [batch 1][num_q_heads 40][head_dim 128]"
inline void check_span_size(std::string_view name, size_t actual, size_t expected, std::string_view shape) {
  if (actual != expected)
    fail(ErrorKind::invalid_argument, "invalid argument '", name, "' has ", actual, " values: expected ",
         expected, " = ", shape);
}

}  // namespace lowbit::kv::detail
