#include "runtime/straggler.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "runtime/traces.hpp"

namespace lbbsp::runtime {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

double to_double(const std::string& s, const std::string& what) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) {
    throw std::invalid_argument("--straggle: '" + s + "' is not a number (in " + what + ")");
  }
  return v;
}

int64_t to_int(const std::string& s, const std::string& what) {
  double v = to_double(s, what);
  if (v != std::floor(v))
    throw std::invalid_argument("--straggle: '" + s + "' is not an integer (in " + what + ")");
  if (std::fabs(v) > 9.0e15)  // beyond 2^53 a double no longer holds every integer (and 1e46 is no int64)
    throw std::invalid_argument("--straggle: '" + s + "' is out of range (in " + what + ")");
  return static_cast<int64_t>(v);
}

double real_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct StopFlag {
  std::atomic<bool> stop{false};
  std::thread thread;
};

}  // namespace

Straggler::Straggler(const std::string& spec, int ranks, uint64_t seed)
    : spec_(spec), ranks_(ranks), seed_(seed) {
  static const char* kHelp =
      " (expected none | static:F0,F1,... | trace:PATH[,PATH...] | stress:RANK=LOAD[,...], then optional "
      ";scale=S ;rate=K ;align=time ;offset=O,... ;noise=SD ;period=S ;pin=C,... "
      ";gpu=FLOOR:SAT:SLOPE:CAP[,...] ;tick=S "
      ";seed=N)";
  auto parts = split(spec, ';');
  if (parts.empty() || parts[0].empty())
    throw std::invalid_argument("--straggle: empty spec" + std::string(kHelp));
  std::string kind = parts[0], args;
  if (auto colon = kind.find(':'); colon != std::string::npos) {
    args = kind.substr(colon + 1);
    kind = kind.substr(0, colon);
  }
  std::vector<int64_t> offsets;
  for (size_t i = 1; i < parts.size(); ++i) {
    auto eq = parts[i].find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--straggle: option '" + parts[i] + "' needs KEY=VALUE" + kHelp);
    std::string key = parts[i].substr(0, eq), val = parts[i].substr(eq + 1);
    if (key == "scale") {
      scale_s_ = to_double(val, "scale");
      if (scale_s_ <= 0) throw std::invalid_argument("--straggle: scale must be > 0 seconds per trace step");
    } else if (key == "rate") {
      rate_ = to_double(val, "rate");
      if (rate_ <= 0) throw std::invalid_argument("--straggle: rate must be > 0 trace seconds per second");
    } else if (key == "align") {
      if (val != "time" && val != "random")
        throw std::invalid_argument("--straggle: align must be 'time' or 'random', not '" + val + "'");
      align_time_ = val == "time";
    } else if (key == "pin") {
      for (auto& c : split(val, ',')) {
        int64_t cpu = to_int(c, "pin");
        if (cpu < 0 || cpu >= CPU_SETSIZE)
          throw std::invalid_argument("--straggle: pin CPU " + c + " must be in 0.." +
                                      std::to_string(CPU_SETSIZE - 1));
        pin_.push_back(static_cast<int>(cpu));
      }
    } else if (key == "offset") {
      for (auto& o : split(val, ',')) offsets.push_back(to_int(o, "offset"));
    } else if (key == "noise") {
      noise_sd_ = to_double(val, "noise");
      if (noise_sd_ < 0) throw std::invalid_argument("--straggle: noise must be >= 0");
    } else if (key == "period") {
      period_s_ = to_double(val, "period");
      if (period_s_ <= 0) throw std::invalid_argument("--straggle: period must be > 0 seconds");
    } else if (key == "tick") {
      tick_s_ = to_double(val, "tick");
      if (tick_s_ <= 0) throw std::invalid_argument("--straggle: tick must be > 0 seconds per iteration");
    } else if (key == "seed") {
      seed_ = static_cast<uint64_t>(to_int(val, "seed"));
    } else if (key == "gpu") {
      for (auto& c : split(val, ',')) {
        auto f = split(c, ':');
        if (f.size() != 4)
          throw std::invalid_argument("--straggle: gpu profile '" + c + "' must be FLOOR:SAT:SLOPE:CAP");
        balancer::TimeCurve curve{to_double(f[0], "gpu FLOOR"), to_double(f[1], "gpu SAT"),
                                  to_double(f[2], "gpu SLOPE")};
        int64_t cap = to_int(f[3], "gpu CAP");
        if (curve.floor_s < 0 || curve.sat_batch < 0 || curve.slope_s_per_sample < 0 || cap < 1) {
          throw std::invalid_argument("--straggle: gpu profile '" + c +
                                      "' needs FLOOR, SAT, SLOPE >= 0 and CAP >= 1");
        }
        curves_.push_back(curve);
        caps_.push_back(cap);
      }
    } else {
      throw std::invalid_argument("--straggle: unknown option '" + key + "'" + kHelp);
    }
  }

  if (kind == "none") {
    kind_ = Kind::kNone;
  } else if (kind == "static") {
    kind_ = Kind::kStatic;
    for (auto& f : split(args, ',')) {
      double v = to_double(f, "static factors");
      if (v <= 0 || v > 1)
        throw std::invalid_argument("--straggle: static factor " + f + " must be in (0, 1]");
      static_factors_.push_back(v);
    }
    if (static_factors_.empty())
      throw std::invalid_argument("--straggle: static needs factors, e.g. static:1,1,0.5,0.25");
  } else if (kind == "trace") {
    kind_ = Kind::kTrace;
    if (args.empty())
      throw std::invalid_argument(
          "--straggle: trace needs a file or folder, e.g. trace:../shared/traces/planetlab_cloudsim");
    for (auto& path : split(args, ',')) {
      std::vector<TraceSeries> loaded;
      try {
        loaded = load_traces(path);
      } catch (const std::exception& e) {
        throw std::invalid_argument(std::string("--straggle: ") + e.what());
      }
      for (auto& t : loaded) {
        CapacitySeries s;
        s.source = t.source;
        s.origin_s = t.origin_s;
        for (double c : t.capacity) s.capacity.push_back(std::clamp(std::isfinite(c) ? c : 1.0, 0.05, 1.0));
        s.time_s = t.time_s;
        if (s.time_s.size() != s.capacity.size()) {  // no usable clock: one step per second
          s.time_s.resize(s.capacity.size());
          for (size_t k = 0; k < s.time_s.size(); ++k) s.time_s[k] = static_cast<double>(k);
        }
        for (size_t k = 0; k < t.exo_names.size(); ++k) {
          const auto& n = t.exo_names[k];
          if (n.find("mem") != std::string::npos) {
            for (double v : t.exo[k]) {
              double frac = v > 1.0 ? v / 100.0 : v;  // percent or fraction used
              s.mem_avail.push_back(std::clamp(1.0 - frac, 0.0, 1.0));
            }
            break;
          }
        }
        if (!s.capacity.empty()) series_.push_back(std::move(s));
      }
    }
    if (series_.empty()) throw std::invalid_argument("--straggle: no trace series found in '" + args + "'");
    if (align_time_ && rate_ <= 0)
      throw std::invalid_argument("--straggle: align=time needs rate=K (replay by the traces' timestamps)");
    if (align_time_ && !offsets.empty())
      throw std::invalid_argument("--straggle: align=time and offset= exclude each other");
    // Seeded assignment of series to ranks (cycled when more ranks than series) and start offsets.
    std::mt19937_64 rng(seed_ ^ 0x5eedULL);
    std::vector<int> order(series_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::shuffle(order.begin(), order.end(), rng);
    if (align_time_) {
      // Co-located machines at one moment: a seeded start time in the traces' own clock, covered by as many
      // series as there are ranks (or by the most found in 1000 draws); ranks take distinct covering series.
      double lo = INFINITY, hi = -INFINITY;
      for (auto& c : series_) lo = std::min(lo, c.origin_s), hi = std::max(hi, c.origin_s + c.span_s());
      auto covering = [&](double t) {
        std::vector<int> out;
        for (int i : order)
          if (series_[i].origin_s <= t && t <= series_[i].origin_s + series_[i].span_s()) out.push_back(i);
        return out;
      };
      std::uniform_real_distribution<double> when(lo, std::max(lo, hi));
      std::vector<int> best;
      double best_t = lo;
      const size_t want = std::min(series_.size(), static_cast<size_t>(ranks_));
      for (int draw = 0; draw < 1000 && best.size() < want; ++draw) {
        double t = when(rng);
        auto c = covering(t);
        if (c.size() > best.size()) best = c, best_t = t;
      }
      if (best.empty()) best = order;
      start_time_ = best_t;
      for (int r = 0; r < ranks_; ++r) {
        int s = best[r % best.size()];
        series_of_rank_.push_back(s);
        offsets_.push_back(0);
        start_of_rank_.push_back(std::max(0.0, start_time_ - series_[s].origin_s));
      }
    } else {
      for (int r = 0; r < ranks_; ++r) {
        int s = order[r % order.size()];
        series_of_rank_.push_back(s);
        int64_t len = static_cast<int64_t>(series_[s].capacity.size());
        int64_t off = offsets.empty() ? static_cast<int64_t>(rng() % len)
                                      : offsets[std::min<size_t>(r, offsets.size() - 1)];
        offsets_.push_back(((off % len) + len) % len);
        start_of_rank_.push_back(series_[s].time_s[offsets_.back()]);
      }
    }
  } else if (kind == "stress") {
    kind_ = Kind::kStress;
    stress_load_.assign(ranks_, 0);
    for (auto& item : split(args, ',')) {
      auto eq = item.find('=');
      if (eq == std::string::npos)
        throw std::invalid_argument("--straggle: stress entry '" + item + "' must be RANK=LOAD");
      int64_t r = to_int(item.substr(0, eq), "stress rank");
      int64_t load = to_int(item.substr(eq + 1), "stress load");
      if (r < 0 || r >= ranks_)
        throw std::invalid_argument("--straggle: stress rank " + std::to_string(r) + " is not in 0.." +
                                    std::to_string(ranks_ - 1));
      if (load < 1 || load > 100)
        throw std::invalid_argument("--straggle: stress load must be 1..100 percent");
      stress_load_[r] = static_cast<int>(load);
    }
  } else {
    throw std::invalid_argument("--straggle: unknown kind '" + kind + "'" + kHelp);
  }
  if (!pin_.empty() && kind_ != Kind::kStress)
    throw std::invalid_argument(
        "--straggle: pin= is for stress: (replay kinds emulate, they need no pinning)");
  if ((rate_ > 0 || align_time_) && kind_ != Kind::kTrace)
    throw std::invalid_argument("--straggle: rate= and align= are for trace:");
  if (tick_s_ > 0 && kind_ == Kind::kStress)
    throw std::invalid_argument(
        "--straggle: tick= is for replay (static:, trace:); stress: co-tenants run in wall-clock time");
  noise_state_ = seed_ * 0x9E3779B97F4A7C15ULL + 1;
}

Straggler::~Straggler() {
  stop_cotenant();
}

const CapacitySeries& Straggler::series_of(int rank) const {
  return series_[series_of_rank_[rank]];
}

const std::string& Straggler::source_of(int rank) const {
  static const std::string none;
  return kind_ == Kind::kTrace ? series_of(rank).source : none;
}

double Straggler::trace_time(int rank, double elapsed_s) const {
  if (kind_ != Kind::kTrace) return 0.0;
  const auto& s = series_of(rank);
  return s.origin_s + s.time_s[step_of(rank, elapsed_s)];
}

int64_t Straggler::step_of(int rank, double elapsed_s) const {
  const auto& s = series_of(rank);
  int64_t len = static_cast<int64_t>(s.capacity.size());
  if (rate_ > 0) {
    // The trace's own clock: the latest sample at or before the replayed time holds until the next one.
    double t = start_of_rank_[rank] + rate_ * std::max(0.0, elapsed_s);
    // Replay wraps around; the last sample lasts one mean sample gap before the first comes back.
    double span = s.span_s();
    if (span > 0) t = std::fmod(t, span + span / static_cast<double>(len - 1));
    auto it = std::upper_bound(s.time_s.begin(), s.time_s.end(), t);
    return std::max<int64_t>(0, static_cast<int64_t>(it - s.time_s.begin()) - 1);
  }
  int64_t step = static_cast<int64_t>(std::floor(std::max(0.0, elapsed_s) / scale_s_)) + offsets_[rank];
  return step % len;  // replay wraps around
}

double Straggler::replay_capacity(int rank, double elapsed_s) const {
  switch (kind_) {
    case Kind::kStatic:
      return static_factors_[rank % static_factors_.size()];
    case Kind::kTrace:
      return series_of(rank).capacity[step_of(rank, elapsed_s)];
    default:
      return 1.0;
  }
}

double Straggler::real_at(double elapsed_s) const {
  if (real_origin_ < 0) real_origin_ = real_now() - elapsed_s;
  return real_origin_ + elapsed_s;
}

double Straggler::stress_share(int rank) const {
  if (kind_ != Kind::kStress || pin_.empty()) return 1.0;
  const int cpu = pin_[rank % pin_.size()];
  int k = 0, load = 0;
  for (int r = 0; r < ranks_; ++r)
    if (pin_[r % pin_.size()] == cpu) ++k, load += stress_load_[r];
  return load == 0 ? 1.0 : k / (k + load / 100.0);
}

bool Straggler::cotenant_on(double real_s) const {
  if (period_s_ <= 0) return true;
  return static_cast<int64_t>(std::floor(real_s / period_s_)) % 2 == 0;
}

double Straggler::capacity(int rank, double elapsed_s) const {
  if (kind_ != Kind::kStress) return replay_capacity(rank, elapsed_s);
  double share = stress_share(rank);
  if (share >= 1.0) return 1.0;
  return cotenant_on(real_at(elapsed_s)) ? share : 1.0;
}

int64_t Straggler::mem_cap(int rank) const {
  if (caps_.empty()) return std::numeric_limits<int64_t>::max();
  return caps_[rank % caps_.size()];
}

balancer::TimeCurve Straggler::curve(int rank, double elapsed_s) const {
  if (curves_.empty()) return {};
  balancer::TimeCurve c = curves_[rank % curves_.size()];
  double cap = replay_capacity(rank, elapsed_s);
  c.floor_s /= cap;
  c.slope_s_per_sample /= cap;
  return c;
}

double Straggler::emulated_seconds(int rank, double elapsed_s, int64_t batch, double real_s) const {
  if (batch > mem_cap(rank)) {
    throw std::runtime_error(
        "batch of " + std::to_string(batch) + " samples exceeds the emulated GPU memory cap of " +
        std::to_string(mem_cap(rank)) + " samples (out of memory); the balancer must respect caps");
  }
  if (gpu_profile()) return std::max(real_s, curve(rank, elapsed_s).time(static_cast<double>(batch)));
  return real_s / replay_capacity(rank, elapsed_s);  // real interference (stress) is never stretched
}

void Straggler::stretch_to(double real_s, double target_s) {
  if (target_s <= real_s) return;
  // Sleep to just short of the deadline, then yield until it: a thread woken from sleep comes back late
  // (0.1-0.2 ms on the 2-core test machine), which the emulated machine would not.
  constexpr double kSpin = 0.001;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(target_s - real_s);
  if (target_s - real_s > kSpin)
    std::this_thread::sleep_for(std::chrono::duration<double>(target_s - real_s - kSpin));
  while (std::chrono::steady_clock::now() < deadline) sched_yield();
}

ResourceMetrics Straggler::metrics(int rank, double elapsed_s, const ResourceMetrics& measured) {
  if (kind_ == Kind::kStress)
    real_at(elapsed_s);  // the trainer passes a fresh elapsed here: anchor the clock
  if (!replay()) return measured;
  ResourceMetrics m = measured;
  double cpu = capacity(rank, elapsed_s);
  if (noise_sd_ > 0) {
    // xorshift + Box-Muller: cheap, portable and seeded per rank stream.
    auto next = [&] {
      noise_state_ ^= noise_state_ << 13;
      noise_state_ ^= noise_state_ >> 7;
      noise_state_ ^= noise_state_ << 17;
      return ((noise_state_ >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    };
    double u1 = next(), u2 = next();
    cpu += noise_sd_ * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  m.cpu_avail = std::clamp(cpu, 0.0, 1.0);
  if (kind_ == Kind::kTrace && !series_of(rank).mem_avail.empty()) {
    m.mem_avail = series_of(rank).mem_avail[step_of(rank, elapsed_s) % series_of(rank).mem_avail.size()];
  }
  return m;
}

void Straggler::start_cotenant(int rank) {
  if (kind_ != Kind::kStress) return;
  if (!pin_.empty()) {
    // Every thread of this process (MPI's included) onto the one CPU; the co-tenant inherits it below.
    const int cpu = pin_[rank % pin_.size()];
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
      throw std::runtime_error("--straggle pin=: cannot pin rank " + std::to_string(rank) + " to CPU " +
                               std::to_string(cpu) + " (does this machine have it? see lbbsp info)");
    if (DIR* d = opendir("/proc/self/task")) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.')
          sched_setaffinity(static_cast<pid_t>(std::atoi(e->d_name)), sizeof one, &one);
      closedir(d);
    }
  }
  if (stress_load_[rank] == 0) return;
  std::string load = std::to_string(stress_load_[rank]);
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  std::string cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) {
      if (!cpus.empty()) cpus += ',';
      cpus += std::to_string(c);
    }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("cannot fork the stress-ng co-tenant");
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: the period's SIGSTOP/SIGCONT must reach stress-ng's worker too
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the rank
    if (getppid() != parent) _exit(0);
    execlp("stress-ng", "stress-ng", "--cpu", "1", "--cpu-load", load.c_str(), "--taskset", cpus.c_str(),
           "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // (also here, so that it holds before the first signal)
  cotenant_ = pid;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    cotenant_ = -1;
    throw std::runtime_error("stress-ng could not start (exit " + std::to_string(WEXITSTATUS(status)) +
                             "); install it with scripts/setup.sh (Debian package stress-ng)");
  }
  if (period_s_ > 0) {
    // On in even periods of the wall clock, off in odd ones (cotenant_on): the same schedule in every rank,
    // which capacity() reproduces for the oracle. The whole process group: stress-ng's worker is a child.
    auto* flag = new StopFlag;
    flag->thread = std::thread([this, flag, pid] {
      bool on = true;
      while (!flag->stop.load()) {
        bool want = cotenant_on(real_now());
        if (want != on) {
          on = want;
          kill(-pid, on ? SIGCONT : SIGSTOP);
        }
        // Until just past the next boundary, at most 50 ms (so that a stop request is seen soon).
        const double now = real_now(), to_next = period_s_ - std::fmod(now, period_s_);
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.05, to_next + 0.001)));
      }
    });
    switcher_ = flag;
  }
}

void Straggler::stop_cotenant() {
  if (switcher_) {
    auto* flag = static_cast<StopFlag*>(switcher_);
    flag->stop = true;
    flag->thread.join();
    delete flag;
    switcher_ = nullptr;
  }
  if (cotenant_ > 0) {
    kill(-cotenant_, SIGCONT);
    kill(-cotenant_, SIGTERM);
    waitpid(cotenant_, nullptr, 0);
    cotenant_ = -1;
  }
}

}  // namespace lbbsp::runtime
