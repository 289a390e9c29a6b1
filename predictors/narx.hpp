// NARX: a small tanh network y(t+1) = f(y(t..t-dy+1), u(t+1), u(t..t-du+1)) trained online on a sliding
// window.
//
// The network predicts the residual of the next speed over a base forecast (a performance-weighted blend of
// last value and three EMAs); the final prediction blends that base, its members, two proportional models, an
// exogenous linear model and the network's forecast by their recent squared errors, then clips it to a band
// around recently seen speeds. So it starts as (and cannot drift far from) the best simple baseline, and only
// leans on the network or the exogenous models where they have been paying off.
//
// The linear model regresses the speed on the coming step's exogenous inputs (speed ~ a + b . u) by
// exponentially weighted least squares (forgetting factor `forget`, ridge `ridge` on the standardised
// slopes): where the speed is proportional to the CPU available, as under trace replay, it learns that in a
// few steps, which the network, trained by small gradient steps on a residual, does not.
//
// The proportional models forecast speed = rho * u_k for one exogenous input k (`ratio`, default 0: the CPU
// share available, which the runtime passes first), rho an EMA (alpha 0.05 and 0.15) of the measured speed
// per unit of the u_k that was known before the step: no intercept to learn, so they follow a speed that
// scales with the available CPU faster and with less noise than the linear model. Their misses on steps where
// the input changed right after it was measured (and its new value explains the miss) are winsorised in their
// score.
//
// The code: narx.cpp the ensemble; narx_kernels.hpp the network's kernels; narx_exo.{hpp,cpp} the exogenous
// linear model; narx_state.cpp the saved state (narx/4).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "common/state_io.hpp"
#include "predictors/cache_aligned.hpp"
#include "predictors/narx_exo.hpp"
#include "predictors/predictor.hpp"
#include "predictors/rng.hpp"

namespace lbbsp::predictors {

// Defaults chosen with `lbbsp predict-eval` on ../shared/traces and on a telemetry-like series whose
// slowdowns are announced by the exogenous load (hidden 16 scored the same at twice the cost; 2 epochs learn
// the load effect faster than 1; sharper blending helped planetlab and bitbrains).
struct NarxOptions {
  int dy = 4;            // speed lags fed to the network
  int du = 2;            // past exogenous lags (the coming step's values are always an input too)
  int hidden = 8;        // tanh units
  int window = 64;       // training samples kept (sliding window)
  double lr = 0.01;      // Adam learning rate
  int epochs = 2;        // gradient steps per observation (bounded cost)
  int batch = 8;         // samples per gradient step (newest one always included)
  double sharp = 4;      // blend weights ~ (1 / recent MSE)^sharp
  double forget = 0.98;  // exogenous linear model: weight of the past per step (memory ~ 1 / (1 - forget))
  double ridge = 0.01;   // exogenous linear model: ridge on the slopes of the standardised inputs
  int ratio = 0;         // proportional models on this exogenous input (-1, or >= num_exo: none)
};

class NarxPredictor final : public Predictor {
 public:
  NarxPredictor(const NarxOptions& options, int num_exo, uint64_t seed);
  std::string name() const override { return "narx"; }
  void observe(double speed, const std::vector<double>& exo) override;
  double predict(const std::vector<double>& exo_next) override;
  std::string save_state() const override;
  void load_state(const std::string& state) override;
  void prefetch() const override;
  const NarxOptions& options() const { return options_; }

 private:
  // The candidate forecasts the prediction blends by their recent squared errors (indices into mse_ and
  // pending_candidates_, in the order of the saved state). The first kBase are the base forecast's members.
  enum Candidate : int {
    kLast = 0,       // the last good speed (persistence)
    kEmaFast = 1,    // EMA of the speed, alpha 0.5 (kEmaAlphas)
    kEmaMedium = 2,  // EMA of the speed, alpha 0.15
    kEmaSlow = 3,    // EMA of the speed, alpha 0.03
    kRatioSlow = 4,  // proportional model: speed = rho * u[ratio], rho an EMA with alpha 0.05 (kRatioAlphas)
    kRatioFast = 5,  // proportional model, rho an EMA with alpha 0.15
    kLinear = 6,     // exogenous linear model: speed ~ a + b . u, exponentially weighted least squares
    kNet = 7,        // the network: the base forecast plus the residual it predicts
    kCandidates = 8
  };
  static constexpr int kEmas = kEmaSlow - kEmaFast + 1;        // EMA levels kept (ema_)
  static constexpr int kBase = kEmaSlow + 1;                   // kLast and the EMAs blend into the base
  static constexpr int kRatios = kRatioFast - kRatioSlow + 1;  // proportional models kept (ratio_)
  static bool is_ratio(int candidate) { return candidate >= kRatioSlow && candidate <= kRatioFast; }
  static constexpr int kMaxDrawn = 64;  // batch indices drawn ahead at most
  int num_inputs() const;
  int num_params() const;
  void update_exo_stats(const std::vector<double>& exo);
  // Fills pending_* for the coming step (exo_next: its exogenous values, or null for persistence), in steps:
  // the base forecast, the network's inputs, the exogenous models' regressors, the candidates.
  void prepare(const double* exo_next);
  double base_forecast(const std::array<double, kCandidates>& c) const;
  const double* coming_exo(const double* exo_next) const;
  void fill_network_inputs(double base, double scale, const double* next);
  void fill_regressors(const double* next);
  void forecast_ratios(std::array<double, kCandidates>& c, double base) const;
  float forward(const float* x, float* hidden) const;
  void update_band();
  void draw_batches(int steps,
                    int batch);  // fills the scratch indices with `steps` batches, prefetches their rows
  void train_step(const int* idx, int batch);
  void adam_update(const float* grad);
  // observe() in steps: the scored step joins the window, training is planned, candidates are scored, the
  // exogenous models and the levels learn, then the network trains.
  struct TrainPlan {  // one observation's gradient steps, their batches drawn kMaxDrawn samples at a time
    int batch = 0, steps = 0, steps_per_draw = 1, drawn = 0;
  };
  void add_to_window(double speed);
  TrainPlan plan_training();
  void shift_exo_lags(const std::vector<double>& exo);
  std::array<double, kRatios> score_candidates(double speed, const std::vector<double>& exo);
  void learn_ratios(double speed, const std::array<double, kRatios>& ratio_u);
  void update_levels(double speed);
  void train(TrainPlan plan);
  void blend_weights(double* w, int count) const;
  // save_state() and load_state() in steps, in the order of the saved state (narx_state.cpp).
  void write_network(StateWriter& w) const;
  void write_levels(StateWriter& w) const;
  void write_forecasts(StateWriter& w) const;
  void write_window(StateWriter& w) const;
  void write_exo_models(StateWriter& w) const;
  void read_network(StateReader& r);
  void read_levels(StateReader& r);
  void read_forecasts(StateReader& r);
  void read_window(StateReader& r);
  void read_exo_models(StateReader& r);
  bool ratio_active() const { return options_.ratio >= 0 && options_.ratio < num_exo_; }

  NarxOptions options_;
  int num_exo_;
  Rng rng_;
  // The network is single precision (inputs and targets are normalised and clipped to +-6, so float loses
  // nothing that matters and halves the memory a fleet of thousands streams through each iteration).
  // Layout: W1 input-major (inputs x hidden, so a forward pass is `hidden` independent FMA lanes), b1, w2,
  // b2.
  std::vector<float> params_, adam_m_, adam_v_;
  int64_t adam_steps_ = 0;
  double adam_b1t_ = 1, adam_b2t_ = 1;  // 0.9^adam_steps_, 0.999^adam_steps_

  int64_t good_ = 0;  // good observations so far
  double y_mean_ = 0, y_var_ = 0, last_ = 0;
  std::array<double, kEmas> ema_{};
  std::vector<double> exo_mean_, exo_var_;
  std::vector<int64_t> exo_count_;
  std::vector<double> y_lags_;    // most recent first (dy)
  std::vector<double> exo_lags_;  // du blocks of num_exo, most recent first
  std::vector<double> recent_;    // ring of recent good speeds (for the clip band)
  int recent_head_ = 0;
  double recent_lo_ = 0, recent_hi_ = 0;  // min and max of recent_ (derived, not saved)
  std::array<double, kCandidates> mse_{};

  // The coming step's inputs and candidate forecasts, scored when its speed arrives. After an observation
  // they are stale until predict() (or the next observe()) prepares them: one forward pass per step, not two.
  bool pending_ = false, stale_ = false;
  std::vector<float> pending_x_;
  std::array<double, kCandidates> pending_candidates_{};
  double pending_base_ = 0, pending_scale_ = 1, last_prediction_ = 0;

  // The exogenous linear model (narx_exo.hpp) and the regressors of its pending forecast.
  ExoLinearModel linear_;
  std::vector<double> pending_u_;
  // Proportional models: speed per unit of the ratio input (0 until the first good step scored).
  std::array<double, kRatios> ratio_{};

  std::vector<float, CacheAligned<float>> buffer_x_;  // ring of (inputs, residual target)
  std::vector<float> buffer_y_;

  int buffer_count_ = 0, buffer_head_ = 0;
};

}  // namespace lbbsp::predictors
