// FNV-1a, 64-bit: the checksums of training checkpoints (runtime/io/checkpoint.cpp) and of the batch vector
// each lbbsp.torch report carries (python/torch_reports.cpp, folded to 32 bits). Header-only, like
// common/spec.hpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lbbsp {

// FNV-1a (64-bit) of `n` bytes, continued from `h`.
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace lbbsp
