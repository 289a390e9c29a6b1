#include "predictors/narx_exo.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace lbbsp::predictors {
namespace {

constexpr double kLinClip = 4.0;      // residuals winsorised at this many running std devs
constexpr double kResidAlpha = 0.05;  // their running variance: ~20-step memory (as the candidates' scores)

// Per-thread scratch of the solves (not state), shared by every model a thread runs; never shrunk.
struct Scratch {
  std::vector<int> active;
  std::vector<double> work;
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

template <class T>
T* fit(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// The lower Cholesky factor of the m x m matrix a (its lower triangle) in place; false unless a is
// positive definite.
bool cholesky(double* a, int m) {
  for (int p = 0; p < m; ++p) {
    for (int q = 0; q <= p; ++q) {
      double v = a[p * m + q];
      for (int r = 0; r < q; ++r) v -= a[p * m + r] * a[q * m + r];
      if (p == q) {
        if (!(v > 0)) return false;
        a[p * m + p] = std::sqrt(v);
      } else {
        a[p * m + q] = v / a[q * m + q];
      }
    }
  }
  return true;
}

// Solves L L^T x = b in place, L the factor cholesky() left in a: forward, then back substitution.
void cholesky_solve(const double* a, int m, double* b) {
  for (int p = 0; p < m; ++p) {
    for (int r = 0; r < p; ++r) b[p] -= a[p * m + r] * b[r];
    b[p] /= a[p * m + p];
  }
  for (int p = m - 1; p >= 0; --p) {
    for (int r = p + 1; r < m; ++r) b[p] -= a[r * m + p] * b[r];
    b[p] /= a[p * m + p];
  }
}

void read_same_size(StateReader& r, std::vector<double>& dst) {
  std::vector<double> src = r.get_vector<double>();
  if (src.size() != dst.size()) throw std::invalid_argument("narx state has inconsistent sizes");
  dst = std::move(src);
}

}  // namespace

ExoLinearModel::ExoLinearModel(int num_exo, double forget, double ridge)
    : num_exo_(num_exo),
      forget_(forget),
      ridge_(ridge),
      u_mean_(num_exo, 0.0),
      uu_(static_cast<size_t>(num_exo) * num_exo, 0.0),
      uy_(num_exo, 0.0) {}

double ExoLinearModel::forecast(const double* u, double fallback, double lo, double hi) const {
  if (!(weight_ > 0)) return fallback;
  const int k = num_exo_;
  int* active = fit(scratch().active, static_cast<size_t>(k));
  double* sd = fit(scratch().work, static_cast<size_t>(k) * (k + 2));
  double* slopes = sd + k;  // room for the m x m normal equations, then their right-hand side
  int m = 0;
  double y = y_mean_;
  if (!solve_slopes(active, sd, slopes, m)) return std::isfinite(y) ? y : fallback;
  for (int p = 0; p < m; ++p) y += slopes[p] / sd[p] * (u[active[p]] - u_mean_[active[p]]);
  return std::isfinite(y) ? std::clamp(y, lo, hi) : fallback;
}

// Inputs that vary (relative to their level) enter standardised (active[0..m), their std devs in sd), with
// the ridge on their slopes; the normal equations are solved by Cholesky (k is the handful of exogenous
// inputs). `work` holds m x m + m values; the slopes are left at its start.
bool ExoLinearModel::solve_slopes(int* active, double* sd, double* work, int& m) const {
  const int k = num_exo_;
  m = 0;
  for (int i = 0; i < k; ++i) {
    const double var = uu_[static_cast<size_t>(i) * k + i];
    if (var > weight_ * (1e-10 * u_mean_[i] * u_mean_[i] + 1e-300)) {
      active[m] = i;
      sd[m++] = std::sqrt(var);
    }
  }
  if (m == 0) return true;
  double* a = work;
  double* b = a + static_cast<size_t>(m) * m;
  const double ridge = std::max(ridge_, 1e-9);
  for (int p = 0; p < m; ++p) {
    for (int q = 0; q <= p; ++q)
      a[p * m + q] =
          uu_[static_cast<size_t>(active[p]) * k + active[q]] / (sd[p] * sd[q]) + (p == q ? ridge : 0);
    b[p] = uy_[active[p]] / sd[p];
  }
  if (!cholesky(a, m)) return false;
  cholesky_solve(a, m, b);
  std::copy(b, b + m, work);
  return true;
}

// The residual is winsorised at kLinClip running standard deviations of the (winsorised) residuals once
// warmed up, floored relative to the level: a burst of 1000x glitches moves the model little, a lasting
// change widens the band geometrically until it is followed.
void ExoLinearModel::learn(const double* u, double speed, double forecast) {
  const bool warm = weight_ >= 8;
  const double bound = kLinClip * std::max(std::sqrt(resid_var_), 1e-3 * std::abs(forecast));
  const double r = warm ? std::clamp(speed - forecast, -bound, bound) : speed - forecast;
  update(u, forecast + r);
  resid_var_ += (warm ? kResidAlpha : 1 / std::max(weight_, 1.0)) * (r * r - resid_var_);
  if (!std::isfinite(resid_var_)) resid_var_ = 0;
}

void ExoLinearModel::update(const double* u, double speed) {
  const int k = num_exo_;
  const double f = forget_;
  weight_ = f * weight_ + 1;
  const double a = 1 / weight_, keep = 1 - a;
  double* d = fit(scratch().work, static_cast<size_t>(k));
  bool finite = std::isfinite(weight_);
  for (int i = 0; i < k; ++i) d[i] = u[i] - u_mean_[i];
  const double dy = speed - y_mean_;
  for (int i = 0; i < k; ++i) {
    double* row = uu_.data() + static_cast<size_t>(i) * k;
    for (int j = 0; j < k; ++j) row[j] = f * row[j] + keep * d[i] * d[j];
    uy_[i] = f * uy_[i] + keep * d[i] * dy;
    u_mean_[i] += a * d[i];
    finite = finite && std::isfinite(row[i]) && std::isfinite(uy_[i]) && std::isfinite(u_mean_[i]);
  }
  y_mean_ += a * dy;
  if (!finite || !std::isfinite(y_mean_)) reset();  // overflowed (absurd but finite inputs): start afresh
}

void ExoLinearModel::reset() {
  weight_ = y_mean_ = resid_var_ = 0;
  std::fill(u_mean_.begin(), u_mean_.end(), 0.0);
  std::fill(uu_.begin(), uu_.end(), 0.0);
  std::fill(uy_.begin(), uy_.end(), 0.0);
}

void ExoLinearModel::save(StateWriter& w) const {
  w.put(weight_);
  w.put(y_mean_);
  w.put(resid_var_);
  w.put_vector(u_mean_);
  w.put_vector(uu_);
  w.put_vector(uy_);
}

void ExoLinearModel::load(StateReader& r) {
  weight_ = r.get<double>();
  y_mean_ = r.get<double>();
  resid_var_ = r.get<double>();
  read_same_size(r, u_mean_);
  read_same_size(r, uu_);
  read_same_size(r, uy_);
}

void ExoLinearModel::prefetch() const {
  for (const std::vector<double>* v : {&u_mean_, &uu_, &uy_}) {
    const char* p = reinterpret_cast<const char*>(v->data());
    for (size_t at = 0; at < v->size() * sizeof(double); at += 64) __builtin_prefetch(p + at);
  }
}

}  // namespace lbbsp::predictors
