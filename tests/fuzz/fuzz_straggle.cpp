// libFuzzer target: the --straggle spec parser (runtime::Straggler's constructor). Any spec must either build
// a Straggler or throw std::invalid_argument / std::runtime_error; never crash, hang or leak.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "runtime/straggle/straggler.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string spec(reinterpret_cast<const char*>(data), size);
  // trace: reads files named in the spec (a fuzzed path could name /dev/zero); the trace reader has its own
  // target.
  if (spec.find("trace") != std::string::npos) return 0;
  for (int ranks : {1, 4}) {
    try {
      lbbsp::runtime::Straggler s(spec, ranks, 1);
      for (int r = 0; r < ranks; ++r) {
        (void)s.capacity(r, 3.5);
        (void)s.mem_cap(r);
        (void)s.curve(r, 1.0).time(100);
      }
    } catch (const std::invalid_argument&) {
    } catch (const std::runtime_error&) {
    }
  }
  return 0;
}
