#include "runtime/platform/kernel_env.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>

namespace lbbsp::runtime {

namespace {
inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

long spin_count_for(double microseconds) {
  // The loop libgomp spins in: load the flag, stop if it changed, else pause.
  std::atomic<int> flag{0};
  constexpr long kSpins = 40000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kSpins; ++i) {
    if (flag.load(std::memory_order_relaxed) != 0) break;
    cpu_pause();
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  const double per_spin = std::max(us / kSpins, 1e-3);
  return std::clamp(long(microseconds / per_spin), 100L, 1000000L);
}

std::vector<EnvSetting> kernel_environment() {
  std::vector<EnvSetting> out;
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT"))
    out.push_back({"GOMP_SPINCOUNT", std::to_string(spin_count_for(kSpinMicroseconds))});
  return out;
}

void reexec_with_kernel_environment(char** argv) {
  const std::vector<EnvSetting> settings = kernel_environment();
  if (settings.empty()) return;
  for (const EnvSetting& s : settings) setenv(s.name.c_str(), s.value.c_str(), 1);
  // Exec the resolved path, not /proc/self/exe, so that the process keeps its name (ps, pgrep, top).
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return;
  self[n] = '\0';
  execv(self, argv);  // on failure carry on with the libraries' defaults
}

}  // namespace lbbsp::runtime
