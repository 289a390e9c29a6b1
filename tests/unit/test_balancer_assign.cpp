// Property tests of the exact integer assignment against brute force and an optimality certificate.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "balancer/assign.hpp"

using lbbsp::balancer::assign_by_curve;
using lbbsp::balancer::assign_by_speed;
using lbbsp::balancer::BatchBounds;
using lbbsp::balancer::check_batch;
using lbbsp::balancer::curves_from_speeds;
using lbbsp::balancer::slowest_finish_s;
using lbbsp::balancer::TimeCurve;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Smallest achievable slowest finish time by enumerating every composition of X within the bounds.
double brute_force_best(const std::vector<TimeCurve>& curves, int64_t X, const BatchBounds& bounds) {
  const size_t n = curves.size();
  std::vector<int64_t> b(n, 0);
  double best = kInf;
  std::function<void(size_t, int64_t, double)> rec = [&](size_t i, int64_t left, double worst) {
    if (worst >= best) return;
    if (i + 1 == n) {
      if (left < bounds.min[i] || left > bounds.max[i]) return;
      best = std::min(best, std::max(worst, curves[i].time(static_cast<double>(left))));
      return;
    }
    for (int64_t v = bounds.min[i]; v <= std::min(bounds.max[i], left); ++v)
      rec(i + 1, left - v, std::max(worst, curves[i].time(static_cast<double>(v))));
  };
  rec(0, X, 0.0);
  return best;
}

// T = slowest finish among workers above their minimum (workers held at a slow minimum cannot do better).
// No allocation can do better when the capacities strictly below T (minimums counted in full) sum to less
// than X.
void expect_certified_optimal(const std::vector<TimeCurve>& curves, const std::vector<int64_t>& batch,
                              int64_t X, const BatchBounds& bounds) {
  double T = 0.0;
  for (size_t i = 0; i < curves.size(); ++i)
    if (batch[i] > (bounds.min.empty() ? 0 : bounds.min[i]))
      T = std::max(T, curves[i].time(static_cast<double>(batch[i])));
  if (T == 0.0) return;  // everyone at the minimum, or free
  int64_t strictly_below = 0;
  for (size_t i = 0; i < curves.size(); ++i) {
    const int64_t lo = bounds.min.empty() ? 0 : bounds.min[i];
    const int64_t hi = std::min(bounds.max.empty() ? X : bounds.max[i], X);
    if (curves[i].time(static_cast<double>(lo)) >= T) {  // held at its minimum
      strictly_below += lo;
      continue;
    }
    int64_t b = lo;
    // Largest b with time(b) < T: galloping then bisection keeps this fast for big N.
    int64_t step = 1;
    while (b + step <= hi && curves[i].time(static_cast<double>(b + step)) < T) b += step, step *= 2;
    for (; step > 0; step /= 2)
      if (b + step <= hi && curves[i].time(static_cast<double>(b + step)) < T) b += step;
    strictly_below += b;
  }
  EXPECT_LT(strictly_below, X) << "a better assignment exists (slowest finish " << T << ")";
}

std::vector<double> random_speeds(std::mt19937_64& rng, size_t n, bool allow_bad) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> s(n);
  for (auto& x : s) {
    x = std::pow(10.0, -3.0 + 6.0 * u(rng));  // ratios up to 1e6:1
    if (allow_bad && u(rng) < 0.15) {
      const double bad[] = {0.0, kNaN, kInf, -kInf, -3.0, 1e-320};
      x = bad[rng() % 6];
    }
  }
  return s;
}

BatchBounds random_bounds(std::mt19937_64& rng, size_t n, int64_t X) {
  BatchBounds b;
  for (size_t i = 0; i < n; ++i) {
    const int64_t lo = rng() % 4 == 0 ? static_cast<int64_t>(rng() % 3) : 0;
    const int64_t hi = rng() % 3 == 0 ? lo + static_cast<int64_t>(rng() % (X + 1)) : X + 5;
    b.min.push_back(lo);
    b.max.push_back(hi);
  }
  return b;
}

bool feasible(const BatchBounds& b, int64_t X) {
  int64_t lo = 0, hi = 0;
  for (size_t i = 0; i < b.min.size(); ++i) lo += b.min[i], hi += std::min(b.max[i], X);
  return lo <= X && hi >= X;
}

}  // namespace

TEST(Assign, SpeedsMatchBruteForceOnSmallCases) {
  std::mt19937_64 rng(1);
  int checked = 0, infeasible = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t n = 1 + rng() % 4;
    const int64_t X = static_cast<int64_t>(rng() % 13);
    const auto speeds = random_speeds(rng, n, true);
    const BatchBounds bounds = random_bounds(rng, n, X);
    if (!feasible(bounds, X)) {
      EXPECT_THROW(assign_by_speed(speeds, X, bounds), std::invalid_argument);
      ++infeasible;
      continue;
    }
    const auto batch = assign_by_speed(speeds, X, bounds);
    ASSERT_NO_THROW(check_batch(batch, X, bounds, n));
    const auto curves = curves_from_speeds(speeds);
    const double best = brute_force_best(curves, X, bounds);
    EXPECT_LE(slowest_finish_s(curves, batch), best * (1 + 1e-12)) << "trial " << trial;
    ++checked;
  }
  EXPECT_GT(checked, 1500);
  EXPECT_GT(infeasible, 50);
}

TEST(Assign, CurvesMatchBruteForceOnSmallCases) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t n = 1 + rng() % 4;
    const int64_t X = static_cast<int64_t>(rng() % 13);
    std::vector<TimeCurve> curves(n);
    for (auto& c : curves) {
      c.floor_s = u(rng) < 0.2 ? 0.0 : u(rng);
      c.sat_batch = std::floor(u(rng) * 6) + (u(rng) < 0.3 ? 0.5 : 0.0);
      c.slope_s_per_sample = u(rng) < 0.1 ? 0.0 : std::pow(10.0, -2 + 3 * u(rng));
    }
    const BatchBounds bounds = random_bounds(rng, n, X);
    if (!feasible(bounds, X)) continue;
    const auto batch = assign_by_curve(curves, X, bounds);
    ASSERT_NO_THROW(check_batch(batch, X, bounds, n));
    EXPECT_LE(slowest_finish_s(curves, batch), brute_force_best(curves, X, bounds) * (1 + 1e-12) + 1e-15)
        << "trial " << trial;
  }
}

TEST(Assign, EqualSpeedsGiveEqualSplitWithRemainderToFirstRanks) {
  EXPECT_EQ(assign_by_speed({1, 1, 1, 1}, 10), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(assign_by_speed({2, 2, 2}, 3), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(assign_by_speed({5, 5, 5}, 2), (std::vector<int64_t>{1, 1, 0}));
}

TEST(Assign, ZeroGlobalBatchAndNoWorkers) {
  EXPECT_EQ(assign_by_speed({1, kNaN, 3}, 0), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_TRUE(assign_by_speed({}, 0).empty());
  EXPECT_THROW(assign_by_speed({}, 5), std::invalid_argument);
  EXPECT_THROW(assign_by_speed({1, 1}, -1), std::invalid_argument);
}

TEST(Assign, InfeasibleBoundsThrowWithAClearMessage) {
  try {
    assign_by_speed({1, 1}, 10, BatchBounds{{6, 6}, {}});
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("minimum"), std::string::npos) << e.what();
  }
  try {
    assign_by_speed({1, 1}, 10, BatchBounds{{}, {4, 5}});
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("memory caps"), std::string::npos) << e.what();
  }
  EXPECT_THROW(assign_by_speed({1, 1}, 10, BatchBounds{{3, 0}, {2, 10}}), std::invalid_argument);
  EXPECT_THROW(assign_by_speed({1, 1}, 10, BatchBounds{{-1, 0}, {}}), std::invalid_argument);
  EXPECT_THROW(assign_by_speed({1, 1}, 10, BatchBounds{{0}, {}}), std::invalid_argument);
}

TEST(Assign, BadSpeedsGetTheirMinimumAndNeverNaN) {
  const auto b = assign_by_speed({kNaN, 2.0, 0.0, -1.0, kInf, 1.0}, 30, BatchBounds{{1, 0, 2, 0, 0, 0}, {}});
  EXPECT_EQ(b, (std::vector<int64_t>{1, 18, 2, 0, 0, 9}));
  // All speeds bad: all equally slow, so an equal split.
  EXPECT_EQ(assign_by_speed({kNaN, kNaN, 0.0}, 7), (std::vector<int64_t>{3, 2, 2}));
}

TEST(Assign, ExtremeRatioAndCaps) {
  const auto b = assign_by_speed({1e6, 1.0}, 1000);
  EXPECT_EQ(b, (std::vector<int64_t>{1000, 0}));
  // The fast worker is capped: the rest must go to the slow one.
  const auto c = assign_by_speed({1e6, 1.0, 1.0}, 1000, BatchBounds{{}, {400, 1000, 1000}});
  EXPECT_EQ(c, (std::vector<int64_t>{400, 300, 300}));
  // Unlimited caps (int64 max) do not overflow.
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(assign_by_speed({1, 3}, 8, BatchBounds{{}, {big, big}}), (std::vector<int64_t>{2, 6}));
}

TEST(Assign, GpuCurvesFillTheFlatPartFirst) {
  // Worker 0 saturates at 32 samples (0.1 s), worker 1 is a linear CPU-like worker (0.01 s/sample).
  std::vector<TimeCurve> curves{{0.1, 32, 0.01}, {0.0, 0, 0.01}};
  const auto b = assign_by_curve(curves, 40, {});
  EXPECT_NEAR(slowest_finish_s(curves, b), 0.1, 1e-12);  // worker 1 alone would need 0.4 s
  EXPECT_GE(b[0], 30);
  // Zero-cost workers (unknown curve) take everything they are allowed.
  EXPECT_EQ(assign_by_curve({{0, 0, 0}, {0.5, 0, 1}}, 5, BatchBounds{{}, {3, 10}}),
            (std::vector<int64_t>{3, 2}));
  // A NaN curve is treated as very slow.
  EXPECT_EQ(assign_by_curve({{kNaN, 1, 1}, {0.1, 4, 0.01}}, 9, {}), (std::vector<int64_t>{0, 9}));
}

TEST(Assign, LargeRandomInstancesAreCertifiedOptimal) {
  std::mt19937_64 rng(3);
  for (size_t n : {97u, 1000u, 10000u}) {
    for (int64_t X :
         {int64_t{5}, static_cast<int64_t>(n) - 1, static_cast<int64_t>(32 * n), int64_t{12345677}}) {
      const auto speeds = random_speeds(rng, n, true);
      BatchBounds bounds;
      for (size_t i = 0; i < n; ++i) {
        bounds.min.push_back(X >= static_cast<int64_t>(n) && rng() % 10 == 0 ? 1 : 0);
        bounds.max.push_back(rng() % 5 == 0 ? X / static_cast<int64_t>(n) + 2 : X);
      }
      const auto batch = assign_by_speed(speeds, X, bounds);
      ASSERT_NO_THROW(check_batch(batch, X, bounds, n));
      expect_certified_optimal(curves_from_speeds(speeds), batch, X, bounds);
    }
  }
}

TEST(Assign, LargeCurveInstancesAreCertifiedOptimal) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(0, 1);
  const size_t n = 5000;
  std::vector<TimeCurve> curves(n);
  for (auto& c : curves) c = {0.05 + u(rng), std::floor(64 * u(rng)), 1e-3 * (0.5 + u(rng))};
  BatchBounds bounds{std::vector<int64_t>(n, 1), std::vector<int64_t>(n, 200)};
  for (int64_t X : {int64_t{5000}, int64_t{100000}, int64_t{999999}}) {
    const auto batch = assign_by_curve(curves, X, bounds);
    ASSERT_NO_THROW(check_batch(batch, X, bounds, n));
    expect_certified_optimal(curves, batch, X, bounds);
  }
}
