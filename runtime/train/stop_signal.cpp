#include "runtime/train/stop_signal.hpp"

#include <csignal>
#include <ctime>

namespace lbbsp::runtime {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
volatile std::sig_atomic_t g_received = 0;
timespec g_first_at{};  // when g_received was set (CLOCK_MONOTONIC)
struct sigaction g_previous[sizeof kSignals / sizeof kSignals[0]];

void on_signal(int sig) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  if (g_received != 0) {
    const double since_first = static_cast<double>(now.tv_sec - g_first_at.tv_sec) +
                               1e-9 * static_cast<double>(now.tv_nsec - g_first_at.tv_nsec);
    if (since_first < kStopRepeatGraceSeconds) return;  // the same stop delivered twice, not a second request
    // Asked again: stop now, the default way.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_first_at = now;
  g_received = sig;
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaddset(&sa.sa_mask, sig);  // one handler at a time: g_first_at is not atomic
  sa.sa_flags = SA_RESTART;  // MPI and file I/O carry on; the trainer looks at the flag between iterations
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i)
    sigaction(kSignals[i], &sa, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i)
    sigaction(kSignals[i], &g_previous[i], nullptr);
}

int StopSignals::received() const {
  return g_received;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace lbbsp::runtime
