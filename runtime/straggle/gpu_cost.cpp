#include "runtime/straggle/gpu_cost.hpp"

#include <limits>
#include <stdexcept>
#include <string>

namespace lbbsp::runtime::straggle {

int64_t GpuCost::mem_cap(int rank) const {
  if (caps_.empty()) return std::numeric_limits<int64_t>::max();
  return caps_[rank % caps_.size()];
}

balancer::TimeCurve GpuCost::curve(int rank, double capacity) const {
  if (curves_.empty()) return {};
  balancer::TimeCurve c = curves_[rank % curves_.size()];
  c.floor_s /= capacity;
  c.slope_s_per_sample /= capacity;
  return c;
}

void GpuCost::check_memory(int rank, int64_t batch) const {
  if (batch <= mem_cap(rank)) return;
  throw std::runtime_error(
      "batch of " + std::to_string(batch) + " samples exceeds the emulated GPU memory cap of " +
      std::to_string(mem_cap(rank)) + " samples (out of memory); the balancer must respect caps");
}

}  // namespace lbbsp::runtime::straggle
