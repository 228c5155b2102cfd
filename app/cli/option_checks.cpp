// option_checks.cpp: the validators of option_checks.h.
#include "app/cli/option_checks.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>

#include <fmt/format.h>

namespace mt::app {

CLI::Validator at_least(int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc::result_out_of_range)
          return fmt::format("{} is out of range (an integer from {} to {})", text, min,
                             std::numeric_limits<int64_t>::max());
        if (ec != std::errc() || stop != end) return fmt::format("{} is not an integer", text);
        if (value < min) return fmt::format("{} is less than {}", text, min);
        return {};
      },
      fmt::format("INT>={}", min));
}

CLI::Validator above(double bound) {
  return CLI::Validator(
      [bound](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, value);
        if (ec != std::errc() || stop != end || !std::isfinite(value))
          return fmt::format("{} is not a finite number", text);
        if (value <= bound) return fmt::format("{} is not above {}", text, bound);
        return {};
      },
      fmt::format("NUMBER>{}", bound));
}

}  // namespace mt::app
