#include "lowbit/core/error.h"

namespace lowbit {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_argument: return "invalid argument";
    case ErrorKind::format: return "format error";
    case ErrorKind::io: return "I/O error";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::cuda: return "CUDA error";
    case ErrorKind::internal: return "internal error";
  }
  return "error";
}

}  // namespace lowbit
