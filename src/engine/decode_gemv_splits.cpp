#include "lowbit/engine/decode_gemv_splits.h"

#include <algorithm>
#include <charconv>

#include "lowbit/core/error.h"

namespace lowbit::engine {

void check_decode_gemv_split(std::string_view role, int split) {
  LOWBIT_REQUIRE(std::find(kDecodeGemmRoles.begin(), kDecodeGemmRoles.end(), role) != kDecodeGemmRoles.end(),
                 "unknown role '", role, "' (qkv, o, gate_up, down, lm_head)");
  LOWBIT_REQUIRE(split >= 1 && split <= kMaxDecodeGemvSplit, "'", role, "=", split,
                 "': the split must be an integer from 1 to ", kMaxDecodeGemvSplit);
}

std::map<std::string, int> parse_decode_gemv_splits(std::string_view text) {
  std::map<std::string, int> splits;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view entry = text.substr(start, end - start);
    start = end + 1;
    const size_t eq = entry.find('=');
    LOWBIT_REQUIRE(eq != std::string_view::npos && eq > 0 && eq + 1 < entry.size(), "'", entry,
                   "' is not role=split (e.g. qkv=4)");
    const std::string_view role = entry.substr(0, eq), value = entry.substr(eq + 1);
    int split = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), split);
    LOWBIT_REQUIRE(ec == std::errc() && ptr == value.data() + value.size(), "'", entry,
                   "': the split must be an integer from 1 to ", kMaxDecodeGemvSplit);
    check_decode_gemv_split(role, split);
    LOWBIT_REQUIRE(splits.emplace(std::string(role), split).second, "role '", role,
                   "' given twice");
  }
  LOWBIT_REQUIRE(text.empty() || text.back() != ',', "'", text, "' ends with a comma");
  return splits;
}

std::string format_decode_gemv_splits(const std::map<std::string, int>& splits) {
  std::string out;
  for (std::string_view role : kDecodeGemmRoles) {
    const auto it = splits.find(std::string(role));
    if (it == splits.end()) continue;
    if (!out.empty()) out += ',';
    out += std::string(role) + "=" + std::to_string(it->second);
  }
  return out;
}

}  // namespace lowbit::engine
