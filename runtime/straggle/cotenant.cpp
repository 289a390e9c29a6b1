// stress:RANK=LOAD[,...]: real interference, a stress-ng co-tenant at LOAD percent next to RANK (on the CPUs
// it runs on), optionally pinned (pin=) and switched on and off on a wall-clock period (period=). Compute is
// never stretched; capacity() models the CPU share the co-tenants leave (for the oracle).
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/straggle/emulation.hpp"

namespace lbbsp::runtime::straggle {

namespace {

double real_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Every thread of this process (MPI's included) onto one CPU; a co-tenant forked later inherits it.
void pin_process(int rank, int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0)
    throw std::runtime_error("--straggle pin=: cannot pin rank " + std::to_string(rank) + " to CPU " +
                             std::to_string(cpu) + " (does this machine have it? see lbbsp info)");
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') sched_setaffinity(static_cast<pid_t>(std::atoi(e->d_name)), sizeof one, &one);
    closedir(d);
  }
}

// The CPUs this process may run on, as stress-ng's --taskset list ("0,1,3").
std::string allowed_cpu_list() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  std::string cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) {
      if (!cpus.empty()) cpus += ',';
      cpus += std::to_string(c);
    }
  return cpus;
}

// Forks stress-ng at `load` percent on this process's CPUs, in its own process group; throws when it does not
// start.
pid_t spawn_stress(int load) {
  const std::string load_text = std::to_string(load), cpus = allowed_cpu_list();
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("cannot fork the stress-ng co-tenant");
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: the period's SIGSTOP/SIGCONT must reach stress-ng's worker too
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the rank
    if (getppid() != parent) _exit(0);
    execlp("stress-ng", "stress-ng", "--cpu", "1", "--cpu-load", load_text.c_str(), "--taskset", cpus.c_str(),
           "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // (also here, so that it holds before the first signal)
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid)
    throw std::runtime_error("stress-ng could not start (exit " + std::to_string(WEXITSTATUS(status)) +
                             "); install it with scripts/setup.sh (Debian package stress-ng)");
  return pid;
}

class Cotenant final : public Emulation {
 public:
  explicit Cotenant(const Config& c)
      : ranks_(c.ranks), period_s_(c.period_s), load_(c.stress_load), pin_(c.pin) {}
  ~Cotenant() override { stop(); }

  double capacity(int rank, double elapsed_s) const override {
    const double share = stress_share(rank);
    if (share >= 1.0) return 1.0;
    return cotenant_on(period_s_, real_at(elapsed_s)) ? share : 1.0;
  }
  // k / (k + sum of the co-tenants' loads / 100) for k ranks pinned to rank's CPU (CFS shares a CPU equally
  // among runnable tasks; a co-tenant at L% is runnable L% of the time). An a-priori model, not a
  // measurement.
  double stress_share(int rank) const override {
    if (pin_.empty()) return 1.0;
    const int cpu = pin_[rank % pin_.size()];
    int k = 0, load = 0;
    for (int r = 0; r < ranks_; ++r)
      if (pin_[r % pin_.size()] == cpu) ++k, load += load_[r];
    return load == 0 ? 1.0 : k / (k + load / 100.0);
  }
  void anchor_clock(double elapsed_s) override { real_at(elapsed_s); }
  void start(int rank) override;
  void stop() override;

 private:
  // CLOCK_REALTIME at the trainer's elapsed_s; the first call ties the two clocks together.
  double real_at(double elapsed_s) const {
    if (real_origin_ < 0) real_origin_ = real_now() - elapsed_s;
    return real_origin_ + elapsed_s;
  }
  void start_switcher(pid_t pid);

  int ranks_;
  double period_s_;
  std::vector<int> load_;  // percent per rank, 0 = none
  std::vector<int> pin_;   // CPU per rank (cycled), empty = not pinned
  mutable double real_origin_ = -1;
  pid_t cotenant_ = -1;
  std::atomic<bool> stop_switcher_{false};
  std::thread switcher_;  // toggles the co-tenant on the period
};

void Cotenant::start(int rank) {
  if (!pin_.empty()) pin_process(rank, pin_[rank % pin_.size()]);
  if (load_[rank] == 0) return;
  cotenant_ = spawn_stress(load_[rank]);
  if (period_s_ > 0) start_switcher(cotenant_);
}

// On in even periods of the wall clock, off in odd ones (cotenant_on): the same schedule in every rank, which
// capacity() reproduces for the oracle. The whole process group: stress-ng's worker is a child.
void Cotenant::start_switcher(pid_t pid) {
  stop_switcher_ = false;
  switcher_ = std::thread([this, pid] {
    bool on = true;
    while (!stop_switcher_.load()) {
      const bool want = cotenant_on(period_s_, real_now());
      if (want != on) {
        on = want;
        kill(-pid, on ? SIGCONT : SIGSTOP);
      }
      // Until just past the next boundary, at most 50 ms (so that a stop request is seen soon).
      const double now = real_now(), to_next = period_s_ - std::fmod(now, period_s_);
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.05, to_next + 0.001)));
    }
  });
}

void Cotenant::stop() {
  if (switcher_.joinable()) {
    stop_switcher_ = true;
    switcher_.join();
  }
  if (cotenant_ > 0) {
    kill(-cotenant_, SIGCONT);
    kill(-cotenant_, SIGTERM);
    waitpid(cotenant_, nullptr, 0);
    cotenant_ = -1;
  }
}

}  // namespace

bool cotenant_on(double period_s, double real_s) {
  if (period_s <= 0) return true;
  return static_cast<int64_t>(std::floor(real_s / period_s)) % 2 == 0;
}

std::unique_ptr<Emulation> make_cotenant(const Config& config) {
  return std::make_unique<Cotenant>(config);
}

}  // namespace lbbsp::runtime::straggle
