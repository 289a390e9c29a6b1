// printf formatting into a std::string for the text reports (lbbsp simulate, report, predict-eval):
//   fmt("%.2f ms", 1e3 * s), fmt("%.*g", precision, v)
// Output longer than 63 characters is cut there (no number of a report is that long).
// Header-only, like common/spec.hpp.
#pragma once
#include <cstdio>
#include <string>

namespace lbbsp {

template <class... Args>
std::string fmt(const char* format, Args... args) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

}  // namespace lbbsp
