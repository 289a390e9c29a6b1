#include "runtime/train/watchdog.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace lbbsp::runtime {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Watchdog::Watchdog(int rank, double timeout_s) : rank_(rank), timeout_s_(timeout_s) {
  if (timeout_s_ <= 0) return;
  beat(0, "start-up");
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Watchdog::beat(int64_t iteration, const char* phase) {
  iteration_ = iteration;
  phase_ = phase;
  last_ = now_s();
}

void Watchdog::watch() {
  while (!stop_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double idle = now_s() - last_.load();
    if (idle > timeout_s_ && !stop_.load()) {
      std::fprintf(
          stderr,
          "lbbsp: rank %d: error: no progress for %.0f s in iteration %lld (%s); a rank hung or died "
          "(--iteration-timeout %.0f)\n",
          rank_, idle, static_cast<long long>(iteration_.load()), phase_.load(), timeout_s_);
      std::fflush(stderr);
      _exit(3);  // the launcher sees a rank die and ends the whole job
    }
  }
}

}  // namespace lbbsp::runtime
