#include "runtime/monitor.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>

namespace lbbsp::runtime {

namespace {
double own_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double monotonic_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The whole of a /proc file in `out` (empty if unreadable). One read(2) loop and no iostreams: sample() runs
// once per iteration, and with streams it took 80-97 us on the 2-CPU development VM, now 36-56 us, most of it
// the kernel's two reads (28 us).
void read_proc_file(const char* path, std::string& out) {
  out.clear();
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char chunk[16384];
  for (ssize_t got; (got = read(fd, chunk, sizeof chunk)) != 0;) {
    if (got > 0)
      out.append(chunk, size_t(got));
    else if (errno != EINTR)
      break;  // a signal (SIGTERM's handler) must not cut the file short
  }
  close(fd);
}

// Each line of text, without its newline.
template <typename Fn>
void for_each_line(std::string_view text, Fn&& fn) {
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    fn(text.substr(0, end));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
}

// The next space-separated unsigned number of `rest` (consumed), or 0 when there is none left.
uint64_t next_number(std::string_view& rest) {
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  rest.remove_prefix(size_t(end - rest.data()));
  return ec == std::errc() ? value : 0;
}

// The number after `key` at the start of `line`, or 0 when the line starts otherwise.
uint64_t value_after(std::string_view line, std::string_view key) {
  if (!line.starts_with(key)) return 0;
  line.remove_prefix(key.size());
  return next_number(line);
}
}  // namespace

std::vector<int> ResourceMonitor::allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    // Stop at the last CPU in the mask rather than at CPU_SETSIZE (1,024): this runs every iteration.
    for (int c = 0, left = CPU_COUNT(&set); left > 0 && c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c), --left;
  }
  return cpus;
}

ResourceMonitor::ResourceMonitor() : cpus_(allowed_cpus()) {
  ticks_per_s_ = sysconf(_SC_CLK_TCK);
  online_cpus_ = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  last_ = read_cpu_times();
  last_own_s_ = own_cpu_seconds();
}

ResourceMonitor::CpuTimes ResourceMonitor::read_cpu_times() {
  CpuTimes t;
  read_proc_file("/proc/stat", text_);
  for_each_line(text_, [&](std::string_view line) {
    if (line.starts_with("procs_running ")) t.running = long(value_after(line, "procs_running "));
    if (line.size() < 4 || !line.starts_with("cpu") || !std::isdigit(static_cast<unsigned char>(line[3])))
      return;
    // cpuN user nice system idle iowait irq softirq steal ...
    std::string_view rest = line.substr(3);
    const int cpu = int(next_number(rest));
    uint64_t v[8] = {};
    for (uint64_t& x : v) x = next_number(rest);
    if (!cpus_.empty() && !std::binary_search(cpus_.begin(), cpus_.end(), cpu)) return;
    const uint64_t busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];  // user nice system irq softirq steal
    t.busy += busy;
    t.total += busy + v[3] + v[4];  // + idle iowait
  });
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
  const double own = own_cpu_seconds();
  // /proc/stat counts in ticks (10 ms): an interval of a few ticks or less reads as all ours or all theirs,
  // so the window grows over samples until it spans kWindowTicks per CPU, and the last full window's value
  // is reported meanwhile (iterations of a millisecond would otherwise read 1 nearly always).
  const uint64_t cpus_counted = cpus_.empty() ? uint64_t(online_cpus_) : cpus_.size();
  const bool window_done = now.total - last_.total >= kWindowTicks * cpus_counted;
  if (window_done && !repinned) {
    const double total_s = static_cast<double>(now.total - last_.total) / ticks_per_s_;
    const double busy_s = static_cast<double>(now.busy - last_.busy) / ticks_per_s_;
    const double others_s = std::max(0.0, busy_s - (own - last_own_s_));
    cpu_avail_ = std::clamp(1.0 - others_s / total_s, 0.0, 1.0);
  }
  if (repinned) cpu_avail_ = 1.0;
  if (window_done || repinned) {  // a new window starts here
    last_ = now;
    last_own_s_ = own;
  }
  m.cpu_avail = cpu_avail_;

  const double now_s = monotonic_seconds();
  if (now_s - mem_read_at_ >= kMemReadInterval) {
    mem_avail_ = read_mem_avail();
    mem_read_at_ = now_s;
  }
  m.mem_avail = mem_avail_;
  m.load = static_cast<double>(now.running) / online_cpus_;
  return m;
}

double ResourceMonitor::read_mem_avail() {
  uint64_t total = 0, avail = 0;  // kB
  read_proc_file("/proc/meminfo", text_);
  for_each_line(text_, [&](std::string_view line) {
    total = std::max(total, value_after(line, "MemTotal:"));
    avail = std::max(avail, value_after(line, "MemAvailable:"));
  });
  return total > 0 ? double(avail) / double(total) : 1.0;
}

}  // namespace lbbsp::runtime
