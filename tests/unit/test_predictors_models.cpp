// ARIMA estimation and NARX learning on series where the right answer is known.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "predictors/arima.hpp"
#include "predictors/narx.hpp"
#include "predictors/predictor.hpp"

using namespace lbbsp::predictors;

TEST(Arima, DifferenceAndOrderZeroFit) {
  std::vector<double> x = {1, 4, 9, 16, 25};
  EXPECT_EQ(difference(x, 1), (std::vector<double>{3, 5, 7, 9}));
  EXPECT_EQ(difference(x, 2), (std::vector<double>{2, 2, 2}));
  ArmaFit fit = fit_hannan_rissanen(x, 0, 0);
  ASSERT_TRUE(fit.ok);
  EXPECT_DOUBLE_EQ(fit.mean, 11.0);
  // A quadratic is forecast exactly by ARIMA(0,2,0) with a constant second difference.
  EXPECT_NEAR(arima_forecast(x, 0, 2, 0), 36.0, 1e-12);
}

TEST(Arima, NoiseFreeAr2IsRecoveredExactly) {
  // x_t - m = 1.2 (x_{t-1} - m) - 0.5 (x_{t-2} - m) has an exact solution; OLS on the demeaned series is
  // exact up to the mean estimate, so use a long sample where the sample mean is the true one to rounding.
  std::vector<double> x = {1.0, -0.5};
  for (int t = 2; t < 400; ++t) x.push_back(1.2 * x[t - 1] - 0.5 * x[t - 2]);
  for (double& v : x) v += 10;
  ArmaFit fit = fit_hannan_rissanen(x, 2, 0);
  ASSERT_TRUE(fit.ok);
  EXPECT_NEAR(fit.ar[0], 1.2, 1e-3);
  EXPECT_NEAR(fit.ar[1], -0.5, 1e-3);
  EXPECT_TRUE(roots_outside_unit_circle(fit.ar));
  EXPECT_FALSE(roots_outside_unit_circle({1.5}));
}

TEST(Arima, Arma11EstimatesAreClose) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(0, 1);
  std::vector<double> x;
  double prev = 0, e_prev = 0;
  for (int t = 0; t < 4000; ++t) {
    double e = noise(rng);
    double v = 0.6 * prev + e + 0.3 * e_prev;
    x.push_back(v + 50);
    prev = v;
    e_prev = e;
  }
  ArmaFit fit = fit_hannan_rissanen(x, 1, 1);
  ASSERT_TRUE(fit.ok);
  EXPECT_NEAR(fit.ar[0], 0.6, 0.06);
  EXPECT_NEAR(fit.ma[0], 0.3, 0.06);
  EXPECT_NEAR(fit.mean, 50, 0.3);
}

TEST(Arima, PredictorBeatsLastValueOnMeanRevertingSeries) {
  std::mt19937_64 rng(4);
  std::normal_distribution<double> noise(0, 1);
  auto arima = make_predictor("arima:1,0,0", 0, 0), last = make_predictor("last", 0, 0);
  double v = 0, se_arima = 0, se_last = 0;
  for (int t = 0; t < 2000; ++t) {
    double pa = arima->predict({}), pl = last->predict({});
    v = 0.3 * v + noise(rng);
    double y = 20 + v;
    if (t > 200) {
      se_arima += (pa - y) * (pa - y);
      se_last += (pl - y) * (pl - y);
    }
    arima->observe(y, {});
    last->observe(y, {});
  }
  EXPECT_LT(se_arima, 0.7 * se_last);
  auto& fit = static_cast<ArimaPredictor&>(*arima).last_fit();
  ASSERT_TRUE(fit.ok);
  EXPECT_NEAR(fit.ar[0], 0.3, 0.25);
}

// The next speed depends nonlinearly on an exogenous input known ahead of the step; only NARX can use it.
TEST(Narx, LearnsAnExogenousNonlinearityThatEmaCannot) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-2, 2);
  auto narx = make_predictor("narx", 1, 1), ema = make_predictor("ema", 1, 1);
  double load_next = u(rng), se_narx = 0, se_ema = 0;
  for (int t = 0; t < 3000; ++t) {
    const double load = load_next;
    const double speed = 100 * (1.0 - 0.4 * std::tanh(2 * load) * std::tanh(2 * load));
    if (t > 1500) {
      double pn = narx->predict({load}), pe = ema->predict({load});
      se_narx += (pn - speed) * (pn - speed);
      se_ema += (pe - speed) * (pe - speed);
    } else {
      narx->predict({load});
    }
    narx->observe(speed, {load});
    ema->observe(speed, {load});
    load_next = u(rng);
  }
  EXPECT_LT(se_narx, 0.5 * se_ema) << "narx rmse " << std::sqrt(se_narx / 1499) << " ema "
                                   << std::sqrt(se_ema / 1499);
}

// Trace replay at the barrier: the speed is proportional to the CPU available in the coming step, which is
// known (piecewise constant, jumping every few steps), beside a constant and a noisy irrelevant input. The
// exogenous linear model learns the proportion in a few steps; last value, EMAs and the network (small
// gradient steps on a residual) lag each jump.
TEST(Narx, FollowsASpeedProportionalToTheAnnouncedCpu) {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> level(0.1, 1.0), irrelevant(0, 1);
  std::normal_distribution<double> noise(0, 0.02);
  auto narx = make_predictor("narx", 3, 1), ema = make_predictor("ema", 3, 1);
  double cpu_next = level(rng), se_narx = 0, se_ema = 0;
  int scored = 0;
  for (int t = 0; t < 1500; ++t) {
    const double cpu = cpu_next;
    const double speed = 1000 * cpu * (1 + noise(rng));
    if (t % 4 == 3) cpu_next = level(rng);
    const std::vector<double> exo = {cpu, 0.8, irrelevant(rng)};
    if (t > 100) {
      const double pn = narx->predict(exo), pe = ema->predict(exo);
      se_narx += (pn - speed) * (pn - speed);
      se_ema += (pe - speed) * (pe - speed);
      ++scored;
    } else {
      narx->predict(exo);
    }
    narx->observe(speed, exo);
    ema->observe(speed, exo);
  }
  EXPECT_LT(se_narx, 0.1 * 0.1 * se_ema)
      << "narx rmse " << std::sqrt(se_narx / scored) << " ema " << std::sqrt(se_ema / scored);
}

// The same with the speed per unit of CPU drifting (the real compute's own speed), 5% noise, and one jump in
// four landing just after the barrier measured the input (the forecast used a stale value, the next
// measurement shows the step's). The proportional models (speed = rho * cpu, rho an EMA) follow it with no
// intercept to learn (3-5% better than without them, ratio=-1, on three seeds; 15% without stale inputs);
// both beat EMA by far.
TEST(Narx, ProportionalModelsFollowADriftingSpeedPerCpu) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> level(0.1, 1.0), irrelevant(0, 1);
  std::normal_distribution<double> noise(0, 0.05), drift(0, 0.01);
  // cpu[t]: the CPU of step t; measured[t]: what the barrier before step t measured (the exogenous input of
  // the forecast of step t and of the observation of step t - 1, as the runtime passes them).
  const int n = 2000;
  std::vector<double> cpu(n + 1), measured(n + 1);
  cpu[0] = measured[0] = level(rng);
  for (int t = 1; t <= n; ++t) {
    cpu[t] = t % 5 == 0 ? level(rng) : cpu[t - 1];
    measured[t] = t % 20 == 0 ? cpu[t - 1] : cpu[t];  // one jump in four lands after the measurement
  }
  auto narx = make_predictor("narx", 3, 1), plain = make_predictor("narx:ratio=-1", 3, 1),
       ema = make_predictor("ema", 3, 1);
  double per_cpu = 1000, se_narx = 0, se_plain = 0, se_ema = 0;
  int scored = 0;
  for (int t = 0; t < n; ++t) {
    const std::vector<double> exo = {measured[t], 0.8, irrelevant(rng)};
    const double pn = narx->predict(exo), pp = plain->predict(exo), pe = ema->predict(exo);
    per_cpu = std::clamp(per_cpu * (1 + drift(rng)), 500.0, 2000.0);
    const double speed = per_cpu * cpu[t] * (1 + noise(rng));
    if (t > 100) {
      se_narx += (pn - speed) * (pn - speed);
      se_plain += (pp - speed) * (pp - speed);
      se_ema += (pe - speed) * (pe - speed);
      ++scored;
    }
    const std::vector<double> next = {measured[t + 1], 0.8, irrelevant(rng)};
    narx->observe(speed, next);
    plain->observe(speed, next);
    ema->observe(speed, next);
  }
  const double rmse = std::sqrt(se_narx / scored), plain_rmse = std::sqrt(se_plain / scored),
               ema_rmse = std::sqrt(se_ema / scored);
  EXPECT_LT(rmse, 0.98 * plain_rmse) << "narx " << rmse << " narx:ratio=-1 " << plain_rmse << " ema "
                                     << ema_rmse;
  EXPECT_LT(rmse, 0.5 * ema_rmse) << "narx " << rmse << " ema " << ema_rmse;
}

// On pure noise around a level, NARX must not be worse than EMA by more than a little (its blend falls back).
TEST(Narx, NoWorseThanEmaOnNoise) {
  std::mt19937_64 rng(6);
  std::normal_distribution<double> noise(0, 1);
  auto narx = make_predictor("narx", 0, 1), ema = make_predictor("ema", 0, 1);
  double se_narx = 0, se_ema = 0;
  for (int t = 0; t < 3000; ++t) {
    double y = 10 + noise(rng);
    double pn = narx->predict({}), pe = ema->predict({});
    if (t > 100) {
      se_narx += (pn - y) * (pn - y);
      se_ema += (pe - y) * (pe - y);
    }
    narx->observe(y, {});
    ema->observe(y, {});
  }
  EXPECT_LT(se_narx, 1.02 * se_ema);
}
