// ARIMA(p,d,q) refitted online on a sliding window by the (two-stage) Hannan-Rissanen method.
#pragma once
#include <span>
#include <vector>

#include "predictors/predictor.hpp"

namespace lbbsp::predictors {

struct ArmaFit {
  std::vector<double> ar;  // phi_1..phi_p
  std::vector<double> ma;  // theta_1..theta_q
  double mean = 0.0;       // subtracted before fitting
  double sigma2 = 0.0;     // residual variance of the last regression (OLS scale)
  bool ok = false;         // false: too few points or a singular regression
};

// Same estimator as statsmodels' hannan_rissanen(x, ar_order=p, ma_order=q, demean=True, unbiased=False):
// stage 1 a long AR(m), m = max(floor(log(n)^2), 2 max(p, q)), by Yule-Walker (MLE autocovariances) for
// residuals; stage 2 OLS of x_t on its p lags and q lagged residuals (q = 0: plain OLS, conditional least
// squares).
ArmaFit fit_hannan_rissanen(std::span<const double> x, int p, int q);

// d-th differences (length n - d).
std::vector<double> difference(std::span<const double> x, int d);

// One-step forecast of the stationary series w from a fit, residuals by the conditional (CSS) recursion.
double arma_forecast(const ArmaFit& fit, std::span<const double> w);

// One-step forecast of x after differencing d times, fitting ARMA(p, q), forecasting and integrating back.
// Returns NaN when the fit is not usable.
double arima_forecast(std::span<const double> x, int p, int d, int q, ArmaFit* fit_out = nullptr);

// True when all roots of 1 - c_1 z - ... - c_k z^k lie outside the unit circle (stationary AR / invertible MA
// with c = -theta).
bool roots_outside_unit_circle(const std::vector<double>& c);

struct ArimaOptions {
  int p = 1, d = 0, q = 1;
  int window = 96;  // samples the model is refitted on at every observation
};

class ArimaPredictor final : public Predictor {
 public:
  explicit ArimaPredictor(const ArimaOptions& options);
  std::string name() const override { return "arima"; }
  void observe(double speed, const std::vector<double>& exo) override;
  double predict(const std::vector<double>& exo_next) override;
  std::string save_state() const override;
  void load_state(const std::string& state) override;
  const ArmaFit& last_fit() const { return fit_; }

 private:
  void refit();
  ArimaOptions options_;
  std::vector<double> window_;  // good observations, oldest first (missing steps are dropped)
  ArmaFit fit_;
  double forecast_ = 0.0;  // 0 until the first good observation
};

}  // namespace lbbsp::predictors
