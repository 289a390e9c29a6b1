// gpu=FLOOR:SAT:SLOPE:CAP[,...]: a modelled GPU-like cost per rank (cycled), on top of any kind: a slice of b
// samples takes FLOOR + SLOPE*(b-SAT)+ seconds divided by the rank's capacity, and more than CAP samples is
// an out-of-memory error.
#pragma once
#include <cstdint>
#include <vector>

#include "balancer/balancer.hpp"

namespace lbbsp::runtime::straggle {

class GpuCost {
 public:
  GpuCost() = default;
  GpuCost(std::vector<balancer::TimeCurve> curves, std::vector<int64_t> caps)
      : curves_(std::move(curves)), caps_(std::move(caps)) {}

  bool enabled() const { return !curves_.empty(); }
  // Most samples `rank` may hold; no limit without a profile.
  int64_t mem_cap(int rank) const;
  // rank's curve divided by `capacity`; a zero curve without a profile.
  balancer::TimeCurve curve(int rank, double capacity) const;
  // Throws std::runtime_error when batch exceeds rank's cap, as an out-of-memory would.
  void check_memory(int rank, int64_t batch) const;

 private:
  std::vector<balancer::TimeCurve> curves_;
  std::vector<int64_t> caps_;  // one per curve
};

}  // namespace lbbsp::runtime::straggle
