// Cost of the speed predictors: predict + observe per worker per iteration for each kind, and the NARX update
// for a whole fleet (96 and 4096 workers, total per iteration) as rank 0 runs it: BM_NarxFleet on one thread
// (CPU time), BM_NarxFleetThreads through predictors::for_each_worker as LbbspCpuBalancer::next runs it
// (wall time; threads = 1 and all of omp_get_max_threads()). The targets: < 1 ms for 96 workers,
// < 20 ms for 4096.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <memory>
#include <vector>

#include "predictors/fleet.hpp"
#include "predictors/predictor.hpp"

using lbbsp::predictors::make_predictor;

namespace {

const char* const kSpecs[] = {"last", "ema", "arima", "narx", "oracle"};
constexpr int kExo = 3;  // cpu_avail, mem_avail, load: what the trainer reports

// A deterministic speed trace with a periodic slowdown and exogenous inputs that explain it.
struct Feed {
  double speed(int64_t t, int w) const { return 100.0 * (1.0 - 0.3 * load(t, w)) + std::sin(0.1 * t + w); }
  double load(int64_t t, int w) const { return ((t + w) % 17) < 3 ? 1.0 : 0.0; }
  std::vector<double> exo(int64_t t, int w) const { return {1.0 - 0.3 * load(t, w), 0.8, load(t, w)}; }
};

// Warm-up so the sliding windows are full (steady-state cost, not the cheap first steps).
constexpr int kWarmup = 300;

void BM_PredictObserve(benchmark::State& state) {
  const char* spec = kSpecs[state.range(0)];
  state.SetLabel(spec);
  auto p = make_predictor(spec, kExo, 1);
  Feed feed;
  int64_t t = 0;
  for (; t < kWarmup; ++t) p->observe(feed.speed(t, 0), feed.exo(t, 0));
  for (auto _ : state) {
    auto exo = feed.exo(t, 0);
    p->set_truth(feed.speed(t, 0));
    benchmark::DoNotOptimize(p->predict(exo));
    p->observe(feed.speed(t, 0), exo);
    ++t;
  }
}
BENCHMARK(BM_PredictObserve)->DenseRange(0, 4)->Unit(benchmark::kMicrosecond);

using Fleet = std::vector<std::unique_ptr<lbbsp::predictors::Predictor>>;

Fleet warm_fleet(int workers, const Feed& feed) {
  Fleet fleet;
  for (int w = 0; w < workers; ++w) fleet.push_back(make_predictor("narx", kExo, w));
  for (int64_t t = 0; t < kWarmup; ++t)
    for (int w = 0; w < workers; ++w) fleet[w]->observe(feed.speed(t, w), feed.exo(t, w));
  return fleet;
}

void per_worker_us(benchmark::State& state, int workers) {
  state.counters["per_worker_us"] =
      benchmark::Counter(static_cast<double>(workers),
                         benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// One training iteration on one thread: every worker's update and forecast, prefetching two workers ahead.
void BM_NarxFleet(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  Feed feed;
  Fleet fleet = warm_fleet(workers, feed);
  int64_t t = kWarmup;
  for (auto _ : state) {
    for (int w = 0; w < workers; ++w) {
      if (w + 2 < workers) fleet[w + 2]->prefetch();
      fleet[w]->observe(feed.speed(t, w), feed.exo(t, w));
      benchmark::DoNotOptimize(fleet[w]->predict(feed.exo(t + 1, w)));
    }
    ++t;
  }
  per_worker_us(state, workers);
}
BENCHMARK(BM_NarxFleet)->Arg(96)->Arg(4096)->Unit(benchmark::kMillisecond);

// The same through for_each_worker (parallel from kParallelWorkers workers on), with range(1) threads
// (0: omp_get_max_threads()); wall time, since the point is the iteration's latency.
void BM_NarxFleetThreads(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const int threads = state.range(1) > 0 ? static_cast<int>(state.range(1)) : omp_get_max_threads();
  state.SetLabel(std::to_string(threads) + " thread(s)");
  Feed feed;
  Fleet fleet = warm_fleet(workers, feed);
  std::vector<double> predicted(workers);
  int64_t t = kWarmup;
  for (auto _ : state) {
    lbbsp::predictors::for_each_worker(
        static_cast<size_t>(workers),
        [&](size_t i) {
          const int w = static_cast<int>(i);
          if (w + 2 < workers) fleet[w + 2]->prefetch();
          fleet[w]->observe(feed.speed(t, w), feed.exo(t, w));
          predicted[i] = fleet[w]->predict(feed.exo(t + 1, w));
        },
        threads);
    benchmark::DoNotOptimize(predicted.data());
    ++t;
  }
  per_worker_us(state, workers);
}
BENCHMARK(BM_NarxFleetThreads)
    ->Args({96, 1})
    ->Args({4096, 1})
    ->Args({4096, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
