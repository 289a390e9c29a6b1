// A fleet of predictor states updated through for_each_worker (as LbbspCpuBalancer::next does): identical
// results for any thread count, prefetch() changes nothing, exceptions surface; a NARX state written field by
// field in the layout of format narx/4 loads, and one tagged with an unreleased earlier format (narx/1 to
// narx/3) is refused naming both formats and the way out.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "common/state_io.hpp"
#include "predictors/fleet.hpp"
#include "predictors/predictor.hpp"

using lbbsp::StateOf;
using lbbsp::StateWriter;
using lbbsp::predictors::for_each_worker;
using lbbsp::predictors::kParallelWorkers;
using lbbsp::predictors::make_predictor;
using lbbsp::predictors::Predictor;

namespace {

// Worker w's speed: a periodic slowdown announced by its load (exo), plus a little per-worker wobble; every
// 41st step is missing.
double speed(int64_t t, size_t w) {
  if ((t + static_cast<int64_t>(w)) % 41 == 0) return std::nan("");
  return 100.0 * (1.0 - 0.4 * (((t + w) % 13) < 4)) + std::sin(0.3 * static_cast<double>(t) + w);
}
std::vector<double> exo(int64_t t, size_t w) {
  const double load = ((t + w) % 13) < 4 ? 1.0 : 0.0;
  return {1.0 - 0.4 * load, 0.8, load};
}

// Predictions of every worker at every step, with `threads` threads (prefetching ahead if asked).
std::vector<double> run_fleet(size_t workers, int steps, int threads, bool prefetch) {
  std::vector<std::unique_ptr<Predictor>> fleet;
  for (size_t w = 0; w < workers; ++w) fleet.push_back(make_predictor("narx", 3, 7 + w));
  std::vector<double> out(workers * steps);
  for (int t = 0; t < steps; ++t)
    for_each_worker(
        workers,
        [&](size_t w) {
          if (prefetch && w + 2 < workers) fleet[w + 2]->prefetch();
          fleet[w]->observe(speed(t, w), exo(t, w));
          out[t * workers + w] = fleet[w]->predict(exo(t + 1, w));
        },
        threads);
  return out;
}

TEST(PredictorFleet, SameResultsForAnyThreadCountAndWithPrefetch) {
  const size_t workers = kParallelWorkers + 37;  // large enough to run in parallel
  const std::vector<double> one = run_fleet(workers, 60, 1, false);
  for (int threads : {2, 3}) {
    const std::vector<double> many = run_fleet(workers, 60, threads, threads == 3);
    ASSERT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(double)), 0) << threads << " threads";
  }
  for (double p : one) ASSERT_TRUE(std::isfinite(p) && p > 0);
}

TEST(PredictorFleet, EveryWorkerOnceAndTheLowestFailureIsRethrown) {
  const size_t n = 2 * kParallelWorkers;
  for (int threads : {1, 2}) {
    std::vector<int> calls(n, 0);
    for_each_worker(
        n, [&](size_t i) { ++calls[i]; }, threads);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(calls[i], 1) << i;
    try {
      for_each_worker(
          n,
          [&](size_t i) {
            if (i == 700 || i == n - 1) throw std::runtime_error("worker " + std::to_string(i));
          },
          threads);
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "worker 700");
    }
  }
}

// A NARX state in the layout of format narx/4 (the tag `tag`, then its fields).
std::string narx_state(const std::string& tag = "narx/4") {
  const int dy = 2, du = 1, hidden = 3, window = 4, num_exo = 1;
  const int n_in = dy + 3 + (du + 1) * num_exo;
  const int params = hidden * (n_in + 2) + 1;
  StateWriter w(StateOf::predictor, tag);
  w.put(dy);
  w.put(du);
  w.put(hidden);
  w.put(window);
  w.put(0.01);  // lr
  w.put(2);     // epochs
  w.put(3);     // batch
  w.put(4.0);   // sharp
  w.put(0.98);  // forget
  w.put(0.01);  // ridge
  w.put(0);     // ratio input
  w.put(num_exo);
  w.put(uint64_t{12345});
  auto put_net = [&](float offset) {
    std::vector<float> net(params);
    for (int k = 0; k < params; ++k) net[k] = offset + 0.0625f * static_cast<float>((k * 7) % 11 - 5);
    w.put_vector(net);
  };
  put_net(0);
  put_net(0.5f);  // Adam m
  put_net(1);     // Adam v (positive)
  const int64_t steps = 17;
  w.put(steps);
  w.put(std::pow(0.9, static_cast<double>(steps)));
  w.put(std::pow(0.999, static_cast<double>(steps)));
  w.put(int64_t{9});  // good observations
  w.put(100.0);       // y mean
  w.put(25.0);        // y var
  w.put(98.0);        // last
  w.put(std::array<double, 3>{99, 100, 101});
  w.put_vector(std::vector<double>{0.5});      // exo mean
  w.put_vector(std::vector<double>{0.04});     // exo var
  w.put_vector(std::vector<int64_t>{9});       // exo count
  w.put_vector(std::vector<double>{98, 102});  // y lags
  w.put_vector(std::vector<double>{0.25});     // exo lags
  w.put_vector(std::vector<double>{98, 102, 95, 104});
  w.put(1);                                              // recent head
  w.put(std::array<double, 8>{4, 3, 5, 6, 6, 6, 6, 2});  // last, 3 EMAs, 2 ratios, linear, network
  w.put(true);                                           // pending
  w.put(false);                                          // stale
  w.put_vector(std::vector<float>{0.5, -0.25, 1, 0.125, -1, 0.75, 0.5});
  w.put(std::array<double, 8>{98, 99, 100, 101, 99.5, 99.5, 99.5, 97});
  w.put(99.5);  // pending base
  w.put(5.0);   // pending scale
  w.put(97.0);  // last prediction
  std::vector<float> rows(window * n_in), targets(window);
  for (size_t k = 0; k < rows.size(); ++k) rows[k] = 0.25f * static_cast<float>((k * 5) % 9) - 1;
  for (size_t k = 0; k < targets.size(); ++k) targets[k] = 0.5f * static_cast<float>(k) - 0.75f;
  w.put_vector(rows);
  w.put_vector(targets);
  w.put(3);                                 // buffer count
  w.put(3);                                 // buffer head
  w.put(0.0);                               // linear model: total weight
  w.put(0.0);                               // speed mean
  w.put(0.0);                               // residual variance
  w.put_vector(std::vector<double>{0});     // regressor means
  w.put_vector(std::vector<double>{0});     // regressor scatter
  w.put_vector(std::vector<double>{0});     // cross scatter with the speed
  w.put_vector(std::vector<double>{0.25});  // pending regressors (= the exo lags)
  w.put(std::array<double, 2>{0, 0});       // proportional models: no data yet
  return w.str();
}

TEST(NarxCheckpoint, TheHandWrittenLayoutIsTheSavedOne) {
  auto p = make_predictor("narx", 1, 0);
  p->load_state(narx_state());
  ASSERT_EQ(p->save_state(), narx_state());
  for (int t = 0; t < 50; ++t) {
    const double s = 100 + 10 * std::sin(0.4 * t), u = 0.5 + 0.1 * std::cos(0.4 * t);
    p->observe(s, {u});
    const double y = p->predict({u});
    ASSERT_TRUE(std::isfinite(y) && y > 0) << "step " << t;
  }
  std::string truncated = narx_state();
  truncated.resize(truncated.size() - 5);
  EXPECT_THROW(p->load_state(truncated), std::invalid_argument);
}

// narx/1 to narx/3 were never released: their readers are gone, and such a state is refused with a message
// naming the format found, the one read and the way out, leaving the predictor as it was.
TEST(NarxCheckpoint, AnUnreleasedEarlierFormatIsRefusedNamingBothFormats) {
  auto p = make_predictor("narx", 1, 0);
  p->load_state(narx_state());
  for (const std::string old : {"narx/1", "narx/2", "narx/3"}) {
    try {
      p->load_state(narx_state(old));
      ADD_FAILURE() << old << " was loaded";
    } catch (const std::invalid_argument& e) {
      const std::string want = "predictor state has format '" + old + "', this lbbsp reads 'narx/4' only";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("start afresh"), std::string::npos) << e.what();
    }
    EXPECT_EQ(p->save_state(), narx_state()) << old;
  }
}

}  // namespace
