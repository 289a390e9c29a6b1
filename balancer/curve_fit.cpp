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
  std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.batch < b.batch; });
  const double b_min = pts.front().batch, b_max = pts.back().batch;
  double mean_t = 0.0;
  for (const auto& p : pts) mean_t += p.time_s;
  mean_t /= static_cast<double>(pts.size());
  // One distinct batch: nothing tells flat from linear, assume the line through the origin.
  if (b_max == b_min) return TimeCurve{0.0, 0.0, mean_t / b_max};

  TimeCurve best{};
  double best_sse = std::numeric_limits<double>::infinity();
  auto consider = [&](const TimeCurve& c) {
    if (!(c.floor_s >= 0) || !(c.slope_s_per_sample >= 0) || !std::isfinite(c.floor_s + c.slope_s_per_sample))
      return;
    double sse = 0.0;
    for (const auto& p : pts) sse += (p.time_s - c.time(p.batch)) * (p.time_s - c.time(p.batch));
    if (sse < best_sse * (1.0 - 1e-9) - 1e-30)
      best_sse = sse, best = c;  // ties keep the earlier (smaller) sat
  };
  std::vector<double> sats{0.0};
  for (const auto& p : pts) sats.push_back(p.batch);
  sats.erase(std::unique(sats.begin(), sats.end()), sats.end());
  // (a) Knot at 0 or at an observed batch: linear least squares in (floor, slope) with x = max(0, b - sat).
  for (double sat : sats) {
    if (sat >= b_max) break;
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& p : pts) {
      const double x = std::max(0.0, p.batch - sat);
      n += 1, sx += x, sy += p.time_s, sxx += x * x, sxy += x * p.time_s;
    }
    const double det = n * sxx - sx * sx;
    if (!(det > 0)) continue;
    const double slope = (n * sxy - sx * sy) / det;
    consider(TimeCurve{(sy - slope * sx) / n, sat, slope});
  }
  // (b) Knot inside the gap after an observed batch: flat mean on the left, a line on the right, meeting
  // there.
  for (size_t k = 1; k + 1 < sats.size(); ++k) {
    double nl = 0, yl = 0, n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& p : pts) {
      if (p.batch <= sats[k]) {
        nl += 1, yl += p.time_s;
      } else {
        n += 1, sx += p.batch, sy += p.time_s, sxx += p.batch * p.batch, sxy += p.batch * p.time_s;
      }
    }
    const double det = n * sxx - sx * sx;
    if (nl == 0 || !(det > 0)) continue;  // the line needs two distinct batches
    const double slope = (n * sxy - sx * sy) / det, intercept = (sy - slope * sx) / n, floor_s = yl / nl;
    if (!(slope > 0)) continue;
    const double sat = (floor_s - intercept) / slope;
    if (sat >= sats[k] && sat <= sats[k + 1]) consider(TimeCurve{floor_s, sat, slope});
  }
  // (c) All flat up to the largest batch, then conservatively linear.
  consider(TimeCurve{mean_t, b_max, mean_t / b_max});
  // A flat fit says nothing beyond the data: never extrapolate free work.
  if (best.slope_s_per_sample * b_max <= 1e-6 * best.floor_s)
    best = TimeCurve{best.floor_s, b_max, best.floor_s / b_max};
  return best;
}

}  // namespace lbbsp::balancer
