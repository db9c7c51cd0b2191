#include "lowbit/core/host_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "lowbit/core/error.h"

namespace lowbit {

std::optional<int64_t> host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  if (!meminfo) return std::nullopt;
  std::optional<int64_t> available, swap_free;
  std::string line;
  while (std::getline(meminfo, line)) {
    // Lines read "MemAvailable:   23104312 kB".
    std::istringstream fields(line);
    std::string key, unit;
    int64_t kib = 0;
    if (!(fields >> key >> kib >> unit) || unit != "kB") continue;
    if (key == "MemAvailable:") available = kib * 1024;
    else if (key == "SwapFree:") swap_free = kib * 1024;
  }
  if (!available) return std::nullopt;
  return *available + swap_free.value_or(0);
}

std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  if (unit == 0) std::snprintf(buffer, sizeof buffer, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buffer, sizeof buffer, "%.1f %s", value, kUnits[unit]);
  return buffer;
}

void require_host_memory(int64_t bytes, std::string_view what) {
  const std::optional<int64_t> available = host_memory_available();
  if (!available || bytes <= *available) return;
  fail(ErrorKind::unsupported, what, " needs ", format_bytes(bytes), " of host memory; this machine has ",
       format_bytes(*available), " available (MemAvailable + SwapFree in /proc/meminfo)");
}

}  // namespace lowbit
