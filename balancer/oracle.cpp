// oracle: knows the coming iteration's capacity (and GPU curve) from the emulation; the bound the others are
// measured against.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer_base.hpp"
#include "common/state_io.hpp"

namespace lbbsp::balancer::detail {
namespace {

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
        if (std::isfinite(w.truth.capacity) && w.truth.capacity > 0) base_speed_[i] = s / w.truth.capacity;
      }
      const bool know_next =
          std::isfinite(base_speed_[i]) && std::isfinite(w.truth.capacity_next) && w.truth.capacity_next > 0;
      next_speed_[i] = know_next ? base_speed_[i] * w.truth.capacity_next : last_speed_[i];
      any_curve = any_curve || curve_is_set(w.truth.curve_next);
    }
    const BatchBounds bounds = bounds_for(&report);
    if (!any_curve) return assign_by_speed(next_speed_, cfg_.global_batch, bounds);
    std::vector<TimeCurve> curves = curves_from_speeds(next_speed_);
    for (size_t i = 0; i < n(); ++i)
      if (curve_is_set(report.workers[i].truth.curve_next)) curves[i] = report.workers[i].truth.curve_next;
    std::vector<int64_t> batch = assign_by_curve(curves, cfg_.global_batch, bounds);
    for (size_t i = 0; i < n(); ++i) {
      const double t = curves[i].time(static_cast<double>(batch[i]));
      if (curve_is_set(report.workers[i].truth.curve_next))
        next_speed_[i] = batch[i] > 0 && t > 0 ? batch[i] / t : kNaN;
    }
    return batch;
  }
  std::vector<double> predicted_speeds() const override { return next_speed_; }
  std::string save_state() const override {
    StateWriter w(StateOf::balancer, "oracle");
    w.put_vector(base_speed_);
    w.put_vector(last_speed_);
    w.put_vector(next_speed_);
    return w.str();
  }
  void load_state(const std::string& state) override {
    StateReader r(StateOf::balancer, state, "oracle");
    base_speed_ = r.get_vector<double>();
    last_speed_ = r.get_vector<double>();
    next_speed_ = r.get_vector<double>();
    if (base_speed_.size() != n() || last_speed_.size() != n())
      throw std::invalid_argument("oracle: state is for another worker count");
  }

 private:
  std::vector<double> base_speed_, last_speed_, next_speed_;
};

}  // namespace

std::unique_ptr<Balancer> make_oracle(const BalancerConfig& cfg) {
  return std::make_unique<OracleBalancer>(cfg);
}

}  // namespace lbbsp::balancer::detail
