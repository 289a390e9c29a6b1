// The balancers behind make_balancer(): bsp, static, random, lbbsp-cpu, lbbsp-gpu (the paper's GPU
// algorithm), lbbsp-gpu-model (online curve fit) and oracle.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>

#include "balancer/assign.hpp"
#include "balancer/balancer.hpp"
#include "balancer/curve_fit.hpp"
#include "balancer/state_io.hpp"
#include "predictors/fleet.hpp"
#include "predictors/predictor.hpp"

namespace lbbsp::balancer {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// samples/s measured this iteration, NaN when the report carries no usable speed.
double measured_speed(const WorkerReport& w) {
  if (w.batch <= 0 || !std::isfinite(w.compute_s) || w.compute_s <= 0.0) return kNaN;
  const double s = static_cast<double>(w.batch) / w.compute_s;
  return std::isfinite(s) ? s : kNaN;
}

bool curve_is_set(const TimeCurve& c) {
  return c.floor_s > 0.0 || c.slope_s_per_sample > 0.0;
}

int64_t parse_int(const std::string& text, const std::string& what) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size())
    throw std::invalid_argument("balancer: bad " + what + " '" + text + "'");
  return v;
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
  std::vector<int64_t> equal_split(const BatchBounds& bounds) const {
    return assign_by_speed(std::vector<double>(n(), 1.0), cfg_.global_batch, bounds);
  }

  BalancerConfig cfg_;
  int64_t min_each_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
class BspBalancer final : public BalancerBase {
 public:
  explicit BspBalancer(const BalancerConfig& cfg) : BalancerBase(cfg, false) {}
  std::string name() const override { return "bsp"; }
  std::vector<int64_t> initial() override { return split(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    return split(bounds_for(&report));
  }
  std::string save_state() const override { return StateWriter("bsp").text(); }
  void load_state(const std::string& state) override { StateReader(state, "bsp"); }

 private:
  std::vector<int64_t> split(const BatchBounds& bounds) {
    if (bounds.max != cached_caps_ || cached_.empty()) {  // the split only changes with the memory caps
      cached_ = equal_split(bounds);
      cached_caps_ = bounds.max;
    }
    return cached_;
  }
  std::vector<int64_t> cached_, cached_caps_;
};

// ---------------------------------------------------------------------------------------------------------------
class StaticBalancer final : public BalancerBase {
 public:
  StaticBalancer(const BalancerConfig& cfg, int64_t k) : BalancerBase(cfg, false), k_(k) {
    speed_sum_.assign(n(), 0.0);
    speed_count_.assign(n(), 0);
  }
  std::string name() const override { return "static:" + std::to_string(k_); }
  std::vector<int64_t> initial() override { return equal_split(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    const BatchBounds bounds = bounds_for(&report);
    if (fixed_speeds_.empty()) {
      for (size_t i = 0; i < n(); ++i) {
        const double s = measured_speed(report.workers[i]);
        if (std::isnan(s)) continue;
        speed_sum_[i] += s;
        speed_count_[i] += 1;
      }
      if (++measured_ < k_) return equal_split(bounds);
      fixed_speeds_.resize(n());
      for (size_t i = 0; i < n(); ++i)
        fixed_speeds_[i] = speed_count_[i] > 0 ? speed_sum_[i] / static_cast<double>(speed_count_[i]) : kNaN;
    }
    return assign_by_speed(fixed_speeds_, cfg_.global_batch, bounds);
  }
  std::vector<double> predicted_speeds() const override { return fixed_speeds_; }
  std::string save_state() const override {
    StateWriter w("static");
    w.i64(measured_);
    w.f64s(speed_sum_);
    w.i64s(speed_count_);
    w.f64s(fixed_speeds_);
    return w.text();
  }
  void load_state(const std::string& state) override {
    StateReader r(state, "static");
    measured_ = r.i64();
    speed_sum_ = r.f64s();
    speed_count_ = r.i64s();
    fixed_speeds_ = r.f64s();
    if (speed_sum_.size() != n() || speed_count_.size() != n())
      throw std::invalid_argument("static: state is for another worker count");
  }

 private:
  int64_t k_;
  int64_t measured_ = 0;
  std::vector<double> speed_sum_;
  std::vector<int64_t> speed_count_;
  std::vector<double> fixed_speeds_;
};

// ---------------------------------------------------------------------------------------------------------------
class RandomBalancer final : public BalancerBase {
 public:
  RandomBalancer(const BalancerConfig& cfg, uint64_t seed)
      : BalancerBase(cfg, false), seed_(seed), rng_(seed) {}
  std::string name() const override { return "random:" + std::to_string(seed_); }
  std::vector<int64_t> initial() override { return draw(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    return draw(bounds_for(&report));
  }
  std::string save_state() const override {
    std::ostringstream os;
    os << rng_;
    StateWriter w("random");
    w.str(os.str());
    return w.text();
  }
  void load_state(const std::string& state) override {
    StateReader r(state, "random");
    std::istringstream is(r.str());
    is >> rng_;
    if (!is) throw std::invalid_argument("random: bad generator state");
  }

 private:
  // Random weights with about a quarter of them zero (those workers get their minimum, often 0 samples).
  std::vector<int64_t> draw(const BatchBounds& bounds) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<double> weights(n());
    for (double& w : weights) {
      const double x = u(rng_);
      w = x < 0.25 ? 0.0 : std::pow(u(rng_), 3.0);
    }
    return assign_by_speed(weights, cfg_.global_batch, bounds);
  }
  uint64_t seed_;
  std::mt19937_64 rng_;
};

// ---------------------------------------------------------------------------------------------------------------
// Exogenous vectors are fitted to the configured length, and non-finite entries zeroed, before predictors see
// them.
std::vector<double> fit_exo(const std::vector<double>& exo, int num_exo) {
  std::vector<double> out(static_cast<size_t>(num_exo), 0.0);
  for (size_t k = 0; k < out.size() && k < exo.size(); ++k) out[k] = std::isfinite(exo[k]) ? exo[k] : 0.0;
  return out;
}

// Measured speeds of one iteration with implausible outliers clipped to 100 x the median (a worker that
// reports a 1000x speed would otherwise be handed the whole batch).
std::vector<double> clipped_speeds(const IterationReport& report) {
  std::vector<double> speeds(report.workers.size());
  std::vector<double> valid;
  valid.reserve(speeds.size());
  for (size_t i = 0; i < speeds.size(); ++i) {
    speeds[i] = measured_speed(report.workers[i]);
    if (!std::isnan(speeds[i])) valid.push_back(speeds[i]);
  }
  if (valid.size() >= 3) {
    auto mid = valid.begin() + static_cast<std::ptrdiff_t>(valid.size() / 2);
    std::nth_element(valid.begin(), mid, valid.end());
    const double limit = 100.0 * *mid;
    for (double& s : speeds)
      if (s > limit) s = limit;
  }
  return speeds;
}

class LbbspCpuBalancer final : public BalancerBase {
 public:
  LbbspCpuBalancer(const BalancerConfig& cfg, std::string spec)
      : BalancerBase(cfg, true), spec_(std::move(spec)) {
    predictors_.reserve(n());
    for (size_t i = 0; i < n(); ++i)
      predictors_.push_back(
          predictors::make_predictor(spec_, cfg.num_exo, cfg.seed + static_cast<uint64_t>(i)));
    base_speed_.assign(n(), kNaN);
    signal_base_.assign(n(), kNaN);
  }
  std::string name() const override { return "lbbsp-cpu:" + spec_; }
  std::vector<int64_t> initial() override { return equal_split(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    const std::vector<double> speeds = clipped_speeds(report);
    BatchBounds bounds = bounds_for(&report);
    predicted_.resize(n());
    // Each worker's predictor state is independent: large fleets update in parallel (same results for any
    // thread count), prefetching the state two workers ahead (thousands of states do not fit in cache).
    predictors::for_each_worker(n(), [&](size_t i) {
      if (i + 2 < n()) predictors_[i + 2]->prefetch();
      const WorkerReport& w = report.workers[i];
      predictors_[i]->observe(speeds[i], fit_exo(w.exo, cfg_.num_exo));
      if (!std::isnan(speeds[i]) && std::isfinite(w.capacity) && w.capacity > 0)
        base_speed_[i] = speeds[i] / w.capacity;
      if (std::isfinite(base_speed_[i]) && std::isfinite(w.capacity_next) && w.capacity_next > 0)
        predictors_[i]->set_truth(base_speed_[i] * w.capacity_next);  // only the oracle predictor listens
      const bool exo_next_known = static_cast<int>(w.exo_next.size()) == cfg_.num_exo && cfg_.num_exo > 0;
      predicted_[i] =
          predictors_[i]->predict(exo_next_known ? fit_exo(w.exo_next, cfg_.num_exo) : std::vector<double>{});
      // With a capacity signal an idle worker is still tracked: its speed at capacity 1 times the capacity
      // now.
      const double cap = capacity_signal(w.exo);
      if (!std::isnan(speeds[i]) && !std::isnan(cap)) signal_base_[i] = speeds[i] / cap;
      double cap_next = capacity_signal(w.exo_next);
      if (std::isnan(cap_next)) cap_next = cap;
      const bool tracked = std::isfinite(signal_base_[i]) && !std::isnan(cap_next);
      if (std::isnan(speeds[i]) && tracked) predicted_[i] = signal_base_[i] * cap_next;
      if (tracked) bounds.min[i] = std::min(cfg_.min_batch, bounds.max[i]);
    });
    std::vector<int64_t> batch = assign_by_speed(predicted_, cfg_.global_batch, bounds);
    const auto iteration_s = [&] {
      double worst = 0;
      for (size_t i = 0; i < n(); ++i)
        if (batch[i] > 0 && predicted_[i] > 0) worst = std::max(worst, batch[i] / predicted_[i]);
      return worst;
    };
    const auto probed = probe_hopeless(
        report, batch, iteration_s, [&](size_t i) { return 1.0 / signal_base_[i]; }, bounds);
    return probed.empty() ? batch : assign_by_speed(predicted_, cfg_.global_batch, bounds);
  }
  std::vector<double> predicted_speeds() const override { return predicted_; }
  std::string save_state() const override {
    StateWriter w("lbbsp-cpu");
    w.str(spec_);
    w.f64s(predicted_);
    w.f64s(base_speed_);
    w.f64s(signal_base_);
    for (const auto& p : predictors_) w.str(p->save_state());
    return w.text();
  }
  void load_state(const std::string& state) override {
    StateReader r(state, "lbbsp-cpu");
    if (r.str() != spec_) throw std::invalid_argument("lbbsp-cpu: state was saved with another predictor");
    predicted_ = r.f64s();
    base_speed_ = r.f64s();
    signal_base_ = r.f64s();
    if (base_speed_.size() != n() || signal_base_.size() != n())
      throw std::invalid_argument("lbbsp-cpu: state is for another worker count");
    for (auto& p : predictors_) p->load_state(r.str());
  }

 private:
  std::string spec_;
  std::vector<std::unique_ptr<predictors::Predictor>> predictors_;
  std::vector<double> predicted_;
  std::vector<double> base_speed_;   // speed at capacity 1 (ground truth capacity), for the oracle predictor
  std::vector<double> signal_base_;  // speed at capacity 1 by the capacity exo (cfg.capacity_exo)
};

// ---------------------------------------------------------------------------------------------------------------
class OracleBalancer final : public BalancerBase {
 public:
  explicit OracleBalancer(const BalancerConfig& cfg) : BalancerBase(cfg, false) {
    base_speed_.assign(n(), kNaN);
    last_speed_.assign(n(), kNaN);
  }
  std::string name() const override { return "oracle"; }
  std::vector<int64_t> initial() override { return equal_split(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    next_speed_.resize(n());
    bool any_curve = false;
    for (size_t i = 0; i < n(); ++i) {
      const WorkerReport& w = report.workers[i];
      const double s = measured_speed(w);
      if (!std::isnan(s)) {
        last_speed_[i] = s;
        if (std::isfinite(w.capacity) && w.capacity > 0) base_speed_[i] = s / w.capacity;
      }
      const bool know_next =
          std::isfinite(base_speed_[i]) && std::isfinite(w.capacity_next) && w.capacity_next > 0;
      next_speed_[i] = know_next ? base_speed_[i] * w.capacity_next : last_speed_[i];
      any_curve = any_curve || curve_is_set(w.curve_next);
    }
    const BatchBounds bounds = bounds_for(&report);
    if (!any_curve) return assign_by_speed(next_speed_, cfg_.global_batch, bounds);
    std::vector<TimeCurve> curves = curves_from_speeds(next_speed_);
    for (size_t i = 0; i < n(); ++i)
      if (curve_is_set(report.workers[i].curve_next)) curves[i] = report.workers[i].curve_next;
    std::vector<int64_t> batch = assign_by_curve(curves, cfg_.global_batch, bounds);
    for (size_t i = 0; i < n(); ++i) {
      const double t = curves[i].time(static_cast<double>(batch[i]));
      if (curve_is_set(report.workers[i].curve_next))
        next_speed_[i] = batch[i] > 0 && t > 0 ? batch[i] / t : kNaN;
    }
    return batch;
  }
  std::vector<double> predicted_speeds() const override { return next_speed_; }
  std::string save_state() const override {
    StateWriter w("oracle");
    w.f64s(base_speed_);
    w.f64s(last_speed_);
    w.f64s(next_speed_);
    return w.text();
  }
  void load_state(const std::string& state) override {
    StateReader r(state, "oracle");
    base_speed_ = r.f64s();
    last_speed_ = r.f64s();
    next_speed_ = r.f64s();
    if (base_speed_.size() != n() || last_speed_.size() != n())
      throw std::invalid_argument("oracle: state is for another worker count");
  }

 private:
  std::vector<double> base_speed_, last_speed_, next_speed_;
};

// ---------------------------------------------------------------------------------------------------------------
// The paper's GPU algorithm: average compute times over a monitoring window, then move `step` samples from
// the slowest worker to the fastest one with memory to spare. A worker reversing direction halves the step;
// when the step is already 1 the window doubles (noise, not imbalance). Our addition: after 4 moves in a row
// without a reversal the step doubles back towards its initial value, so a new straggler is still chased
// quickly.
class LbbspGpuBalancer final : public BalancerBase {
 public:
  LbbspGpuBalancer(const BalancerConfig& cfg, int64_t window) : BalancerBase(cfg, true), window_(window) {
    initial_step_ = std::max<int64_t>(1, cfg.global_batch / (4 * cfg.workers));
    step_ = initial_step_;
    reset_window();
    direction_.assign(n(), 0);
  }
  std::string name() const override { return "lbbsp-gpu"; }
  std::vector<int64_t> initial() override {
    batch_ = equal_split(bounds_for(nullptr));
    return batch_;
  }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    const BatchBounds bounds = bounds_for(&report);
    if (!within(batch_, bounds))
      batch_ = equal_split(bounds);  // first call without initial(), or caps changed
    for (size_t i = 0; i < n(); ++i) {
      const double t = report.workers[i].compute_s;
      if (!std::isfinite(t) || t < 0) continue;
      time_sum_[i] += t;
      time_count_[i] += 1;
    }
    if (++in_window_ < window_) return batch_;
    decide(bounds);
    reset_window();
    return batch_;
  }
  std::vector<double> predicted_speeds() const override { return speeds_; }
  std::string save_state() const override {
    StateWriter w("lbbsp-gpu");
    for (int64_t v : {window_, step_, initial_step_, in_window_, oscillations_, calm_moves_}) w.i64(v);
    w.i64s(batch_);
    w.f64s(time_sum_);
    w.i64s(time_count_);
    w.i64s(direction_);
    w.f64s(speeds_);
    return w.text();
  }
  void load_state(const std::string& state) override {
    StateReader r(state, "lbbsp-gpu");
    for (int64_t* v : {&window_, &step_, &initial_step_, &in_window_, &oscillations_, &calm_moves_})
      *v = r.i64();
    batch_ = r.i64s();
    time_sum_ = r.f64s();
    time_count_ = r.i64s();
    direction_ = r.i64s();
    speeds_ = r.f64s();
    if (time_sum_.size() != n() || direction_.size() != n())
      throw std::invalid_argument("lbbsp-gpu: state is for another worker count");
  }

 private:
  bool within(const std::vector<int64_t>& b, const BatchBounds& bounds) const {
    if (b.size() != n()) return false;
    int64_t total = 0;
    for (size_t i = 0; i < n(); ++i) {
      if (b[i] < bounds.min[i] || b[i] > bounds.max[i]) return false;
      total += b[i];
    }
    return total == cfg_.global_batch;
  }
  void reset_window() {
    in_window_ = 0;
    time_sum_.assign(n(), 0.0);
    time_count_.assign(n(), 0);
  }
  void decide(const BatchBounds& bounds) {
    speeds_.assign(n(), kNaN);
    size_t slow = n(), fast = n();
    double slow_t = -1.0, fast_t = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n(); ++i) {
      if (time_count_[i] == 0) continue;
      const double t = time_sum_[i] / static_cast<double>(time_count_[i]);
      if (t > 0) speeds_[i] = static_cast<double>(batch_[i]) / t;
      if (batch_[i] > bounds.min[i] && t > slow_t) slow_t = t, slow = i;
    }
    for (size_t i = 0; i < n(); ++i) {
      if (time_count_[i] == 0 || i == slow) continue;
      const double t = time_sum_[i] / static_cast<double>(time_count_[i]);
      if (batch_[i] < bounds.max[i] && t < fast_t) fast_t = t, fast = i;
    }
    if (slow == n() || fast == n() || !(slow_t > fast_t * 1.02)) return;  // balanced within 2 %
    const int64_t move = std::min({step_, batch_[slow] - bounds.min[slow], bounds.max[fast] - batch_[fast]});
    if (move <= 0) return;
    if (direction_[slow] > 0 || direction_[fast] < 0) {  // reversal: it overshot last time
      calm_moves_ = 0;
      if (step_ > 1) {
        step_ = std::max<int64_t>(1, step_ / 2);
      } else if (++oscillations_ >= 2) {
        window_ = std::min<int64_t>(window_ * 2, 64);
        oscillations_ = 0;
      }
    } else if (++calm_moves_ >= 4) {
      step_ = std::min(initial_step_, step_ * 2);
      calm_moves_ = 0;
    }
    batch_[slow] -= move;
    batch_[fast] += move;
    direction_[slow] = -1;
    direction_[fast] = +1;
  }

  int64_t window_, step_ = 1, initial_step_ = 1, in_window_ = 0, oscillations_ = 0, calm_moves_ = 0;
  std::vector<int64_t> batch_;
  std::vector<double> time_sum_;
  std::vector<int64_t> time_count_;
  std::vector<int64_t> direction_;  // +1 received samples at the last move, -1 gave, 0 untouched
  std::vector<double> speeds_;
};

// ---------------------------------------------------------------------------------------------------------------
// Ours: fit each worker's piecewise-linear time(b) from its recent distinct (b, t) points, rescale it to the
// latest observation, and solve for equal finish times with the curve assignment. With a capacity signal
// (cfg.capacity_exo) the points are normalised to capacity 1 (t * capacity) so that load changes do not bend
// the fitted shape; the coming iteration's curve is the shape divided by the capacity known for it (exo_next)
// or the latest one. Such a worker keeps being tracked while idle, so it may be given 0 samples (as the
// oracle would); without the signal every worker keeps at least one sample to stay measured.
class LbbspGpuModelBalancer final : public BalancerBase {
 public:
  static constexpr size_t kPoints = 6;  // distinct recent batch sizes kept per worker

  explicit LbbspGpuModelBalancer(const BalancerConfig& cfg) : BalancerBase(cfg, true) {
    points_.assign(n(), {});
    shapes_.assign(n(), TimeCurve{kNaN, kNaN, kNaN});
    last_capacity_.assign(n(), kNaN);
  }
  std::string name() const override { return "lbbsp-gpu-model"; }
  std::vector<int64_t> initial() override { return equal_split(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    std::vector<TimeCurve> curves(n());
    BatchBounds bounds = bounds_for(&report);
    for (size_t i = 0; i < n(); ++i) {
      const WorkerReport& w = report.workers[i];
      const double cap = capacity_signal(w.exo);
      if (!std::isnan(cap)) last_capacity_[i] = cap;
      if (!std::isnan(measured_speed(w)))
        update_shape(i, w, std::isnan(last_capacity_[i]) ? 1.0 : last_capacity_[i]);
      double cap_next = capacity_signal(w.exo_next);
      if (std::isnan(cap_next)) cap_next = std::isnan(last_capacity_[i]) ? 1.0 : last_capacity_[i];
      const TimeCurve& s = shapes_[i];
      curves[i] = TimeCurve{s.floor_s / cap_next, s.sat_batch, s.slope_s_per_sample / cap_next};
      const bool tracked =
          cfg_.capacity_exo >= 0 && std::isfinite(s.floor_s) && !std::isnan(last_capacity_[i]);
      if (tracked) bounds.min[i] = std::min(cfg_.min_batch, bounds.max[i]);
    }
    std::vector<int64_t> batch = assign_by_curve(curves, cfg_.global_batch, bounds);
    const auto iteration_s = [&] {
      double worst = 0;
      for (size_t i = 0; i < n(); ++i) worst = std::max(worst, curves[i].time(static_cast<double>(batch[i])));
      return worst;
    };
    const auto probed = probe_hopeless(
        report, batch, iteration_s, [&](size_t i) { return shapes_[i].time(1.0); }, bounds);
    // A probed worker's old points describe a cost that may have gone: its curve restarts from the probe.
    for (size_t i : probed) points_[i].clear();
    if (!probed.empty()) batch = assign_by_curve(curves, cfg_.global_batch, bounds);
    speeds_.resize(n());
    for (size_t i = 0; i < n(); ++i) {
      const double t = curves[i].time(static_cast<double>(batch[i]));
      speeds_[i] = batch[i] > 0 && t > 0 && std::isfinite(t) ? batch[i] / t : kNaN;
    }
    return batch;
  }
  std::vector<double> predicted_speeds() const override { return speeds_; }
  std::string save_state() const override {
    StateWriter w("lbbsp-gpu-model");
    w.f64s(speeds_);
    w.f64s(last_capacity_);
    for (size_t i = 0; i < n(); ++i) {
      w.f64s({shapes_[i].floor_s, shapes_[i].sat_batch, shapes_[i].slope_s_per_sample});
      std::vector<double> flat;
      for (const auto& p : points_[i]) flat.insert(flat.end(), {p.batch, p.time_s});
      w.f64s(flat);
    }
    return w.text();
  }
  void load_state(const std::string& state) override {
    StateReader r(state, "lbbsp-gpu-model");
    speeds_ = r.f64s();
    last_capacity_ = r.f64s();
    if (last_capacity_.size() != n())
      throw std::invalid_argument("lbbsp-gpu-model: state is for another worker count");
    for (size_t i = 0; i < n(); ++i) {
      const std::vector<double> c = r.f64s();
      if (c.size() != 3) throw std::invalid_argument("lbbsp-gpu-model: bad curve in state");
      shapes_[i] = TimeCurve{c[0], c[1], c[2]};
      const std::vector<double> flat = r.f64s();
      points_[i].clear();
      for (size_t k = 0; k + 1 < flat.size(); k += 2) points_[i].push_back({flat[k], flat[k + 1]});
    }
  }

 private:
  void update_shape(size_t i, const WorkerReport& w, double capacity) {
    auto& pts = points_[i];
    const double b = static_cast<double>(w.batch), t = w.compute_s * capacity;
    std::erase_if(pts, [b](const BatchTimePoint& p) { return p.batch == b; });
    pts.push_back({b, t});
    if (pts.size() > kPoints) pts.erase(pts.begin());
    TimeCurve c = fit_time_curve(pts);
    const double fitted = c.time(b);
    if (fitted > 0 && std::isfinite(fitted)) {  // anchor the shape at the latest observation
      c.floor_s *= t / fitted;
      c.slope_s_per_sample *= t / fitted;
    }
    shapes_[i] = c;
  }

  std::vector<std::vector<BatchTimePoint>> points_;  // (batch, time x capacity), newest last
  std::vector<TimeCurve> shapes_;                    // time at capacity 1 (or as measured without the signal)
  std::vector<double> last_capacity_;
  std::vector<double> speeds_;
};

}  // namespace

std::unique_ptr<Balancer> make_balancer(const BalancerConfig& cfg) {
  if (cfg.workers < 1)
    throw std::invalid_argument("balancer: workers must be >= 1, got " + std::to_string(cfg.workers));
  if (cfg.global_batch < 0) throw std::invalid_argument("balancer: global batch must be >= 0");
  if (cfg.min_batch < 0) throw std::invalid_argument("balancer: min batch must be >= 0");
  if (cfg.min_batch > 0 && cfg.min_batch > cfg.global_batch / cfg.workers)
    throw std::invalid_argument("balancer: min batch " + std::to_string(cfg.min_batch) + " x " +
                                std::to_string(cfg.workers) + " workers exceeds the global batch " +
                                std::to_string(cfg.global_batch));
  if (cfg.num_exo < 0) throw std::invalid_argument("balancer: num_exo must be >= 0");
  if (cfg.capacity_exo >= cfg.num_exo || cfg.capacity_exo < -1)
    throw std::invalid_argument("balancer: capacity_exo " + std::to_string(cfg.capacity_exo) +
                                " is not an exo index (num_exo " + std::to_string(cfg.num_exo) + ")");
  if (!cfg.mem_cap.empty() && cfg.mem_cap.size() != static_cast<size_t>(cfg.workers))
    throw std::invalid_argument("balancer: " + std::to_string(cfg.mem_cap.size()) + " memory caps for " +
                                std::to_string(cfg.workers) + " workers");
  const size_t colon = cfg.name.find(':');
  const std::string base = cfg.name.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : cfg.name.substr(colon + 1);
  const bool has_arg = colon != std::string::npos;
  auto no_arg = [&] {
    if (has_arg)
      throw std::invalid_argument("balancer '" + base + "' takes no argument, got '" + cfg.name + "'");
  };
  if (base == "bsp") return no_arg(), std::make_unique<BspBalancer>(cfg);
  if (base == "oracle") return no_arg(), std::make_unique<OracleBalancer>(cfg);
  if (base == "lbbsp-gpu-model") return no_arg(), std::make_unique<LbbspGpuModelBalancer>(cfg);
  if (base == "static") {
    const int64_t k = has_arg ? parse_int(arg, "static measuring iterations") : 5;
    if (k < 1) throw std::invalid_argument("balancer: static needs >= 1 measuring iteration, got " + arg);
    return std::make_unique<StaticBalancer>(cfg, k);
  }
  if (base == "random") {
    const int64_t seed = has_arg ? parse_int(arg, "random seed") : static_cast<int64_t>(cfg.seed);
    return std::make_unique<RandomBalancer>(cfg, static_cast<uint64_t>(seed));
  }
  if (base == "lbbsp-cpu") {
    const std::string spec = has_arg ? arg : cfg.predictor;
    if (spec.empty()) throw std::invalid_argument("balancer: lbbsp-cpu needs a predictor spec");
    return std::make_unique<LbbspCpuBalancer>(cfg, spec);
  }
  if (base == "lbbsp-gpu") {
    const int64_t window = has_arg ? parse_int(arg, "lbbsp-gpu window") : 2;
    if (window < 1) throw std::invalid_argument("balancer: lbbsp-gpu window must be >= 1, got " + arg);
    return std::make_unique<LbbspGpuBalancer>(cfg, window);
  }
  throw std::invalid_argument(
      "unknown balancer '" + cfg.name +
      "' (expected bsp, static[:K], random[:SEED], lbbsp-cpu[:PREDICTOR], lbbsp-gpu[:W], "
      "lbbsp-gpu-model or oracle)");
}

}  // namespace lbbsp::balancer
