// bsp: the equal split every iteration (the baseline; memory caps respected).
#include <string>
#include <vector>

#include "balancer/balancer_base.hpp"
#include "common/state_io.hpp"

namespace lbbsp::balancer::detail {
namespace {

class BspBalancer final : public BalancerBase {
 public:
  explicit BspBalancer(const BalancerConfig& cfg) : BalancerBase(cfg, false) {}
  std::string name() const override { return "bsp"; }
  std::vector<int64_t> initial() override { return split(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    return split(bounds_for(&report));
  }
  std::string save_state() const override { return StateWriter(StateOf::balancer, "bsp").str(); }
  void load_state(const std::string& state) override { StateReader(StateOf::balancer, state, "bsp"); }

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

}  // namespace

std::unique_ptr<Balancer> make_bsp(const BalancerConfig& cfg) {
  return std::make_unique<BspBalancer>(cfg);
}

}  // namespace lbbsp::balancer::detail
