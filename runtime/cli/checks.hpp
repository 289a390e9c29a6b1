// Checks for numeric flags whose failures read well: "--lr: -1 must be > 0" where CLI11's PositiveNumber says
// "Value -1 not in range 0.000000 to 179769313486231570814527...".
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

namespace lbbsp::cli {

inline CLI::Validator bound_check(bool strict, const char* name) {
  return CLI::Validator(
      [strict](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v))
          return "'" + text + "' is not a finite number";
        if (strict ? v > 0 : v >= 0) return {};
        return text + (strict ? " must be > 0" : " must be >= 0");
      },
      name);
}

inline const CLI::Validator kPositive = bound_check(true, "POSITIVE");
inline const CLI::Validator kNonNegative = bound_check(false, "NONNEGATIVE");

}  // namespace lbbsp::cli
