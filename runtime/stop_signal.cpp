#include "runtime/stop_signal.hpp"

#include <csignal>

namespace lbbsp::runtime {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
volatile std::sig_atomic_t g_received = 0;
struct sigaction g_previous[sizeof kSignals / sizeof kSignals[0]];

void on_signal(int sig) {
  if (g_received != 0) {  // asked twice: stop now, the default way
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_received = sig;
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
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
