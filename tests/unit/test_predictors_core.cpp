// Factory, robustness to bad observations, checkpoints and determinism, for every predictor kind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "predictors/basic.hpp"
#include "predictors/narx.hpp"
#include "predictors/predictor.hpp"

using lbbsp::predictors::make_predictor;
using lbbsp::predictors::NarxOptions;
using lbbsp::predictors::NarxPredictor;
using lbbsp::predictors::Predictor;

namespace {

const std::vector<std::string> kSpecs = {"last",
                                         "ema",
                                         "ema:0.3",
                                         "arima",
                                         "arima:2,1,1",
                                         "arima:1,0,0",
                                         "narx",
                                         "oracle",
                                         "narx:dy=2,du=1,hidden=4,window=16,lr=0.02,epochs=1,batch=4",
                                         "narx:forget=1,ridge=0",
                                         "narx:ratio=1",
                                         "narx:ratio=-1"};
constexpr int kExo = 2;

// A noisy positive series with an exogenous input that matters.
struct Step {
  double speed;
  std::vector<double> exo;
};
std::vector<Step> make_series(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Step> s;
  double level = 100;
  for (int t = 0; t < n; ++t) {
    double load = u(rng);
    level = 100 + 0.8 * (level - 100) + 5 * u(rng);
    s.push_back({level - 20 * load, {load, 0.5 + 0.1 * u(rng)}});
  }
  return s;
}

void expect_valid(double p, const std::string& spec, int t) {
  EXPECT_TRUE(std::isfinite(p) && p > 0) << spec << " predicted " << p << " at step " << t;
}

}  // namespace

TEST(PredictorFactory, BuildsEveryValidSpec) {
  for (const auto& spec : kSpecs) {
    auto p = make_predictor(spec, kExo, 7);
    ASSERT_NE(p, nullptr) << spec;
    EXPECT_EQ(p->name(), spec.substr(0, spec.find(':'))) << spec;
  }
}

TEST(PredictorFactory, SetsEveryNarxOptionItNames) {
  auto p = make_predictor(
      "narx:dy=3,du=1,hidden=5,window=20,lr=0.05,epochs=3,batch=2,sharp=2,forget=0.9,ridge=0.1,"
      "ratio=1",
      kExo, 1);
  const auto* narx = dynamic_cast<const NarxPredictor*>(p.get());
  ASSERT_NE(narx, nullptr);
  const NarxOptions& o = narx->options();
  EXPECT_EQ(o.dy, 3);
  EXPECT_EQ(o.du, 1);
  EXPECT_EQ(o.hidden, 5);
  EXPECT_EQ(o.window, 20);
  EXPECT_DOUBLE_EQ(o.lr, 0.05);
  EXPECT_EQ(o.epochs, 3);
  EXPECT_EQ(o.batch, 2);
  EXPECT_DOUBLE_EQ(o.sharp, 2);
  EXPECT_DOUBLE_EQ(o.forget, 0.9);
  EXPECT_DOUBLE_EQ(o.ridge, 0.1);
  EXPECT_EQ(o.ratio, 1);
  // The message lists the options with NarxOptions' defaults.
  try {
    make_predictor("narx:depth=3", kExo, 1);
    ADD_FAILURE() << "accepted narx:depth=3";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(
        std::string(e.what()).find("narx[:dy=4,du=2,hidden=8,window=64,epochs=2,batch=8,ratio=0,lr=0.01,"
                                   "sharp=4,forget=0.98,ridge=0.01]"),
        std::string::npos)
        << e.what();
  }
}

TEST(PredictorFactory, RejectsBadSpecsNamingThemAndListingValidOnes) {
  for (std::string bad : {"", "lstm", "ema:2", "ema:abc", "ema:0", "arima:1,0", "arima:1,x,1", "arima:9,0,0",
                          "narx:dy=0", "narx:depth=3", "narx:dy", "last:1", "arima:1,0,1,win=3", "narx:lr=-1",
                          "narx:forget=0", "narx:forget=1.5", "narx:ridge=-1", "narx:ratio=-2"}) {
    try {
      make_predictor(bad, 1, 0);
      ADD_FAILURE() << "accepted bad spec '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("'" + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("valid:"), std::string::npos) << what;
      EXPECT_NE(what.find("narx"), std::string::npos) << what;
    }
  }
  EXPECT_THROW(make_predictor("ema", -1, 0), std::invalid_argument);
}

// The spec errors in the shared style (common/spec.hpp); no predictor takes ;KEY=VALUE options.
TEST(PredictorFactory, ErrorsAreInTheSpecStyle) {
  for (const auto& [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"lstm", "unknown predictor 'lstm'"},
           {"ema:2", "alpha must be in (0, 1]"},
           {"narx:dy=0", "narx dy must be in [1, 64]"},
           {"ema;alpha=0.2", "'ema' takes no ;KEY=VALUE options, got 'alpha'"}}) {
    try {
      make_predictor(spec, 1, 0);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("predictor: " + why + " (in '" + spec + "'; valid: last, ema", 0),
                0u)
          << e.what();
    }
  }
}

TEST(PredictorRobustness, NeverNaNNegativeOrZeroAndRecovers) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const auto& spec : kSpecs) {
    auto p = make_predictor(spec, kExo, 3);
    int t = 0;
    expect_valid(p->predict({}), spec, t);  // before any observation
    const std::vector<double> bad_speeds = {nan, inf, -inf, 0.0, -5.0, nan, nan};
    for (double s : bad_speeds) {  // only bad observations at the start
      p->set_truth(s);
      p->observe(s, {nan, inf});
      expect_valid(p->predict({nan, nan}), spec, ++t);
    }
    auto series = make_series(300, 11);
    for (size_t i = 0; i < series.size(); ++i) {
      double s = series[i].speed;
      if (i % 37 == 5) s = nan;  // missing steps
      if (i % 53 == 7) s = -s;   // negative
      if (i % 61 == 9) s = 0;    // zero
      if (i % 71 == 3) s = inf;  // infinite
      std::vector<double> exo = series[i].exo;
      if (i % 29 == 4) exo = {nan, 1.0};  // bad exogenous values
      if (i % 43 == 6) exo = {};          // wrong length
      p->set_truth(i + 1 < series.size() ? series[i + 1].speed : nan);
      p->observe(s, exo);
      expect_valid(p->predict(i % 3 ? series[i].exo : std::vector<double>{}), spec, ++t);
    }
    // Recovery: a steady 42 after all that is predicted as ~42.
    for (int i = 0; i < 200; ++i) {
      p->set_truth(42.0);
      p->observe(42.0, {0.0, 0.5});
    }
    double last = p->predict({0.0, 0.5});
    EXPECT_NEAR(last, 42.0, 0.42) << spec;
  }
}

TEST(PredictorCheckpoint, RestoreOfSaveContinuesBitIdentically) {
  auto series = make_series(400, 5);
  for (const auto& spec : kSpecs) {
    auto a = make_predictor(spec, kExo, 99);
    for (int t = 0; t < 150; ++t) {
      a->set_truth(series[t + 1].speed);
      a->observe(t == 77 ? std::nan("") : series[t].speed, series[t].exo);
      a->predict(series[t].exo);
    }
    const std::string saved = a->save_state();
    auto b = make_predictor(spec, kExo, 12345);  // a different seed: everything must come from the state
    b->load_state(saved);
    EXPECT_EQ(b->save_state(), saved) << spec;
    for (int t = 150; t < 399; ++t) {
      a->set_truth(series[t + 1].speed);
      b->set_truth(series[t + 1].speed);
      a->observe(series[t].speed, series[t].exo);
      b->observe(series[t].speed, series[t].exo);
      double pa = a->predict(series[t].exo), pb = b->predict(series[t].exo);
      ASSERT_EQ(std::memcmp(&pa, &pb, sizeof pa), 0)
          << spec << " diverged at step " << t << ": " << pa << " vs " << pb;
    }
  }
}

TEST(PredictorCheckpoint, RejectsForeignOrCorruptState) {
  auto ema = make_predictor("ema", 0, 0);
  auto narx = make_predictor("narx", 1, 0);
  EXPECT_THROW(ema->load_state(narx->save_state()), std::invalid_argument);
  EXPECT_THROW(narx->load_state(ema->save_state()), std::invalid_argument);
  std::string state = narx->save_state();
  EXPECT_THROW(narx->load_state(state.substr(0, state.size() / 2)), std::invalid_argument);
  EXPECT_THROW(narx->load_state(""), std::invalid_argument);
  EXPECT_THROW(
      make_predictor("narx", 2, 0)->load_state(make_predictor("narx:dy=3", 2, 0)->save_state() + "x"),
      std::invalid_argument);
}

TEST(PredictorDeterminism, SameSeedSamePredictionsAndSeedMattersForNarx) {
  auto series = make_series(200, 8);
  auto run = [&](const std::string& spec, uint64_t seed) {
    auto p = make_predictor(spec, kExo, seed);
    std::vector<double> out;
    for (auto& s : series) {
      p->observe(s.speed, s.exo);
      out.push_back(p->predict(s.exo));
    }
    return out;
  };
  for (const auto& spec : kSpecs) EXPECT_EQ(run(spec, 1), run(spec, 1)) << spec;
  EXPECT_NE(run("narx", 1), run("narx", 2));
}

TEST(BasicPredictors, LastEmaOracleSemantics) {
  auto last = make_predictor("last", 0, 0);
  auto ema = make_predictor("ema:0.5", 0, 0);
  auto oracle = make_predictor("oracle", 0, 0);
  for (double s : {10.0, 20.0, std::nan(""), 40.0}) {
    last->observe(s, {});
    ema->observe(s, {});
    oracle->observe(s, {});
  }
  EXPECT_EQ(last->predict({}), 40.0);
  EXPECT_DOUBLE_EQ(ema->predict({}), 0.5 * 40 + 0.5 * (0.5 * 20 + 0.5 * 10));
  EXPECT_EQ(oracle->predict({}), 40.0);  // no truth yet: last good value
  oracle->set_truth(7.5);
  EXPECT_EQ(oracle->predict({}), 7.5);
  EXPECT_EQ(static_cast<lbbsp::predictors::EmaPredictor&>(*ema).alpha(), 0.5);
}
