// The synthetic clusters the balancer tests drive (test_balancer_*.cpp): workers with a base speed (CPU,
// linear) or a time curve (GPU), scaled by a per-iteration capacity, and a run of equal workers under noise.
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "balancer/balancer.hpp"

namespace lbbsp::balancer::test_cluster {

// Workers with a base speed (CPU, linear) or a time curve (GPU) scaled by a per-iteration capacity.
struct Cluster {
  std::vector<double> base_speed;
  std::vector<TimeCurve> curve;               // empty: CPU profile
  std::vector<std::vector<double>> capacity;  // [iteration][worker]
  std::vector<int64_t> mem_cap;               // empty: unlimited

  size_t n() const { return base_speed.size(); }
  double compute_s(size_t t, size_t i, int64_t b) const {
    const double c = capacity[t][i];
    return curve.empty() ? static_cast<double>(b) / (base_speed[i] * c)
                         : curve[i].time(static_cast<double>(b)) / c;
  }
  TimeCurve true_curve(size_t t, size_t i) const {
    if (curve.empty()) return TimeCurve{0, 0, 1.0 / (base_speed[i] * capacity[t][i])};
    const double c = capacity[t][i];
    return TimeCurve{curve[i].floor_s / c, curve[i].sat_batch, curve[i].slope_s_per_sample / c};
  }
  double iteration_s(size_t t, const std::vector<int64_t>& batch) const {
    double worst = 0;
    for (size_t i = 0; i < n(); ++i) worst = std::max(worst, compute_s(t, i, batch[i]));
    return worst;
  }
  IterationReport report(size_t t, const std::vector<int64_t>& batch) const {
    IterationReport r;
    r.iteration = static_cast<int64_t>(t);
    r.workers.resize(n());
    for (size_t i = 0; i < n(); ++i) {
      WorkerReport& w = r.workers[i];
      w.batch = batch[i];
      w.compute_s = compute_s(t, i, batch[i]);
      w.exo = {capacity[t][i]};
      w.truth.capacity = capacity[t][i];
      w.truth.capacity_next = capacity[t + 1][i];
      if (!mem_cap.empty()) w.mem_cap = mem_cap[i];
      if (!curve.empty()) w.truth.curve_next = true_curve(t + 1, i);
    }
    return r;
  }
};

inline Cluster static_cpu_cluster(size_t n, size_t iterations) {
  Cluster c;
  for (size_t i = 0; i < n; ++i) c.base_speed.push_back(100.0 * (1 + static_cast<double>(i % 4)));  // 1x..4x
  c.capacity.assign(iterations + 1, std::vector<double>(n, 1.0));
  return c;
}

inline Cluster gpu_cluster(size_t n, size_t iterations, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Cluster c;
  for (size_t i = 0; i < n; ++i) {
    const double h = 1 + 2 * u(rng);  // up to 3x faster
    c.base_speed.push_back(h);
    c.curve.push_back(TimeCurve{0.05 / h, 24, 0.004 / h});
    c.mem_cap.push_back(96);
  }
  c.capacity.assign(iterations + 1, std::vector<double>(n, 1.0));
  return c;
}

inline BalancerConfig config(const std::string& name, size_t n, int64_t X) {
  BalancerConfig cfg;
  cfg.name = name;
  cfg.predictor = "ema";
  cfg.workers = static_cast<int>(n);
  cfg.global_batch = X;
  cfg.num_exo = 1;
  cfg.capacity_exo = 0;  // the cluster reports its capacity as exo[0]
  cfg.seed = 7;
  return cfg;
}

// The true iteration times and the batch vectors of a run on cluster `c`, its reports' exo always 1 (as when
// a co-scheduled process takes turns with the rank: only the measured speeds tell).
struct NoisyRun {
  std::vector<double> iteration_s;
  std::vector<std::vector<int64_t>> batch;
};
inline NoisyRun run_on(const Cluster& c, const std::string& name, const std::string& predictor, size_t T) {
  auto cfg = config(name, c.n(), 400);
  cfg.predictor = predictor;
  auto bal = make_balancer(cfg);
  NoisyRun run;
  auto batch = bal->initial();
  for (size_t t = 0; t < T; ++t) {
    run.iteration_s.push_back(c.iteration_s(t, batch));
    run.batch.push_back(batch);
    IterationReport r = c.report(t, batch);
    for (auto& w : r.workers) w.exo = {1.0};
    batch = bal->next(r);
  }
  return run;
}
// 4 equal workers whose measured speed is noisy (log-normal, `noise` SD, i.i.d. per iteration); worker 0 runs
// at `slow` of its speed from iteration `slow_from` on (to `slow_to`). 300 iterations.
inline Cluster noisy_cluster(double noise, double slow, size_t slow_from, size_t slow_to = 1000) {
  const size_t n = 4, T = 300;
  Cluster c = static_cpu_cluster(n, T);
  c.base_speed.assign(n, 100.0);
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> jitter(0.0, noise);
  for (size_t t = 0; t <= T; ++t)
    for (size_t i = 0; i < n; ++i)
      c.capacity[t][i] = jitter(rng) * (i == 0 && t >= slow_from && t < slow_to ? slow : 1.0);
  return c;
}
inline NoisyRun run_noisy(const std::string& name, const std::string& predictor, double noise, double slow,
                          size_t slow_from) {
  return run_on(noisy_cluster(noise, slow, slow_from), name, predictor, 300);
}
inline double mean_of(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t t = from; t < to; ++t) s += v[t];
  return s / static_cast<double>(to - from);
}

}  // namespace lbbsp::balancer::test_cluster
