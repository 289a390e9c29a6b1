// NARX's exogenous linear model: the speed regressed on the coming step's exogenous inputs
// (speed ~ a + b . u) by exponentially weighted least squares, with forgetting factor `forget` and ridge
// `ridge` on the slopes of the standardised inputs, its residuals winsorised (see narx.hpp for its part in
// the blend). It keeps its own state, saved inside the NARX state.
#pragma once
#include <vector>

#include "common/state_io.hpp"

namespace lbbsp::predictors {

class ExoLinearModel {
 public:
  ExoLinearModel(int num_exo, double forget, double ridge);
  // The forecast for regressors u (num_exo values), within [lo, hi], or `fallback` before it has data.
  double forecast(const double* u, double fallback, double lo, double hi) const;
  // Learns from a scored step: its regressors u, its speed and the forecast this model made for it.
  void learn(const double* u, double speed, double forecast);
  // Its part of the NARX state: weight, means, residual variance and the scatter matrices.
  void save(StateWriter& w) const;
  void load(StateReader& r);
  void prefetch() const;

 private:
  // The standardised slopes by ridge regression over the inputs that vary; false if the system is singular.
  bool solve_slopes(int* active, double* sd, double* slopes, int& m) const;
  void update(const double* u, double speed);
  void reset();

  int num_exo_;
  double forget_, ridge_;
  // Exponentially weighted total weight, means of the speed, running variance of the (winsorised)
  // residuals; means of the regressors, their scatter matrix (num_exo x num_exo) and cross scatter with
  // the speed.
  double weight_ = 0, y_mean_ = 0, resid_var_ = 0;
  std::vector<double> u_mean_, uu_, uy_;
};

}  // namespace lbbsp::predictors
