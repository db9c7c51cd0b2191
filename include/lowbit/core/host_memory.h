// How much host memory a large allocation may take, checked before it is made.
//
// Why: Linux lends memory it does not have (overcommit), so a request larger
// than the machine (a paged KV cache for millions of tokens, a synthetic
// chain of thousands of 32k x 32k matrices) does not fail where it is made:
// the process runs on, touching pages, until the kernel's OOM killer ends it
// with SIGKILL and no message, often after minutes of work. Checking the
// size against what the kernel reports as available turns that into an
// error that says what was asked for and what there is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lowbit {

// MemAvailable + SwapFree from /proc/meminfo, in bytes: what the kernel can
// hand out without killing anyone. nullopt where that file is not there or
// lacks the fields (not Linux).
std::optional<int64_t> host_memory_available();

// Throws Error(unsupported) when `bytes` exceed host_memory_available():
// "<what> needs 21.3 TiB of host memory; this machine has 22.1 GiB available
// (MemAvailable + SwapFree in /proc/meminfo)". Does nothing where the
// available memory is unknown.
void require_host_memory(int64_t bytes, std::string_view what);

// "512 B", "1.5 KiB", ..., "21.3 TiB".
std::string format_bytes(int64_t bytes);

}  // namespace lowbit
