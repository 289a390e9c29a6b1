// static:F0,F1,...: a fixed capacity factor per rank (cycled when fewer than ranks).
#include <vector>

#include "runtime/straggle/emulation.hpp"

namespace lbbsp::runtime::straggle {

namespace {

class StaticFactors final : public Emulation {
 public:
  explicit StaticFactors(std::vector<double> factors) : factors_(std::move(factors)) {}
  bool replay() const override { return true; }
  double replay_capacity(int rank, double /*elapsed_s*/) const override {
    return factors_[rank % factors_.size()];
  }

 private:
  std::vector<double> factors_;  // in (0, 1], checked by the parser
};

}  // namespace

std::unique_ptr<Emulation> make_static(const Config& config) {
  return std::make_unique<StaticFactors>(config.static_factors);
}

}  // namespace lbbsp::runtime::straggle
