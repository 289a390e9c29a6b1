#include "balancer/curve_fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lbbsp::balancer {

TimeCurve fit_time_curve(const std::vector<BatchTimePoint>& points) {
  std::vector<BatchTimePoint> pts;
  pts.reserve(points.size());
  for (const auto& p : points)
    if (std::isfinite(p.batch) && p.batch > 0 && std::isfinite(p.time_s) && p.time_s > 0) pts.push_back(p);
  if (pts.empty()) return {};
  double b_max = 0.0, b_min = std::numeric_limits<double>::infinity();
  for (const auto& p : pts) b_max = std::max(b_max, p.batch), b_min = std::min(b_min, p.batch);
  if (b_max ==
      b_min) {  // one distinct batch: nothing tells flat from linear, assume linear through the origin
    double mean_t = 0.0;
    for (const auto& p : pts) mean_t += p.time_s;
    mean_t /= static_cast<double>(pts.size());
    return TimeCurve{0.0, 0.0, mean_t / b_max};
  }
  std::vector<double> sats{0.0};
  for (const auto& p : pts) sats.push_back(p.batch);
  std::sort(sats.begin(), sats.end());
  sats.erase(std::unique(sats.begin(), sats.end()), sats.end());

  TimeCurve best{};
  double best_sse = std::numeric_limits<double>::infinity();
  for (double sat : sats) {
    // Linear least squares in (floor, slope) with regressor x = max(0, b - sat).
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& p : pts) {
      const double x = std::max(0.0, p.batch - sat);
      n += 1, sx += x, sy += p.time_s, sxx += x * x, sxy += x * p.time_s;
    }
    const double det = n * sxx - sx * sx;
    double floor_s, slope;
    if (det <= 1e-12 * std::max(1.0, n * sxx)) {  // every point at or below sat: flat
      floor_s = sy / n;
      slope = floor_s / b_max;
      if (sat < b_max) continue;  // only the candidate at the largest batch may be all-flat
    } else {
      slope = (n * sxy - sx * sy) / det;
      floor_s = (sy - slope * sx) / n;
      if (slope < 0 || floor_s < 0) continue;
    }
    double sse = 0.0;
    for (const auto& p : pts) {
      const double pred = floor_s + slope * std::max(0.0, p.batch - sat);
      const double e = sat >= b_max ? p.time_s - floor_s : p.time_s - pred;
      sse += e * e;
    }
    if (sse < best_sse * (1.0 - 1e-9) - 1e-30) {
      best_sse = sse;
      best = TimeCurve{floor_s, sat, slope};
    }
  }
  if (!std::isfinite(
          best_sse)) {  // no admissible hinge (e.g. time falls with batch): line through the origin
    double st = 0, sb = 0;
    for (const auto& p : pts) st += p.time_s, sb += p.batch;
    return TimeCurve{0.0, 0.0, st / sb};
  }
  return best;
}

}  // namespace lbbsp::balancer
