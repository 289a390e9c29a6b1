// Online fit of a GPU worker's time-vs-batch curve (flat below a saturation batch, linear above it).
#pragma once
#include <vector>

#include "balancer/balancer.hpp"

namespace lbbsp::balancer {

struct BatchTimePoint {
  double batch = 0.0;
  double time_s = 0.0;
};

// Least-squares hinge fit t = floor + slope * max(0, b - sat) with floor, slope >= 0: the knot at 0, at an
// observed batch, or inside a gap between two (flat mean left, line right); ties go to the smaller sat. One
// distinct batch gives the line through the origin (the CPU assumption). A flat fit is extended beyond the
// largest batch with slope floor / b_max, so a worker is never predicted to take unbounded work for free.
// Points with b <= 0 or a bad time are ignored; none left gives the zero curve.
TimeCurve fit_time_curve(const std::vector<BatchTimePoint>& points);

}  // namespace lbbsp::balancer
