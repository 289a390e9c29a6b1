// Cost of the batch-size decision on rank 0: the exact assignment and each balancer's next() at 96, 1024 and
// 10,000 workers (global batch 32 per worker). Counter s_per_worker makes the sizes comparable.
#include <benchmark/benchmark.h>

#include <random>

#include "balancer/assign.hpp"
#include "balancer/balancer.hpp"

using namespace lbbsp::balancer;

namespace {

std::vector<double> random_speeds(size_t n) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0.2, 1.0);
  std::vector<double> s(n);
  for (double& x : s) x = 100.0 * u(rng);
  return s;
}

std::vector<TimeCurve> random_curves(size_t n) {
  std::mt19937_64 rng(43);
  std::uniform_real_distribution<double> u(1.0, 3.0);
  std::vector<TimeCurve> c(n);
  for (auto& x : c) {
    const double h = u(rng);
    x = TimeCurve{0.05 * h, 32, 1.5e-3 * h};
  }
  return c;
}

// Seconds per worker (printed with an SI prefix, e.g. 210n = 210 ns per worker).
void per_worker(benchmark::State& state, size_t n) {
  state.counters["s_per_worker"] = benchmark::Counter(
      static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_AssignBySpeed(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto speeds = random_speeds(n);
  for (auto _ : state) benchmark::DoNotOptimize(assign_by_speed(speeds, 32 * static_cast<int64_t>(n)));
  per_worker(state, n);
}

void BM_AssignByCurve(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto curves = random_curves(n);
  const BatchBounds bounds{{}, std::vector<int64_t>(n, 64)};
  for (auto _ : state)
    benchmark::DoNotOptimize(assign_by_curve(curves, 32 * static_cast<int64_t>(n), bounds));
  per_worker(state, n);
}

// One report per call, as rank 0 sees it after the allreduce (capacities vary per worker).
void BM_BalancerNext(benchmark::State& state, const std::string& name, bool gpu) {
  const size_t n = static_cast<size_t>(state.range(0));
  BalancerConfig cfg;
  cfg.name = name;
  cfg.workers = static_cast<int>(n);
  cfg.global_batch = 32 * static_cast<int64_t>(n);
  cfg.num_exo = 1;
  auto bal = make_balancer(cfg);
  std::vector<int64_t> batch = bal->initial();
  const auto speeds = random_speeds(n);
  const auto curves = random_curves(n);
  IterationReport report;
  report.workers.resize(n);
  std::mt19937_64 rng(44);
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  for (auto _ : state) {
    for (size_t i = 0; i < n; ++i) {
      WorkerReport& w = report.workers[i];
      const double cap = jitter(rng);
      w.batch = batch[i];
      w.compute_s = gpu ? curves[i].time(static_cast<double>(batch[i])) / cap
                        : static_cast<double>(batch[i]) / (speeds[i] * cap);
      w.exo.assign(1, cap);
      w.truth.capacity = cap;
      w.truth.capacity_next = cap;
      w.mem_cap = gpu ? 64 : w.mem_cap;
      if (gpu) w.truth.curve_next = curves[i];
    }
    batch = bal->next(report);
    benchmark::DoNotOptimize(batch.data());
  }
  per_worker(state, n);
}

}  // namespace

BENCHMARK(BM_AssignBySpeed)->Arg(96)->Arg(1024)->Arg(10000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AssignByCurve)->Arg(96)->Arg(1024)->Arg(10000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, bsp, std::string("bsp"), false)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, static, std::string("static"), false)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, lbbsp_cpu_last, std::string("lbbsp-cpu:last"), false)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, lbbsp_cpu_ema, std::string("lbbsp-cpu:ema"), false)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, lbbsp_cpu_arima, std::string("lbbsp-cpu:arima"), false)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, lbbsp_cpu_narx, std::string("lbbsp-cpu:narx"), false)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, lbbsp_gpu, std::string("lbbsp-gpu"), true)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, lbbsp_gpu_model, std::string("lbbsp-gpu-model"), true)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, oracle_cpu, std::string("oracle"), false)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_BalancerNext, oracle_gpu, std::string("oracle"), true)
    ->Arg(96)
    ->Arg(1024)
    ->Arg(10000)
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
