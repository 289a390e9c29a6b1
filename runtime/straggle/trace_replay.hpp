// trace:PATH[,PATH...]: each rank replays one capacity series (seeded assignment, cycled when more ranks than
// series) from a seeded or given start step, by steps of scale= seconds or by the trace's own clock (rate=).
#pragma once
#include <string>
#include <vector>

#include "runtime/straggle/spec.hpp"

namespace lbbsp::runtime::straggle {

struct CapacitySeries {
  std::string source;
  std::vector<double> capacity;   // one value per trace step, in [0.05, 1]
  std::vector<double> mem_avail;  // per step, empty when the trace has no memory column
  std::vector<double> time_s;     // per step, seconds from origin_s (the trace's own clock)
  double origin_s = 0;
  double span_s() const { return time_s.empty() ? 0.0 : time_s.back(); }
};

// Every non-empty series in config.trace_paths, in load order. Throws std::invalid_argument naming the file
// (and line) that cannot be read, or the paths when they hold no series.
std::vector<CapacitySeries> load_capacity_series(const Config& config);

}  // namespace lbbsp::runtime::straggle
