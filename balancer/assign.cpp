#include "balancer/assign.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

namespace lbbsp::balancer {
namespace {

bool finite_non_negative(double x) {
  return std::isfinite(x) && x >= 0.0;
}

struct ResolvedBounds {
  std::vector<int64_t> lo, hi;  // hi already capped at X so sums never overflow
};

ResolvedBounds resolve_bounds(const BatchBounds& bounds, int64_t global_batch, size_t n) {
  if (global_batch < 0)
    throw std::invalid_argument("assign: global batch must be >= 0, got " + std::to_string(global_batch));
  if (!bounds.min.empty() && bounds.min.size() != n)
    throw std::invalid_argument("assign: " + std::to_string(bounds.min.size()) + " min bounds for " +
                                std::to_string(n) + " workers");
  if (!bounds.max.empty() && bounds.max.size() != n)
    throw std::invalid_argument("assign: " + std::to_string(bounds.max.size()) + " max bounds for " +
                                std::to_string(n) + " workers");
  ResolvedBounds r;
  r.lo.assign(n, 0);
  r.hi.assign(n, global_batch);
  int64_t sum_lo = 0, sum_hi = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t lo = bounds.min.empty() ? 0 : bounds.min[i];
    const int64_t hi = bounds.max.empty() ? global_batch : bounds.max[i];
    if (lo < 0)
      throw std::invalid_argument("assign: worker " + std::to_string(i) + " has a negative minimum batch " +
                                  std::to_string(lo));
    if (hi < lo)
      throw std::invalid_argument("assign: worker " + std::to_string(i) + " has min batch " +
                                  std::to_string(lo) + " > max batch " + std::to_string(hi));
    r.lo[i] = lo;
    r.hi[i] = std::min(hi, global_batch);
    if (r.lo[i] > global_batch)
      throw std::invalid_argument("assign: worker " + std::to_string(i) + " min batch " + std::to_string(lo) +
                                  " exceeds the global batch " + std::to_string(global_batch));
    sum_lo += r.lo[i];
    if (sum_lo > global_batch)
      throw std::invalid_argument("assign: minimum batches sum to more than the global batch " +
                                  std::to_string(global_batch));
    sum_hi = std::min(global_batch, sum_hi + std::max(r.hi[i], r.lo[i]));
    r.hi[i] = std::max(r.hi[i], r.lo[i]);
  }
  if (sum_hi < global_batch)
    throw std::invalid_argument("assign: maximum batches (memory caps) sum to less than the global batch " +
                                std::to_string(global_batch));
  return r;
}

// Real-valued relaxation of the total capacity at time T (an upper bound of the integer one up to rounding),
// on flat arrays with the inverse slopes precomputed: this loop is most of the assignment's cost.
struct Relaxation {
  std::vector<double> floor_s, sat, rate, lo, hi;  // rate = 1 / slope (inf when flat forever)
  Relaxation(const std::vector<TimeCurve>& curves, const ResolvedBounds& rb) {
    const size_t n = curves.size();
    floor_s.resize(n), sat.resize(n), rate.resize(n), lo.resize(n), hi.resize(n);
    for (size_t i = 0; i < n; ++i) {
      floor_s[i] = curves[i].floor_s;
      sat[i] = curves[i].sat_batch;
      rate[i] = curves[i].slope_s_per_sample > 0 ? 1.0 / curves[i].slope_s_per_sample
                                                 : std::numeric_limits<double>::infinity();
      lo[i] = static_cast<double>(rb.lo[i]);
      hi[i] = static_cast<double>(rb.hi[i]);
    }
  }
  double total(double T) const {
    double sum = 0.0;
    const size_t n = floor_s.size();
    for (size_t i = 0; i < n; ++i) {
      const double above = T - floor_s[i];
      const double estimate = above < 0 ? 0.0 : std::min(hi[i], sat[i] + above * rate[i]);
      sum += std::clamp(estimate, lo[i], hi[i]);
    }
    return sum;
  }
};

// The curve's inverse at T rounded down to [lo, hi], then stepped down while still slower than T: at or below
// the largest feasible b, never above it (up to floating-point rounding of the inverse).
int64_t capacity_at_or_below(const TimeCurve& c, double T, int64_t lo, int64_t hi) {
  double estimate;
  if (T < c.floor_s)
    estimate = 0.0;
  else if (c.slope_s_per_sample <= 0.0)
    estimate = static_cast<double>(hi);
  else
    estimate = c.sat_batch + (T - c.floor_s) / c.slope_s_per_sample;
  int64_t b =
      estimate >= static_cast<double>(hi) ? hi : std::max(lo, static_cast<int64_t>(std::floor(estimate)));
  while (b > lo && c.time(static_cast<double>(b)) > T) --b;
  return b;
}

// Largest b in [lo, hi] with curve.time(b) <= T (lo when even that is slower), consistent with
// TimeCurve::time (non-decreasing in b): the estimate above, then stepped up past any rounding.
int64_t capacity_at(const TimeCurve& c, double T, int64_t lo, int64_t hi) {
  int64_t b = capacity_at_or_below(c, T, lo, hi);
  while (b < hi && c.time(static_cast<double>(b + 1)) <= T) ++b;
  return b;
}

std::vector<TimeCurve> sanitize_curves(const std::vector<TimeCurve>& curves) {
  double worst_cost = 0.0;  // largest per-sample cost among valid curves
  bool any_valid = false;
  auto valid = [](const TimeCurve& c) {
    return finite_non_negative(c.floor_s) && finite_non_negative(c.sat_batch) &&
           finite_non_negative(c.slope_s_per_sample);
  };
  for (const TimeCurve& c : curves) {
    if (!valid(c)) continue;
    any_valid = true;
    const double ref = std::max(c.sat_batch, 1.0);
    worst_cost = std::max(worst_cost, c.time(ref) / ref);
  }
  const double slow_slope = any_valid && worst_cost > 0.0 ? worst_cost * 1e6 : 1.0;
  std::vector<TimeCurve> out(curves);
  for (TimeCurve& c : out)
    if (!valid(c)) c = TimeCurve{0.0, 0.0, slow_slope};
  return out;
}

std::vector<int64_t> assign_sanitized(const std::vector<TimeCurve>& curves, int64_t global_batch,
                                      const BatchBounds& bounds) {
  const size_t n = curves.size();
  const ResolvedBounds rb = resolve_bounds(bounds, global_batch, n);
  if (n == 0) {
    if (global_batch != 0)
      throw std::invalid_argument("assign: no workers for a global batch of " + std::to_string(global_batch));
    return {};
  }
  std::vector<int64_t> batch(rb.lo);
  int64_t total = 0;
  for (int64_t b : batch) total += b;
  if (total == global_batch) return batch;

  // Workers that cost nothing at T = 0 (zero curves, or a free flat part) may already cover X.
  int64_t total_at_zero = 0;
  for (size_t i = 0; i < n; ++i) total_at_zero += capacity_at(curves[i], 0.0, rb.lo[i], rb.hi[i]);
  if (total_at_zero >= global_batch) {
    for (size_t i = 0; i < n; ++i) batch[i] = capacity_at(curves[i], 0.0, rb.lo[i], rb.hi[i]);
    int64_t surplus = total_at_zero - global_batch;
    for (size_t i = n; i-- > 0 && surplus > 0;) {
      const int64_t take = std::min(surplus, batch[i] - rb.lo[i]);
      batch[i] -= take;
      surplus -= take;
    }
    return batch;
  }

  // Bracket the optimal finish time on the relaxed total, then narrow it by false position (Illinois variant,
  // with a bisection step every third iteration so that jumps of flat curves cannot stall it). The event
  // phase below makes the result exact, so the tolerance only bounds how many events it has to process.
  const Relaxation relax(curves, rb);
  const int64_t share = (global_batch + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
  double hi = 0.0;
  for (const TimeCurve& c : curves) hi = std::max(hi, c.time(static_cast<double>(share)));
  if (!(hi > 0.0)) hi = 1.0;
  const double X = static_cast<double>(global_batch);
  double f_hi = relax.total(hi) - X;
  for (int guard = 0; f_hi < 0; ++guard) {
    if (guard > 2000 || !std::isfinite(hi)) throw std::logic_error("assign: cannot bracket the finish time");
    hi *= 2.0;
    f_hi = relax.total(hi) - X;
  }
  double lo = 0.0, f_lo = relax.total(0.0) - X;
  if (f_lo >= 0) f_lo = -0.5;  // fractional free capacity at T = 0: keep the bracket's sign convention
  int side = 0;
  for (int iter = 0; iter < 200 && hi - lo > 1e-9 * hi; ++iter) {
    double T = iter % 3 == 2 ? 0.5 * (lo + hi) : (lo * f_hi - hi * f_lo) / (f_hi - f_lo);
    if (!(T > lo && T < hi)) T = 0.5 * (lo + hi);
    const double f = relax.total(T) - X;
    if (f < 0) {
      lo = T, f_lo = f;
      if (side == -1) f_hi *= 0.5;
      side = -1;
    } else {
      hi = T, f_hi = f;
      if (side == +1) f_lo *= 0.5;
      side = +1;
    }
  }

  // Start at the integer capacities at T_lo (sum < X, below the optimum only by rounding), then add the
  // missing samples by selection.
  for (int retry = 0;; ++retry) {
    total = 0;
    for (size_t i = 0; i < n; ++i) {
      batch[i] = capacity_at_or_below(curves[i], lo, rb.lo[i], rb.hi[i]);
      total += batch[i];
    }
    if (total < global_batch) break;
    if (lo == 0.0) throw std::logic_error("assign: no start below the optimum");
    lo = retry < 60 ? lo * 0.999 : 0.0;  // rounding put T_lo at the optimum: step back below it
  }
  // The D missing samples are the D cheapest "next samples" over all workers (each worker's sample times only
  // grow). T_D, the D-th smallest time of a worker's first extra sample, bounds the optimum; every worker
  // whose first extra sample finishes by T_D takes all samples it can finish by T_D, and the surplus is
  // handed back from the most expensive samples down, ties resolved against the higher rank (so ties favour
  // low ranks).
  using Unit = std::pair<double, size_t>;  // (finish time, worker)
  std::vector<Unit> first, tops;           // tops: (time of the worker's most expensive added sample, worker)
  std::vector<int64_t> added(n, 0);
  first.reserve(n);
  // More than one round only when some workers have to take several times their first extra sample's worth.
  for (;;) {
    const int64_t missing = global_batch - total;
    first.clear();
    tops.clear();
    for (size_t i = 0; i < n; ++i)
      if (batch[i] < rb.hi[i]) first.emplace_back(curves[i].time(static_cast<double>(batch[i] + 1)), i);
    if (first.empty()) throw std::logic_error("assign: ran out of capacity (bounds were checked)");
    const size_t kth =
        static_cast<size_t>(std::min<int64_t>(missing, static_cast<int64_t>(first.size()))) - 1;
    std::nth_element(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(kth), first.end());
    const double t_d = first[kth].first;
    int64_t surplus = -missing;
    for (const Unit& u : first) {
      if (u.first > t_d) continue;
      const size_t i = u.second;
      added[i] = std::max<int64_t>(1, capacity_at(curves[i], t_d, batch[i], rb.hi[i]) - batch[i]);
      surplus += added[i];
      tops.emplace_back(curves[i].time(static_cast<double>(batch[i] + added[i])), i);
    }
    if (surplus < 0) {  // everything up to T_D is in the optimum: take it and select again
      for (size_t i = 0; i < n; ++i) batch[i] += added[i], total += added[i], added[i] = 0;
      continue;
    }
    std::make_heap(tops.begin(), tops.end());
    while (surplus > 0) {
      std::pop_heap(tops.begin(), tops.end());
      const size_t i = tops.back().second;
      tops.pop_back();
      // Hand back, in one go, this worker's samples that rank above every other worker's most expensive one.
      int64_t keep = 0;
      if (!tops.empty()) {
        const auto [t2, j] = tops.front();
        const double limit = i < j ? t2 : std::nextafter(t2, -std::numeric_limits<double>::infinity());
        keep =
            std::min(added[i] - 1, capacity_at(curves[i], limit, batch[i], batch[i] + added[i]) - batch[i]);
      }
      const int64_t give_back = std::min(surplus, added[i] - keep);
      added[i] -= give_back;
      surplus -= give_back;
      if (added[i] > 0) {
        tops.emplace_back(curves[i].time(static_cast<double>(batch[i] + added[i])), i);
        std::push_heap(tops.begin(), tops.end());
      }
    }
    break;
  }
  for (size_t i = 0; i < n; ++i) batch[i] += added[i];
  return batch;
}

}  // namespace

std::vector<TimeCurve> curves_from_speeds(const std::vector<double>& speeds) {
  double min_valid = std::numeric_limits<double>::infinity();
  for (double s : speeds)
    if (std::isfinite(s) && s > 0.0 && std::isfinite(1.0 / s)) min_valid = std::min(min_valid, s);
  const double slow = std::isfinite(min_valid) ? min_valid * 1e-6 : 1e-6;
  std::vector<TimeCurve> curves(speeds.size());
  for (size_t i = 0; i < speeds.size(); ++i) {
    const double s = speeds[i];
    const bool ok = std::isfinite(s) && s > 0.0 && std::isfinite(1.0 / s);
    curves[i] = TimeCurve{0.0, 0.0, 1.0 / (ok ? s : slow)};
  }
  return curves;
}

std::vector<int64_t> assign_by_speed(const std::vector<double>& speeds, int64_t global_batch,
                                     const BatchBounds& bounds) {
  return assign_sanitized(curves_from_speeds(speeds), global_batch, bounds);
}

std::vector<int64_t> assign_by_curve(const std::vector<TimeCurve>& curves, int64_t global_batch,
                                     const BatchBounds& bounds) {
  return assign_sanitized(sanitize_curves(curves), global_batch, bounds);
}

double slowest_finish_s(const std::vector<TimeCurve>& curves, const std::vector<int64_t>& batch) {
  double worst = 0.0;
  for (size_t i = 0; i < curves.size() && i < batch.size(); ++i)
    worst = std::max(worst, curves[i].time(static_cast<double>(batch[i])));
  return worst;
}

void check_batch(const std::vector<int64_t>& batch, int64_t global_batch, const BatchBounds& bounds,
                 size_t n) {
  if (batch.size() != n)
    throw std::invalid_argument("batch vector has " + std::to_string(batch.size()) + " entries for " +
                                std::to_string(n) + " workers");
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t lo = bounds.min.empty() ? 0 : bounds.min[i];
    const int64_t hi = bounds.max.empty() ? std::numeric_limits<int64_t>::max() : bounds.max[i];
    if (batch[i] < lo || batch[i] > hi)
      throw std::invalid_argument("worker " + std::to_string(i) + " batch " + std::to_string(batch[i]) +
                                  " outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    total += batch[i];
  }
  if (total != global_batch)
    throw std::invalid_argument("batch vector sums to " + std::to_string(total) + ", not " +
                                std::to_string(global_batch));
}

}  // namespace lbbsp::balancer
