// The paper's GPU algorithm: average compute times over a monitoring window, then move `step` samples from
// the slowest worker to the fastest one with memory to spare. A worker reversing direction halves the step;
// when the step is already 1 the window doubles (noise, not imbalance). Our addition: after 4 moves in a row
// without a reversal the step doubles back towards its initial value, so a new straggler is still chased
// quickly.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer_base.hpp"
#include "common/state_io.hpp"

namespace lbbsp::balancer::detail {
namespace {

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
    StateWriter w(StateOf::balancer, "lbbsp-gpu");
    for (int64_t v : {window_, step_, initial_step_, in_window_, oscillations_, calm_moves_}) w.put(v);
    w.put_vector(batch_);
    w.put_vector(time_sum_);
    w.put_vector(time_count_);
    w.put_vector(direction_);
    w.put_vector(speeds_);
    return w.str();
  }
  void load_state(const std::string& state) override {
    StateReader r(StateOf::balancer, state, "lbbsp-gpu");
    for (int64_t* v : {&window_, &step_, &initial_step_, &in_window_, &oscillations_, &calm_moves_})
      *v = r.get<int64_t>();
    batch_ = r.get_vector<int64_t>();
    time_sum_ = r.get_vector<double>();
    time_count_ = r.get_vector<int64_t>();
    direction_ = r.get_vector<int64_t>();
    speeds_ = r.get_vector<double>();
    if (time_sum_.size() != n() || direction_.size() != n())
      throw std::invalid_argument("lbbsp-gpu: state is for another worker count");
  }

 private:
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

}  // namespace

std::unique_ptr<Balancer> make_lbbsp_gpu(const BalancerConfig& cfg, int64_t window) {
  return std::make_unique<LbbspGpuBalancer>(cfg, window);
}

}  // namespace lbbsp::balancer::detail
