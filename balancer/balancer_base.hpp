// Internal to balancer/ (not installed): the base every balancer derives from, the helpers they share, and
// the constructor of each kind that make_balancer() (make_balancer.cpp) picks from the spec.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/assign.hpp"
#include "balancer/balancer.hpp"

namespace lbbsp::balancer::detail {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// samples/s measured this iteration, NaN when the report carries no usable speed.
inline double measured_speed(const WorkerReport& w) {
  if (w.batch <= 0 || !std::isfinite(w.compute_s) || w.compute_s <= 0.0) return kNaN;
  const double s = static_cast<double>(w.batch) / w.compute_s;
  return std::isfinite(s) ? s : kNaN;
}

inline bool curve_is_set(const TimeCurve& c) {
  return c.floor_s > 0.0 || c.slope_s_per_sample > 0.0;
}

class BalancerBase : public Balancer {
 public:
  explicit BalancerBase(const BalancerConfig& cfg, bool keep_measuring) : cfg_(cfg) {
    const int64_t n = cfg.workers;
    // A worker with 0 samples tells nothing about its speed, so adaptive balancers keep at least one each.
    min_each_ = std::max(cfg.min_batch, keep_measuring && cfg.global_batch >= n ? int64_t{1} : int64_t{0});
  }

 protected:
  size_t n() const { return static_cast<size_t>(cfg_.workers); }

  void check_report(const IterationReport& report) const {
    if (report.workers.size() != n())
      throw std::invalid_argument("balancer " + name() + ": report has " +
                                  std::to_string(report.workers.size()) + " workers, expected " +
                                  std::to_string(n()));
  }

  // Bounds for the coming iteration: memory caps from the report (or the config before the first one).
  BatchBounds bounds_for(const IterationReport* report) const {
    BatchBounds b;
    b.min.assign(n(), min_each_);
    b.max.assign(n(), std::numeric_limits<int64_t>::max());
    for (size_t i = 0; i < n(); ++i) {
      int64_t cap = report ? report->workers[i].mem_cap : (cfg_.mem_cap.empty() ? b.max[i] : cfg_.mem_cap[i]);
      cap = std::max<int64_t>(cap, 0);
      b.max[i] = cap;
      b.min[i] = std::min(b.min[i], cap);
    }
    return b;
  }

  // The configured exo entry when it is a usable capacity in (0, 1], else NaN.
  double capacity_signal(const std::vector<double>& exo) const {
    const int k = cfg_.capacity_exo;
    if (k < 0 || static_cast<size_t>(k) >= exo.size()) return kNaN;
    const double c = exo[static_cast<size_t>(k)];
    return std::isfinite(c) && c > 0.0 && c <= 1.0 ? c : kNaN;
  }
  // A worker given 0 samples is tracked through its capacity signal, which brings it back when its capacity
  // rises; but if it is hopeless even at full capacity (a fixed cost per iteration, such as a co-tenant's
  // scheduling delay, outlasted the others' whole batch while it was measured), nothing would ever bring it
  // back. Such workers get one sample each every kProbeEvery iterations, all in the same iteration so that
  // the probes cost one slow iteration in kProbeEvery however many there are. `one_sample_s(i)` is worker i's
  // predicted time for one sample at capacity 1, `iteration_s()` the planned iteration's predicted time (only
  // evaluated in a probe iteration). Returns the probed workers (their bounds.min raised to 1; the caller
  // assigns again).
  static constexpr int64_t kProbeEvery = 64;
  template <class IterationSeconds, class OneSampleSeconds>
  std::vector<size_t> probe_hopeless(const IterationReport& report, const std::vector<int64_t>& batch,
                                     IterationSeconds iteration_seconds, OneSampleSeconds one_sample_s,
                                     BatchBounds& bounds) const {
    std::vector<size_t> probed;
    if (report.iteration % kProbeEvery != kProbeEvery - 1 || cfg_.global_batch < static_cast<int64_t>(n()))
      return probed;
    const double iteration_s = iteration_seconds();
    for (size_t i = 0; i < n(); ++i) {
      if (batch[i] != 0 || report.workers[i].batch != 0 || bounds.max[i] < 1) continue;
      if (!(one_sample_s(i) > iteration_s)) continue;  // its capacity signal can still bring it back
      bounds.min[i] = 1;
      probed.push_back(i);
    }
    return probed;
  }
  // Whether b is a batch vector for this balancer within `bounds` (n entries, each in [min, max], sum X).
  bool within(const std::vector<int64_t>& b, const BatchBounds& bounds) const {
    if (b.size() != n()) return false;
    int64_t total = 0;
    for (size_t i = 0; i < n(); ++i) {
      if (b[i] < bounds.min[i] || b[i] > bounds.max[i]) return false;
      total += b[i];
    }
    return total == cfg_.global_batch;
  }
  std::vector<int64_t> equal_split(const BatchBounds& bounds) const {
    return assign_by_speed(std::vector<double>(n(), 1.0), cfg_.global_batch, bounds);
  }

  BalancerConfig cfg_;
  int64_t min_each_ = 0;
};

// One balancer per file (bsp.cpp, static.cpp, ...); the arguments are parsed and checked by make_balancer().
std::unique_ptr<Balancer> make_bsp(const BalancerConfig& cfg);
std::unique_ptr<Balancer> make_static(const BalancerConfig& cfg, int64_t measuring_iterations);
std::unique_ptr<Balancer> make_random(const BalancerConfig& cfg, uint64_t seed);
// lbbsp-cpu's noise band, in RMS misses: `band` to leave or return to the equal split (half a miss by
// default: it tracked real co-tenants better than a whole one), `track` (a fraction of it) between two
// unequal ones (;band=FACTOR and ;track=FACTOR); follow: a confirmed change of phase followed on the
// measured speeds (;follow=1; off by default). docs/balancers.md has the measurements.
struct BandFactors {
  static constexpr double kBand = 0.5, kTrack = 1.0;
  double band = kBand, track = kTrack;
  bool follow = false;  // follow a confirmed change of phase on the measured speeds (;follow=1)
};
std::unique_ptr<Balancer> make_lbbsp_cpu(const BalancerConfig& cfg, const std::string& predictor_spec,
                                         BandFactors factors = {});
std::unique_ptr<Balancer> make_lbbsp_gpu(const BalancerConfig& cfg, int64_t window);
std::unique_ptr<Balancer> make_lbbsp_gpu_model(const BalancerConfig& cfg);
std::unique_ptr<Balancer> make_oracle(const BalancerConfig& cfg);

}  // namespace lbbsp::balancer::detail
