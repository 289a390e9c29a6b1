// static[:K]: measures speeds for K iterations (equal split meanwhile), then fixes the split by their means.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer_base.hpp"
#include "common/state_io.hpp"

namespace lbbsp::balancer::detail {
namespace {

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
    StateWriter w(StateOf::balancer, "static");
    w.put(measured_);
    w.put_vector(speed_sum_);
    w.put_vector(speed_count_);
    w.put_vector(fixed_speeds_);
    return w.str();
  }
  void load_state(const std::string& state) override {
    StateReader r(StateOf::balancer, state, "static");
    measured_ = r.get<int64_t>();
    speed_sum_ = r.get_vector<double>();
    speed_count_ = r.get_vector<int64_t>();
    fixed_speeds_ = r.get_vector<double>();
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

}  // namespace

std::unique_ptr<Balancer> make_static(const BalancerConfig& cfg, int64_t measuring_iterations) {
  return std::make_unique<StaticBalancer>(cfg, measuring_iterations);
}

}  // namespace lbbsp::balancer::detail
