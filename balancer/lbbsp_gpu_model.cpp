// Ours: fit each worker's piecewise-linear time(b) from its recent distinct (b, t) points, rescale it to the
// latest observation, and solve for equal finish times with the curve assignment. With a capacity signal
// (cfg.capacity_exo) the points are normalised to capacity 1 (t * capacity) so that load changes do not bend
// the fitted shape; the coming iteration's curve is the shape divided by the capacity known for it (exo_next)
// or the latest one. Such a worker keeps being tracked while idle, so it may be given 0 samples (as the
// oracle would); without the signal every worker keeps at least one sample to stay measured.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer_base.hpp"
#include "balancer/curve_fit.hpp"
#include "common/state_io.hpp"

namespace lbbsp::balancer::detail {
namespace {

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
    StateWriter w(StateOf::balancer, "lbbsp-gpu-model");
    w.put_vector(speeds_);
    w.put_vector(last_capacity_);
    for (size_t i = 0; i < n(); ++i) {
      w.put_vector(
          std::vector<double>{shapes_[i].floor_s, shapes_[i].sat_batch, shapes_[i].slope_s_per_sample});
      std::vector<double> flat;
      for (const auto& p : points_[i]) flat.insert(flat.end(), {p.batch, p.time_s});
      w.put_vector(flat);
    }
    return w.str();
  }
  void load_state(const std::string& state) override {
    StateReader r(StateOf::balancer, state, "lbbsp-gpu-model");
    speeds_ = r.get_vector<double>();
    last_capacity_ = r.get_vector<double>();
    if (last_capacity_.size() != n())
      throw std::invalid_argument("lbbsp-gpu-model: state is for another worker count");
    for (size_t i = 0; i < n(); ++i) {
      const std::vector<double> c = r.get_vector<double>();
      if (c.size() != 3) throw std::invalid_argument("lbbsp-gpu-model: bad curve in state");
      shapes_[i] = TimeCurve{c[0], c[1], c[2]};
      const std::vector<double> flat = r.get_vector<double>();
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

std::unique_ptr<Balancer> make_lbbsp_gpu_model(const BalancerConfig& cfg) {
  return std::make_unique<LbbspGpuModelBalancer>(cfg);
}

}  // namespace lbbsp::balancer::detail
