// random[:SEED]: a random batch vector every iteration, zero entries allowed (it tests the invariants).
#include <cmath>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer_base.hpp"
#include "common/state_io.hpp"

namespace lbbsp::balancer::detail {
namespace {

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
    StateWriter w(StateOf::balancer, "random");
    w.put_string(os.str());
    return w.str();
  }
  void load_state(const std::string& state) override {
    StateReader r(StateOf::balancer, state, "random");
    std::istringstream is(r.get_string());
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

}  // namespace

std::unique_ptr<Balancer> make_random(const BalancerConfig& cfg, uint64_t seed) {
  return std::make_unique<RandomBalancer>(cfg, seed);
}

}  // namespace lbbsp::balancer::detail
