// Ends the job when this rank makes no progress for too long: a hung or dead peer blocks every other rank in
// the allreduce, and MPI itself would wait forever. The trainer beats it at each phase of an iteration.
#pragma once
#include <atomic>
#include <cstdint>
#include <thread>

namespace lbbsp::runtime {

class Watchdog {
 public:
  // timeout_s <= 0: off (no thread). Otherwise a thread checks every 200 ms and, after timeout_s without a
  // beat, prints what this rank was doing and _exit(3)s, so that the launcher ends the whole job.
  Watchdog(int rank, double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // phase must be a string literal (it is kept by pointer).
  void beat(int64_t iteration, const char* phase);

 private:
  void watch();
  int rank_;
  double timeout_s_;
  std::atomic<bool> stop_{false};
  std::atomic<double> last_{0};
  std::atomic<int64_t> iteration_{0};
  std::atomic<const char*> phase_{"start-up"};
  std::thread thread_;
};

}  // namespace lbbsp::runtime
