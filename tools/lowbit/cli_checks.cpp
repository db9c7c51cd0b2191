// Option checks shared by the commands (declared in commands.h).
#include <cmath>
#include <cstdlib>
#include <string>

#include "commands.h"

namespace lowbit::cli {

CLI::Validator at_least(long long lower_bound) {
  const std::string bound = std::to_string(lower_bound);
  return CLI::Validator(
      [lower_bound, bound](std::string& text) -> std::string {
        // Parsed as a double so that one check serves int and float options;
        // the option's own conversion still refuses "1.5" for an integer.
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || std::isnan(value)) return "'" + text + "' is not a number";
        if (value < static_cast<double>(lower_bound)) return "must be at least " + bound + ", got " + text;
        return {};
      },
      ">=" + bound, "at least " + bound);
}

}  // namespace lowbit::cli
