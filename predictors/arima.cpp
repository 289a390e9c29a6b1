#include "predictors/arima.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "common/state_io.hpp"
#include "predictors/speed.hpp"

namespace lbbsp::predictors {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// OLS by column-pivoting QR; false when X is (numerically) rank deficient.
bool least_squares(const Eigen::MatrixXd& X, const Eigen::VectorXd& y, Eigen::VectorXd& beta, double& scale) {
  if (X.rows() <= X.cols()) return false;
  Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(X);
  if (qr.rank() < X.cols()) return false;
  beta = qr.solve(y);
  Eigen::VectorXd resid = y - X * beta;
  scale = resid.squaredNorm() / static_cast<double>(X.rows() - X.cols());
  return beta.allFinite();
}

// x_n from the forecast of its d-th difference: x_n = w_hat + sum_k (-1)^{k+1} C(d, k) x_{n-k}.
double integrate_forecast(std::span<const double> x, int d, double next_w) {
  double binom = 1, next = next_w;
  const int n = static_cast<int>(x.size());
  for (int k = 1; k <= d; ++k) {
    binom = binom * (d - k + 1) / k;
    next += ((k % 2) ? 1.0 : -1.0) * binom * x[n - k];
  }
  return next;
}

}  // namespace

std::vector<double> difference(std::span<const double> x, int d) {
  std::vector<double> w(x.begin(), x.end());
  for (int k = 0; k < d && !w.empty(); ++k) {
    for (size_t t = 0; t + 1 < w.size(); ++t) w[t] = w[t + 1] - w[t];
    w.pop_back();
  }
  return w;
}

bool roots_outside_unit_circle(const std::vector<double>& c) {
  int k = static_cast<int>(c.size());
  while (k > 0 && c[k - 1] == 0.0) --k;
  if (k == 0) return true;
  // Roots of the polynomial are the inverses of the companion matrix's eigenvalues.
  Eigen::MatrixXd companion = Eigen::MatrixXd::Zero(k, k);
  for (int i = 0; i < k; ++i) companion(0, i) = c[i];
  for (int i = 1; i < k; ++i) companion(i, i - 1) = 1.0;
  Eigen::EigenSolver<Eigen::MatrixXd> solver(companion, false);
  if (solver.info() != Eigen::Success) return false;
  for (int i = 0; i < k; ++i)
    if (std::abs(solver.eigenvalues()[i]) >= 1.0) return false;
  return true;
}

ArmaFit fit_hannan_rissanen(std::span<const double> x_in, int p, int q) {
  ArmaFit fit;
  const int n = static_cast<int>(x_in.size());
  if (n == 0 || p < 0 || q < 0) return fit;
  double mean = 0;
  for (double v : x_in) mean += v;
  mean /= n;
  fit.mean = mean;
  Eigen::VectorXd x(n);
  for (int t = 0; t < n; ++t) x[t] = x_in[t] - mean;
  fit.ar.assign(p, 0.0);
  fit.ma.assign(q, 0.0);
  if (p == 0 && q == 0) {
    fit.sigma2 = x.squaredNorm() / n;
    fit.ok = true;
    return fit;
  }
  Eigen::VectorXd beta;
  if (q == 0) {
    if (n - p <= p) return fit;
    Eigen::MatrixXd X(n - p, p);
    for (int t = p; t < n; ++t)
      for (int i = 0; i < p; ++i) X(t - p, i) = x[t - 1 - i];
    if (!least_squares(X, x.tail(n - p), beta, fit.sigma2)) return fit;
    for (int i = 0; i < p; ++i) fit.ar[i] = beta[i];
    fit.ok = true;
    return fit;
  }
  const int m = std::max(static_cast<int>(std::floor(std::pow(std::log(static_cast<double>(n)), 2))),
                         2 * std::max(p, q));
  const int rows = n - m - q;
  if (m >= n || rows <= p + q) return fit;
  // Stage 1: Yule-Walker AR(m) with biased (MLE) autocovariances of the re-demeaned series.
  Eigen::VectorXd xc = x.array() - x.mean();
  Eigen::VectorXd r(m + 1);
  for (int k = 0; k <= m; ++k) r[k] = xc.head(n - k).dot(xc.tail(n - k)) / n;
  Eigen::MatrixXd R(m, m);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j) R(i, j) = r[std::abs(i - j)];
  Eigen::VectorXd phi_long = R.ldlt().solve(r.segment(1, m));
  if (!phi_long.allFinite()) return fit;
  Eigen::VectorXd resid(n - m);  // resid[j] belongs to time m + j
  for (int t = m; t < n; ++t) {
    double s = x[t];
    for (int i = 0; i < m; ++i) s -= phi_long[i] * x[t - 1 - i];
    resid[t - m] = s;
  }
  // Stage 2: regress x_t on x_{t-1..t-p} and resid_{t-1..t-q} for t = m + q .. n - 1.
  Eigen::MatrixXd X(rows, p + q);
  for (int row = 0; row < rows; ++row) {
    const int t = m + q + row;
    for (int i = 0; i < p; ++i) X(row, i) = x[t - 1 - i];
    for (int j = 0; j < q; ++j) X(row, p + j) = resid[t - 1 - j - m];
  }
  if (!least_squares(X, x.tail(rows), beta, fit.sigma2)) return fit;
  for (int i = 0; i < p; ++i) fit.ar[i] = beta[i];
  for (int j = 0; j < q; ++j) fit.ma[j] = beta[p + j];
  fit.ok = true;
  return fit;
}

double arma_forecast(const ArmaFit& fit, std::span<const double> w) {
  const int n = static_cast<int>(w.size());
  const int p = static_cast<int>(fit.ar.size()), q = static_cast<int>(fit.ma.size());
  const int start = std::max(p, q);
  if (n < start) return kNaN;
  std::vector<double> z(n), e(n, 0.0);
  for (int t = 0; t < n; ++t) z[t] = w[t] - fit.mean;
  auto one_step = [&](int t) {  // prediction of z[t] from the past
    double s = 0;
    for (int i = 0; i < p; ++i) s += fit.ar[i] * z[t - 1 - i];
    for (int j = 0; j < q; ++j) s += fit.ma[j] * e[t - 1 - j];
    return s;
  };
  for (int t = start; t < n; ++t) e[t] = z[t] - one_step(t);
  z.push_back(0.0);
  e.push_back(0.0);
  return fit.mean + one_step(n);
}

double arima_forecast(std::span<const double> x, int p, int d, int q, ArmaFit* fit_out) {
  std::vector<double> w = difference(x, d);
  ArmaFit fit = fit_hannan_rissanen(w, p, q);
  if (fit_out) *fit_out = fit;
  if (!fit.ok) return kNaN;
  return integrate_forecast(x, d, arma_forecast(fit, w));
}

ArimaPredictor::ArimaPredictor(const ArimaOptions& options) : options_(options) {
  if (options.p < 0 || options.d < 0 || options.q < 0 || options.p > 8 || options.d > 2 || options.q > 8)
    throw std::invalid_argument("arima orders must satisfy 0 <= p, q <= 8 and 0 <= d <= 2");
  if (options.window < 16 || options.window > 100000)
    throw std::invalid_argument("arima window must be in [16, 100000]");
}

void ArimaPredictor::observe(double speed, const std::vector<double>&) {
  if (!is_good_speed(speed)) return;  // missing steps are dropped from the window
  window_.push_back(speed);
  if (static_cast<int>(window_.size()) > options_.window) window_.erase(window_.begin());
  refit();
}

void ArimaPredictor::refit() {
  const double last = window_.back();
  double forecast = kNaN;
  // Too short for the model: fall back to the last value until the window fills a bit.
  if (static_cast<int>(window_.size()) >= std::max(16, 3 * (options_.p + options_.q + options_.d + 2))) {
    std::vector<double> w = difference(window_, options_.d);
    fit_ = fit_hannan_rissanen(w, options_.p, options_.q);
    std::vector<double> neg_ma(fit_.ma.size());
    for (size_t j = 0; j < neg_ma.size(); ++j) neg_ma[j] = -fit_.ma[j];
    // A non-invertible MA makes the residual recursion explode: refit AR only.
    if (fit_.ok && !roots_outside_unit_circle(neg_ma)) fit_ = fit_hannan_rissanen(w, options_.p, 0);
    if (fit_.ok) forecast = integrate_forecast(window_, options_.d, arma_forecast(fit_, w));
  }
  auto [lo, hi] = std::minmax_element(window_.begin(), window_.end());
  // Keep forecasts within a plausible band around what was seen (ARIMA can extrapolate wildly).
  forecast_ = std::isfinite(forecast) ? std::clamp(forecast, 0.5 * *lo, 1.5 * *hi) : last;
}

double ArimaPredictor::predict(const std::vector<double>&) {
  return forecast_ > 0 ? forecast_ : kDefaultSpeed;
}

std::string ArimaPredictor::save_state() const {
  StateWriter w(StateOf::predictor, "arima/1");
  w.put(options_.p);
  w.put(options_.d);
  w.put(options_.q);
  w.put(options_.window);
  w.put_vector(window_);
  w.put(forecast_);
  return w.str();
}

void ArimaPredictor::load_state(const std::string& state) {
  StateReader r(StateOf::predictor, state, "arima/1");
  ArimaOptions o;
  o.p = r.get<int>();
  o.d = r.get<int>();
  o.q = r.get<int>();
  o.window = r.get<int>();
  auto window = r.get_vector<double>();
  double forecast = r.get<double>();
  r.finish();
  options_ = o;
  window_ = std::move(window);
  forecast_ = forecast;
  fit_ = ArmaFit{};
  if (!window_.empty()) refit();  // deterministic: recomputes the same fit and forecast
}

}  // namespace lbbsp::predictors
