// NARX: a small tanh network y(t+1) = f(y(t..t-dy+1), u(t+1), u(t..t-du+1)) trained online on a sliding
// window.
//
// The network predicts the residual of the next speed over a base forecast (a performance-weighted blend of
// last value and three EMAs); the final prediction blends that base, its members and the network's forecast
// by their recent squared errors, then clips it to a band around recently seen speeds. So it starts as (and
// cannot drift far from) the best simple baseline, and only leans on the network where it has been paying
// off.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "predictors/predictor.hpp"
#include "predictors/state_io.hpp"

namespace lbbsp::predictors {

// Defaults chosen with `lbbsp predict-eval` on ../shared/traces and on a telemetry-like series whose
// slowdowns are announced by the exogenous load (hidden 16 scored the same at twice the cost; 2 epochs learn
// the load effect faster than 1; sharper blending helped planetlab and bitbrains).
struct NarxOptions {
  int dy = 4;        // speed lags fed to the network
  int du = 2;        // past exogenous lags (the coming step's values are always an input too)
  int hidden = 8;    // tanh units
  int window = 64;   // training samples kept (sliding window)
  double lr = 0.01;  // Adam learning rate
  int epochs = 2;    // gradient steps per observation (bounded cost)
  int batch = 8;     // samples per gradient step (newest one always included)
  double sharp = 4;  // blend weights ~ (1 / recent MSE)^sharp
};

class NarxPredictor final : public Predictor {
 public:
  NarxPredictor(const NarxOptions& options, int num_exo, uint64_t seed);
  std::string name() const override { return "narx"; }
  void observe(double speed, const std::vector<double>& exo) override;
  double predict(const std::vector<double>& exo_next) override;
  std::string save_state() const override;
  void load_state(const std::string& state) override;
  const NarxOptions& options() const { return options_; }

 private:
  static constexpr int kEmas = 3;
  static constexpr int kCandidates = 2 + kEmas;  // last, EMAs, network
  int num_inputs() const;
  int num_params() const;
  std::vector<double> clean_exo(const std::vector<double>& exo) const;
  void update_exo_stats(const std::vector<double>& exo);
  void prepare(const std::vector<double>& exo_next);  // fills pending_* for the coming step
  double forward(const double* x, double* hidden) const;
  void train_step();
  void blend_weights(double* w, int count) const;

  NarxOptions options_;
  int num_exo_;
  Rng rng_;
  std::vector<double> params_, adam_m_, adam_v_;  // W1 (hidden x inputs), b1, w2, b2
  int64_t adam_steps_ = 0;

  int64_t good_ = 0;  // good observations so far
  double y_mean_ = 0, y_var_ = 0, last_ = 0;
  std::array<double, kEmas> ema_{};
  std::vector<double> exo_mean_, exo_var_;
  std::vector<int64_t> exo_count_;
  std::vector<double> y_lags_;    // most recent first (dy)
  std::vector<double> exo_lags_;  // du blocks of num_exo, most recent first
  std::vector<double> recent_;    // ring of recent good speeds (for the clip band)
  int recent_head_ = 0;
  std::array<double, kCandidates> mse_{};

  // The coming step's inputs and candidate forecasts, scored when its speed arrives.
  bool pending_ = false;
  std::vector<double> pending_x_;
  std::array<double, kCandidates> pending_candidates_{};
  double pending_base_ = 0, pending_scale_ = 1, last_prediction_ = 0;

  std::vector<double> buffer_x_, buffer_y_;  // ring of (inputs, residual target)

  std::vector<double> grad_, hidden_;  // scratch (not state): no allocation per update
  int buffer_count_ = 0, buffer_head_ = 0;
};

}  // namespace lbbsp::predictors
