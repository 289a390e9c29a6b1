// A fleet of predictor states updated through for_each_worker (as LbbspCpuBalancer::next does): identical
// results for any thread count, prefetch() changes nothing, exceptions surface; and NARX checkpoints of the
// older formats (narx/1: double precision; narx/2: no exogenous linear model; narx/3: no proportional
// models) still load, into exactly the state the current format (narx/4) describes.
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

// A NARX state in the layout of format narx/1 (network in double, W1 hidden-major), narx/2 (float, W1
// input-major, Adam's running bias powers, the stale flag), narx/3 (narx/2 plus the exogenous linear model:
// its options, its candidate slot between the EMAs and the network, its statistics) or narx/4 (narx/3 plus
// the proportional models: the ratio input, two candidate slots between the EMAs and the linear model, their
// levels), from the same values. The narx/4 state is the one the older ones migrate to: empty models scored
// with the largest recent squared error of the others, their pending forecasts the base, the linear model's
// regressors the newest exo values, the ratio input the default (0).
std::string narx_state(int version) {
  const bool v1 = version == 1, v3 = version >= 3, v4 = version == 4;
  const int dy = 2, du = 1, hidden = 3, window = 4, num_exo = 1;
  const int n_in = dy + 3 + (du + 1) * num_exo;
  const int params = hidden * (n_in + 2) + 1;
  StateWriter w(StateOf::predictor, "narx/" + std::to_string(version));
  w.put(dy);
  w.put(du);
  w.put(hidden);
  w.put(window);
  w.put(0.01);  // lr
  w.put(2);     // epochs
  w.put(3);     // batch
  w.put(4.0);   // sharp
  if (v3) {
    w.put(0.98);  // forget
    w.put(0.01);  // ridge
  }
  if (v4) w.put(0);  // ratio input
  w.put(num_exo);
  w.put(uint64_t{12345});
  // Values exactly representable in float, so both formats describe the same network.
  auto net = [&](double offset) {
    std::vector<double> hidden_major(params);
    for (int k = 0; k < params; ++k) hidden_major[k] = offset + 0.0625 * ((k * 7) % 11 - 5);
    return hidden_major;
  };
  auto put_net = [&](const std::vector<double>& hidden_major) {
    if (v1) return w.put_vector(hidden_major);
    std::vector<float> input_major(params);
    for (int j = 0; j < hidden; ++j)
      for (int i = 0; i < n_in; ++i)
        input_major[i * hidden + j] = static_cast<float>(hidden_major[j * n_in + i]);
    for (int k = hidden * n_in; k < params; ++k) input_major[k] = static_cast<float>(hidden_major[k]);
    w.put_vector(input_major);
  };
  put_net(net(0));
  put_net(net(0.5));  // Adam m
  put_net(net(1));    // Adam v (positive)
  const int64_t steps = 17;
  w.put(steps);
  if (!v1) {
    w.put(std::pow(0.9, static_cast<double>(steps)));
    w.put(std::pow(0.999, static_cast<double>(steps)));
  }
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
  w.put(1);  // recent head
  if (v4)
    w.put(std::array<double, 8>{4, 3, 5, 6, 6, 6, 6, 2});  // last, 3 EMAs, 2 ratios, linear, network
  else if (v3)
    w.put(std::array<double, 6>{4, 3, 5, 6, 6, 2});  // last, 3 EMAs, linear, network
  else
    w.put(std::array<double, 5>{4, 3, 5, 6, 2});
  w.put(true);            // pending
  if (!v1) w.put(false);  // stale
  const std::vector<double> x{0.5, -0.25, 1, 0.125, -1, 0.75, 0.5};
  if (v1)
    w.put_vector(x);
  else
    w.put_vector(std::vector<float>(x.begin(), x.end()));
  if (v4)
    w.put(std::array<double, 8>{98, 99, 100, 101, 99.5, 99.5, 99.5, 97});
  else if (v3)
    w.put(std::array<double, 6>{98, 99, 100, 101, 99.5, 97});
  else
    w.put(std::array<double, 5>{98, 99, 100, 101, 97});
  w.put(99.5);  // pending base
  w.put(5.0);   // pending scale
  w.put(97.0);  // last prediction
  std::vector<double> rows(window * n_in), targets(window);
  for (size_t k = 0; k < rows.size(); ++k) rows[k] = 0.25 * ((k * 5) % 9) - 1;
  for (size_t k = 0; k < targets.size(); ++k) targets[k] = 0.5 * k - 0.75;
  if (v1) {
    w.put_vector(rows);
    w.put_vector(targets);
  } else {
    w.put_vector(std::vector<float>(rows.begin(), rows.end()));
    w.put_vector(std::vector<float>(targets.begin(), targets.end()));
  }
  w.put(3);  // buffer count
  w.put(3);  // buffer head
  if (v3) {
    w.put(0.0);                               // linear model: total weight
    w.put(0.0);                               // speed mean
    w.put(0.0);                               // residual variance
    w.put_vector(std::vector<double>{0});     // regressor means
    w.put_vector(std::vector<double>{0});     // regressor scatter
    w.put_vector(std::vector<double>{0});     // cross scatter with the speed
    w.put_vector(std::vector<double>{0.25});  // pending regressors (= the exo lags)
  }
  if (v4) w.put(std::array<double, 2>{0, 0});  // proportional models: no data yet
  return w.str();
}

TEST(NarxCheckpoint, OlderFormatsLoadIntoTheSameState) {
  auto from_v1 = make_predictor("narx", 1, 0), from_v2 = make_predictor("narx", 1, 0),
       from_v3 = make_predictor("narx", 1, 0), from_v4 = make_predictor("narx", 1, 0);
  from_v1->load_state(narx_state(1));
  from_v2->load_state(narx_state(2));
  from_v3->load_state(narx_state(3));
  from_v4->load_state(narx_state(4));
  ASSERT_EQ(from_v1->save_state(), from_v2->save_state());
  ASSERT_EQ(from_v2->save_state(), from_v3->save_state());
  ASSERT_EQ(from_v3->save_state(), from_v4->save_state());
  ASSERT_EQ(from_v4->save_state(), narx_state(4));  // the hand-written layout is the real one
  for (int t = 0; t < 50; ++t) {
    const double s = 100 + 10 * std::sin(0.4 * t), u = 0.5 + 0.1 * std::cos(0.4 * t);
    from_v1->observe(s, {u});
    from_v3->observe(s, {u});
    const double a = from_v1->predict({u}), b = from_v3->predict({u});
    ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "step " << t;
    ASSERT_TRUE(std::isfinite(a) && a > 0);
  }
  for (int version : {1, 2, 3, 4}) {
    std::string truncated = narx_state(version);
    truncated.resize(truncated.size() - 5);
    EXPECT_THROW(from_v1->load_state(truncated), std::invalid_argument) << version;
  }
}

}  // namespace
