// Exact integer batch assignment: split a global batch X over workers so that the slowest predicted finish
// time is as small as possible, within per-worker bounds [min_i, max_i].
#pragma once
#include <cstdint>
#include <vector>

#include "balancer.hpp"  // sibling include: also resolves in the installed include/lbbsp/balancer/

namespace lbbsp::balancer {

// Per-worker bounds; an empty vector means 0 (min) or unlimited (max).
struct BatchBounds {
  std::vector<int64_t> min;
  std::vector<int64_t> max;
};

// Speeds in samples/s: finish time of b samples is b / speed. A speed that is NaN, +-Inf, zero or negative is
// treated as "very slow": it is replaced by 1e-6 x the smallest valid speed (1e-6 when none is valid), so
// such a worker gets its minimum and never a NaN share. Throws std::invalid_argument when the bounds cannot
// hold X (sum of mins > X, sum of maxes < X, a min > its max, a negative bound, X < 0, or size mismatch).
std::vector<int64_t> assign_by_speed(const std::vector<double>& speeds, int64_t global_batch,
                                     const BatchBounds& bounds = {});

// Time-vs-batch curves: finish time of b samples is curves[i].time(b). A curve with a negative or non-finite
// field is replaced by a linear one 1e6 x slower than the slowest valid curve. Same errors as
// assign_by_speed.
std::vector<int64_t> assign_by_curve(const std::vector<TimeCurve>& curves, int64_t global_batch,
                                     const BatchBounds& bounds = {});

// Largest curves[i].time(batch[i]): the predicted finish time of the iteration.
double slowest_finish_s(const std::vector<TimeCurve>& curves, const std::vector<int64_t>& batch);

// The curve "b / speed" used by assign_by_speed (after the same sanitising of bad speeds).
std::vector<TimeCurve> curves_from_speeds(const std::vector<double>& speeds);

// Throws std::invalid_argument unless batch has n entries, sums to X and lies within bounds.
void check_batch(const std::vector<int64_t>& batch, int64_t global_batch, const BatchBounds& bounds,
                 size_t n);

}  // namespace lbbsp::balancer
