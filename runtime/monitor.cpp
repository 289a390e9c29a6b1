#include "runtime/monitor.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace lbbsp::runtime {

namespace {
double own_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::vector<int> ResourceMonitor::allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

ResourceMonitor::ResourceMonitor() : cpus_(allowed_cpus()) {
  ticks_per_s_ = sysconf(_SC_CLK_TCK);
  last_ = read_cpu_times();
  last_own_s_ = own_cpu_seconds();
  last_wall_s_ = wall_seconds();
}

ResourceMonitor::CpuTimes ResourceMonitor::read_cpu_times() const {
  CpuTimes t;
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("procs_running ", 0) == 0) t.running = std::atol(line.c_str() + 14);
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3])))
      continue;
    std::istringstream s(line.substr(3));
    int cpu;
    uint64_t user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    s >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
    if (!cpus_.empty() && !std::binary_search(cpus_.begin(), cpus_.end(), cpu)) continue;
    uint64_t busy = user + nice + sys + irq + softirq + steal;
    t.busy += busy;
    t.total += busy + idle + iowait;
  }
  return t;
}

ResourceMetrics ResourceMonitor::sample() {
  ResourceMetrics m;
  // Pinned elsewhere since the last sample: the old baseline counts other CPUs, so start afresh and report
  // cpu_avail 1 (not the few microseconds to the next read: a 10 ms tick landing in them read as 0 under
  // load).
  std::vector<int> cpus = allowed_cpus();
  const bool repinned = cpus != cpus_;
  if (repinned) cpus_ = std::move(cpus);
  CpuTimes now = read_cpu_times();
  double own = own_cpu_seconds(), wall = wall_seconds();
  double total_s = static_cast<double>(now.total - last_.total) / ticks_per_s_;
  double busy_s = static_cast<double>(now.busy - last_.busy) / ticks_per_s_;
  double others_s = std::max(0.0, busy_s - (own - last_own_s_));
  if (total_s > 0 && !repinned) m.cpu_avail = std::clamp(1.0 - others_s / total_s, 0.0, 1.0);
  last_ = now;
  last_own_s_ = own;
  last_wall_s_ = wall;

  std::ifstream mi("/proc/meminfo");
  std::string key;
  double value = 0, total = 0, avail = 0;
  std::string unit;
  while (mi >> key >> value) {
    std::getline(mi, unit);
    if (key == "MemTotal:") total = value;
    if (key == "MemAvailable:") avail = value;
  }
  if (total > 0) m.mem_avail = avail / total;
  m.load = static_cast<double>(now.running) / std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  return m;
}

}  // namespace lbbsp::runtime
