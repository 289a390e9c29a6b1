// Resource metrics of this rank read from /proc: CPU available to it, memory available, load.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lbbsp::runtime {

struct ResourceMetrics {
  // Fraction of this rank's CPUs not used by other processes over the last window of at least
  // ResourceMonitor::kWindowTicks per CPU (40 ms at Linux's 100 Hz): one or more samples' intervals.
  double cpu_avail = 1.0;
  double mem_avail = 1.0;  // MemAvailable / MemTotal, read at most every kMemReadInterval
  // Runnable threads now (/proc/stat procs_running) per online CPU: an instantaneous reading, so a co-tenant
  // that started during the last iteration shows in full where cpu_avail (an average over it) shows a part.
  double load = 0.0;
};

class ResourceMonitor {
 public:
  ResourceMonitor();
  // Metrics over the interval since the previous call (the first call covers the time since construction),
  // on the CPUs this process may run on now (re-read each call: a rank pinned later is measured where it
  // runs). cpu_avail covers the last window of at least kWindowTicks per CPU, which spans several calls when
  // they come faster.
  ResourceMetrics sample();
  static constexpr uint64_t kWindowTicks = 4;
  // Memory moves slowly next to a CPU share: /proc/meminfo is re-read at most this often (each read costs
  // about as much as /proc/stat's, 50-80 us in a training step with the caches cold).
  static constexpr double kMemReadInterval = 1.0;  // seconds

 private:
  struct CpuTimes {
    uint64_t busy = 0, total = 0;
    long running = 0;  // procs_running: runnable threads system-wide at the read
  };
  CpuTimes read_cpu_times();
  double read_mem_avail();  // MemAvailable / MemTotal now (1 where /proc/meminfo is unreadable)
  static std::vector<int> allowed_cpus();  // this process's affinity mask (sched_getaffinity)
  std::vector<int> cpus_;                  // the CPUs this process may run on
  CpuTimes last_;
  double last_own_s_ = 0;        // this process's CPU seconds at the window's start
  double cpu_avail_ = 1.0;       // of the last full window
  double mem_avail_ = 1.0;       // of the last /proc/meminfo read
  double mem_read_at_ = -1e300;  // when it was read (CLOCK_MONOTONIC seconds)
  long ticks_per_s_ = 100;
  long online_cpus_ = 1;  // for load; read once (glibc's sysconf reads /sys on every call)
  std::string text_;      // the last /proc file read, kept to reuse its allocation
};

}  // namespace lbbsp::runtime
