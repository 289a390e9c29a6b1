// libFuzzer target: the trace reader (runtime::load_traces) on a temp file holding the input (all formats:
// planetlab, bitbrains, alibaba, azure, csv; gzip or plain). It must return series or throw
// std::runtime_error naming the file; never crash.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "runtime/analysis/traces.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/lbbsp-fuzz-trace-" + std::to_string(getpid()) + ".csv";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto series = lbbsp::runtime::load_traces(path);
    for (const auto& s : series) {
      for (double c : s.capacity) {
        if (!(c > 0 && c <= 1)) __builtin_trap();  // the reader promises capacities in (0, 1]
      }
    }
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  std::remove(path.c_str());
  return 0;
}
