// Cost of the speed predictors: predict + observe per worker per iteration for each kind, and the NARX update
// for a whole fleet (96 and 4096 workers, total per iteration, single thread) as rank 0 runs it.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <vector>

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

void BM_NarxFleet(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  std::vector<std::unique_ptr<lbbsp::predictors::Predictor>> fleet;
  for (int w = 0; w < workers; ++w) fleet.push_back(make_predictor("narx", kExo, w));
  Feed feed;
  int64_t t = 0;
  for (; t < kWarmup; ++t)
    for (int w = 0; w < workers; ++w) fleet[w]->observe(feed.speed(t, w), feed.exo(t, w));
  for (auto _ : state) {  // one training iteration: every worker's update, then every worker's forecast
    for (int w = 0; w < workers; ++w) fleet[w]->observe(feed.speed(t, w), feed.exo(t, w));
    for (int w = 0; w < workers; ++w) benchmark::DoNotOptimize(fleet[w]->predict(feed.exo(t + 1, w)));
    ++t;
  }
  state.counters["per_worker_us"] =
      benchmark::Counter(static_cast<double>(workers),
                         benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_NarxFleet)->Arg(96)->Arg(4096)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
