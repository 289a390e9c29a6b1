#include "runtime/straggler.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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

struct StopFlag {
  std::atomic<bool> stop{false};
  std::thread thread;
};

}  // namespace

Straggler::Straggler(const std::string& spec, int ranks, uint64_t seed)
    : spec_(spec), ranks_(ranks), seed_(seed) {
  static const char* kHelp =
      " (expected none | static:F0,F1,... | trace:PATH[,PATH...] | stress:RANK=LOAD[,...], then optional "
      ";scale=S ;offset=O,... ;noise=SD ;period=S ;gpu=FLOOR:SAT:SLOPE:CAP[,...] ;seed=N)";
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
    } else if (key == "offset") {
      for (auto& o : split(val, ',')) offsets.push_back(to_int(o, "offset"));
    } else if (key == "noise") {
      noise_sd_ = to_double(val, "noise");
      if (noise_sd_ < 0) throw std::invalid_argument("--straggle: noise must be >= 0");
    } else if (key == "period") {
      period_s_ = to_double(val, "period");
      if (period_s_ <= 0) throw std::invalid_argument("--straggle: period must be > 0 seconds");
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
        for (double c : t.capacity) s.capacity.push_back(std::clamp(std::isfinite(c) ? c : 1.0, 0.05, 1.0));
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
    // Seeded assignment of series to ranks (cycled when more ranks than series) and start offsets.
    std::mt19937_64 rng(seed_ ^ 0x5eedULL);
    std::vector<int> order(series_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (int r = 0; r < ranks_; ++r) {
      int s = order[r % order.size()];
      series_of_rank_.push_back(s);
      int64_t len = static_cast<int64_t>(series_[s].capacity.size());
      int64_t off = offsets.empty() ? static_cast<int64_t>(rng() % len)
                                    : offsets[std::min<size_t>(r, offsets.size() - 1)];
      offsets_.push_back(((off % len) + len) % len);
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
  noise_state_ = seed_ * 0x9E3779B97F4A7C15ULL + 1;
}

Straggler::~Straggler() {
  stop_cotenant();
}

const CapacitySeries& Straggler::series_of(int rank) const {
  return series_[series_of_rank_[rank]];
}

int64_t Straggler::step_of(int rank, double elapsed_s) const {
  const auto& s = series_of(rank);
  int64_t len = static_cast<int64_t>(s.capacity.size());
  int64_t step = static_cast<int64_t>(std::floor(std::max(0.0, elapsed_s) / scale_s_)) + offsets_[rank];
  return step % len;  // replay wraps around
}

double Straggler::capacity(int rank, double elapsed_s) const {
  switch (kind_) {
    case Kind::kStatic:
      return static_factors_[rank % static_factors_.size()];
    case Kind::kTrace:
      return series_of(rank).capacity[step_of(rank, elapsed_s)];
    default:
      return 1.0;
  }
}

int64_t Straggler::mem_cap(int rank) const {
  if (caps_.empty()) return std::numeric_limits<int64_t>::max();
  return caps_[rank % caps_.size()];
}

balancer::TimeCurve Straggler::curve(int rank, double elapsed_s) const {
  if (curves_.empty()) return {};
  balancer::TimeCurve c = curves_[rank % curves_.size()];
  double cap = capacity(rank, elapsed_s);
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
  return real_s / capacity(rank, elapsed_s);
}

void Straggler::stretch_to(double real_s, double target_s) {
  if (target_s > real_s) std::this_thread::sleep_for(std::chrono::duration<double>(target_s - real_s));
}

ResourceMetrics Straggler::metrics(int rank, double elapsed_s, const ResourceMetrics& measured) {
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
  if (kind_ != Kind::kStress || stress_load_[rank] == 0) return;
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
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the rank
    if (getppid() != parent) _exit(0);
    execlp("stress-ng", "stress-ng", "--cpu", "1", "--cpu-load", load.c_str(), "--taskset", cpus.c_str(),
           "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  cotenant_ = pid;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    cotenant_ = -1;
    throw std::runtime_error("stress-ng could not start (exit " + std::to_string(WEXITSTATUS(status)) +
                             "); install it with scripts/setup.sh (Debian package stress-ng)");
  }
  if (period_s_ > 0) {
    auto* flag = new StopFlag;
    double period = period_s_;
    flag->thread = std::thread([flag, pid, period] {
      bool on = true;
      while (!flag->stop.load()) {
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(period);
        while (!flag->stop.load() && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        on = !on;
        kill(pid, on ? SIGCONT : SIGSTOP);
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
    kill(cotenant_, SIGCONT);
    kill(cotenant_, SIGTERM);
    waitpid(cotenant_, nullptr, 0);
    cotenant_ = -1;
  }
}

}  // namespace lbbsp::runtime
