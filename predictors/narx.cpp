// NarxPredictor: the ensemble (forecast and blend, scoring, Adam training, observe). The network's kernels
// are in narx_kernels.hpp, the exogenous linear model in narx_exo.cpp, the saved state in narx_state.cpp.
#include "predictors/narx.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "predictors/narx_kernels.hpp"
#include "predictors/speed.hpp"

namespace lbbsp::predictors {
namespace {

constexpr std::array<double, 3> kEmaAlphas = {0.5, 0.15, 0.03};  // candidates kEmaFast, kEmaMedium, kEmaSlow
constexpr double kStatsAlpha = 0.01;  // online normalisation: ~100-step memory once warmed up
constexpr double kMseAlpha = 0.05;    // candidate scoring: ~20-step memory
constexpr double kClipInput = 6.0;    // normalised inputs and targets are clipped (outlier robustness)
constexpr double kWeightDecay = 1e-4;
// Proportional models (candidates kRatioSlow, kRatioFast): alphas of their EMAs of speed / u.
constexpr std::array<double, 2> kRatioAlphas = {0.05, 0.15};
// Candidate scoring: a proportional model's squared error on a step where its input moved right after it
// was measured, and the new value explains the miss, is winsorised at kScoreClip running RMS of the model's
// errors (floored at kScoreFloor of the speed's level) once kScoreWarm steps are scored. Under trace replay
// such stale inputs are 2% of the steps but 30% of the exogenous models' squared error, and say nothing about
// the next step. (Winsorising every large miss, or the linear model's too, cost 4-30% on raw bitbrains.)
constexpr double kScoreClip = 3.0;
constexpr double kScoreFloor = 0.01;
constexpr int64_t kScoreWarm = 10;

double clip(double v, double bound) {
  return std::clamp(v, -bound, bound);
}

void ew_update(double& mean, double& var, double value, int64_t count) {
  const double a = std::max(1.0 / static_cast<double>(count), kStatsAlpha);
  const double delta = value - mean;
  mean += a * delta;
  var = (1 - a) * (var + a * delta * delta);
}

// Per-thread scratch of the updates (not state): shared by every predictor a thread runs, so a fleet of
// thousands keeps it in L1 instead of streaming a cold copy per worker; grown on demand, never shrunk.
struct Scratch {
  std::vector<float> grad, hid, dh;
  std::vector<double> exo_clean;
  std::vector<int> idx;
  template <class T>
  static T* fit(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
  float* gradient(size_t n) {
    float* g = fit(grad, n);
    std::fill(g, g + n, 0.0f);
    return g;
  }
  float* hidden(int h) {
    fit(dh, static_cast<size_t>(h));
    return fit(hid, static_cast<size_t>(h));
  }
  double* exo(int n) { return fit(exo_clean, static_cast<size_t>(n)); }
  int* indices(int n) { return fit(idx, static_cast<size_t>(n)); }
};

Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

void validate(const NarxOptions& o, int num_exo) {
  if (o.dy < 1 || o.dy > 64) throw std::invalid_argument("narx dy must be in [1, 64]");
  if (o.du < 0 || o.du > 64) throw std::invalid_argument("narx du must be in [0, 64]");
  if (o.hidden < 1 || o.hidden > 1024) throw std::invalid_argument("narx hidden must be in [1, 1024]");
  if (o.window < 2 || o.window > 100000) throw std::invalid_argument("narx window must be in [2, 100000]");
  if (!(o.lr > 0 && o.lr < 1)) throw std::invalid_argument("narx lr must be in (0, 1)");
  if (o.epochs < 0 || o.epochs > 1000) throw std::invalid_argument("narx epochs must be in [0, 1000]");
  if (o.batch < 1 || o.batch > 4096) throw std::invalid_argument("narx batch must be in [1, 4096]");
  if (!(o.sharp >= 0 && o.sharp <= 16)) throw std::invalid_argument("narx sharp must be in [0, 16]");
  if (!(o.forget > 0 && o.forget <= 1)) throw std::invalid_argument("narx forget must be in (0, 1]");
  if (!(o.ridge >= 0 && o.ridge <= 1e6)) throw std::invalid_argument("narx ridge must be in [0, 1e6]");
  if (o.ratio < -1 || o.ratio > 4096) throw std::invalid_argument("narx ratio must be in [-1, 4096]");
  if (num_exo < 0) throw std::invalid_argument("narx num_exo must be >= 0");
}

// Validates before any member is sized (the linear model is a member, sized from num_exo).
const NarxOptions& validated(const NarxOptions& o, int num_exo) {
  validate(o, num_exo);
  return o;
}

template <class T>
void prefetch_all(const std::vector<T>& v) {
  const char* p = reinterpret_cast<const char*>(v.data());
  for (size_t at = 0; at < v.size() * sizeof(T); at += 64) __builtin_prefetch(p + at);
}

}  // namespace

NarxPredictor::NarxPredictor(const NarxOptions& o, int num_exo, uint64_t seed)
    : options_(validated(o, num_exo)),
      num_exo_(num_exo),
      rng_(seed ^ 0x6E617278ull),
      linear_(num_exo, o.forget, o.ridge) {
  const int n_in = num_inputs(), h = o.hidden;
  params_.assign(num_params(), 0.0f);
  const double w1_scale = 1.0 / std::sqrt(static_cast<double>(n_in));
  for (int j = 0; j < h; ++j)
    for (int i = 0; i < n_in; ++i) params_[i * h + j] = static_cast<float>(w1_scale * rng_.normal());
  const double w2_scale = 0.1 / std::sqrt(static_cast<double>(h));
  for (int j = 0; j < h; ++j) params_[h * n_in + h + j] = static_cast<float>(w2_scale * rng_.normal());
  adam_m_.assign(params_.size(), 0.0f);
  adam_v_.assign(params_.size(), 0.0f);
  exo_mean_.assign(num_exo, 0.0);
  exo_var_.assign(num_exo, 0.0);
  exo_count_.assign(num_exo, 0);
  y_lags_.assign(o.dy, 0.0);
  exo_lags_.assign(static_cast<size_t>(o.du) * num_exo, 0.0);
  recent_.assign(o.window, 0.0);
  pending_x_.assign(n_in, 0.0f);
  buffer_x_.assign(static_cast<size_t>(o.window) * n_in, 0.0f);
  buffer_y_.assign(o.window, 0.0f);
  pending_u_.assign(num_exo, 0.0);
}

// Inputs: dy speed lags, kEmas EMA levels (all relative to the base forecast, in units of the speed's std),
// then the coming step's exogenous values and du past ones (normalised online).
int NarxPredictor::num_inputs() const {
  return options_.dy + kEmas + (options_.du + 1) * num_exo_;
}
int NarxPredictor::num_params() const {
  return options_.hidden * (num_inputs() + 2) + 1;
}

void NarxPredictor::update_exo_stats(const std::vector<double>& exo) {
  if (static_cast<int>(exo.size()) != num_exo_) return;
  for (int k = 0; k < num_exo_; ++k)
    if (std::isfinite(exo[k])) ew_update(exo_mean_[k], exo_var_[k], exo[k], ++exo_count_[k]);
}

// ---- forecasting: the candidates for the coming step, and their blend ----

double NarxPredictor::predict(const std::vector<double>& exo_next) {
  if (good_ == 0) return kDefaultSpeed;
  if (static_cast<int>(exo_next.size()) == num_exo_ && num_exo_ > 0)
    prepare(exo_next.data());
  else if (stale_)
    prepare(nullptr);
  double w[kCandidates];
  blend_weights(w, kCandidates);
  double y = 0;
  for (int i = 0; i < kCandidates; ++i) y += w[i] * pending_candidates_[i];
  // Within a band around recently seen speeds (lo > 0: only good speeds enter recent_).
  y = std::isfinite(y) ? std::clamp(y, 0.5 * recent_lo_, 1.5 * recent_hi_) : last_;
  last_prediction_ = y;
  return y;
}

void NarxPredictor::blend_weights(double* w, int count) const {
  // Without a ratio input the proportional models take no part.
  const bool skip_ratio = !ratio_active() && count > kBase;
  auto skipped = [&](int i) { return skip_ratio && is_ratio(i); };
  double best = mse_[0];
  for (int i = 1; i < count; ++i)
    if (!skipped(i)) best = std::min(best, mse_[i]);
  double total = 0;
  for (int i = 0; i < count; ++i) {
    if (skipped(i)) {
      w[i] = 0;
      continue;
    }
    // Relative to the best, so the weights are scale-free; a tiny floor avoids 0/0 on constant series.
    const double ratio = (best + 1e-300) / (mse_[i] + 1e-300);
    const double r2 = ratio * ratio;
    w[i] = options_.sharp == 4 ? r2 * r2 : options_.sharp == 2 ? r2 : std::pow(ratio, options_.sharp);
    total += w[i];
  }
  for (int i = 0; i < count; ++i) w[i] /= total;
}

void NarxPredictor::prepare(const double* exo_next) {
  std::array<double, kCandidates> c{};
  c[kLast] = last_;
  for (int e = 0; e < kEmas; ++e) c[kEmaFast + e] = ema_[e];
  const double base = base_forecast(c);
  // Scale: the speed's running std, floored relative to its level so near-constant series stay well posed.
  const double scale = std::max(std::sqrt(y_var_), 1e-3 * std::abs(y_mean_) + 1e-12);
  const double* next = coming_exo(exo_next);
  fill_network_inputs(base, scale, next);
  c[kNet] = base + scale * static_cast<double>(forward(pending_x_.data(), scratch().hidden(options_.hidden)));
  fill_regressors(next);
  c[kLinear] = linear_.forecast(pending_u_.data(), base, 0.5 * recent_lo_, 1.5 * recent_hi_);
  forecast_ratios(c, base);
  pending_candidates_ = c;
  pending_base_ = base;
  pending_scale_ = scale;
  pending_ = true;
  stale_ = false;
}

// The base forecast: kLast and the EMAs, blended.
double NarxPredictor::base_forecast(const std::array<double, kCandidates>& c) const {
  double w[kCandidates];
  blend_weights(w, kBase);
  double base = 0;
  for (int i = 0; i < kBase; ++i) base += w[i] * c[i];
  return base;
}

// The coming step's exogenous values. Without them, the last measured ones stand in (persistence); missing
// or bad entries read as their running mean.
const double* NarxPredictor::coming_exo(const double* exo_next) const {
  if (exo_next) {
    double* clean = scratch().exo(num_exo_);
    for (int k = 0; k < num_exo_; ++k) clean[k] = std::isfinite(exo_next[k]) ? exo_next[k] : exo_mean_[k];
    return clean;
  }
  return options_.du > 0 ? exo_lags_.data() : exo_mean_.data();
}

// The network's inputs (num_inputs(), normalised and clipped) into pending_x_.
void NarxPredictor::fill_network_inputs(double base, double scale, const double* next) {
  float* x = pending_x_.data();
  int at = 0;
  for (int k = 0; k < options_.dy; ++k)
    x[at++] = static_cast<float>(clip((y_lags_[k] - base) / scale, kClipInput));
  for (int e = 0; e < kEmas; ++e) x[at++] = static_cast<float>(clip((ema_[e] - base) / scale, kClipInput));
  auto put_exo = [&](const double* u) {
    for (int k = 0; k < num_exo_; ++k) {
      const double sd = std::sqrt(exo_var_[k]) + 1e-12 * std::abs(exo_mean_[k]) + 1e-300;
      x[at++] = exo_var_[k] > 0 ? static_cast<float>(clip((u[k] - exo_mean_[k]) / sd, kClipInput)) : 0.0f;
    }
  };
  put_exo(next);
  for (int l = 0; l < options_.du; ++l) put_exo(exo_lags_.data() + static_cast<size_t>(l) * num_exo_);
}

// The exogenous models' regressors: the coming values, winsorised like the network's inputs (at +-6 running
// standard deviations), so one wild reading can neither dominate their fit nor their forecast.
void NarxPredictor::fill_regressors(const double* next) {
  for (int k = 0; k < num_exo_; ++k) {
    const double sd = std::sqrt(exo_var_[k]);
    pending_u_[k] = exo_var_[k] > 0
                        ? std::clamp(next[k], exo_mean_[k] - kClipInput * sd, exo_mean_[k] + kClipInput * sd)
                        : next[k];
  }
}

// The proportional models' forecasts, within the band (the base until they have a ratio and a positive
// input).
void NarxPredictor::forecast_ratios(std::array<double, kCandidates>& c, double base) const {
  for (int i = 0; i < kRatios; ++i) {
    const double u = ratio_active() ? pending_u_[options_.ratio] : 0.0;
    const double y = ratio_[i] * u;
    c[kRatioSlow + i] =
        u > 0 && ratio_[i] > 0 && std::isfinite(y) ? std::clamp(y, 0.5 * recent_lo_, 1.5 * recent_hi_) : base;
  }
}

// One sample through the network; hidden receives the tanh activations.
float NarxPredictor::forward(const float* x, float* hidden) const {
  return narx::forward(params_.data(), num_inputs(), options_.hidden, x, hidden);
}

// ---- observing: scoring, the levels and the exogenous models learn, the network trains ----

void NarxPredictor::observe(double speed, const std::vector<double>& exo) {
  if (stale_) prepare(nullptr);  // no predict() since the last observation: score the persistence forecast
  const bool good = is_good_speed(speed);
  const bool scored = good && pending_ && good_ > 0;  // a forecast for this step is pending
  if (scored) add_to_window(speed);
  const TrainPlan plan = good ? plan_training() : TrainPlan{};
  update_exo_stats(exo);
  shift_exo_lags(exo);
  std::copy_backward(y_lags_.begin(), y_lags_.end() - 1, y_lags_.end());
  if (!good) {
    // Missing step: the lag slot gets our own forecast; nothing is learned or scored.
    y_lags_[0] = good_ > 0 ? (last_prediction_ > 0 ? last_prediction_ : last_) : 0.0;
    stale_ = good_ > 0;
    return;
  }
  y_lags_[0] = speed;
  if (scored) {
    learn_ratios(speed, score_candidates(speed, exo));
    linear_.learn(pending_u_.data(), speed, pending_candidates_[kLinear]);
  }
  update_levels(speed);
  train(plan);
  stale_ = true;
}

// The scored step (its inputs, and its speed as the residual target) joins the training window.
void NarxPredictor::add_to_window(double speed) {
  const int n_in = num_inputs();
  std::copy(pending_x_.begin(), pending_x_.end(),
            buffer_x_.begin() + static_cast<size_t>(buffer_head_) * n_in);
  buffer_y_[buffer_head_] = static_cast<float>(clip((speed - pending_base_) / pending_scale_, kClipInput));
  buffer_head_ = (buffer_head_ + 1) % options_.window;
  buffer_count_ = std::min(buffer_count_ + 1, options_.window);
}

void NarxPredictor::shift_exo_lags(const std::vector<double>& exo) {
  if (options_.du == 0 || num_exo_ == 0) return;
  std::copy_backward(exo_lags_.begin(), exo_lags_.end() - num_exo_, exo_lags_.end());
  const bool sized = static_cast<int>(exo.size()) == num_exo_;
  for (int k = 0; k < num_exo_; ++k)  // missing or bad entries read as their running mean
    exo_lags_[k] = sized && std::isfinite(exo[k]) ? exo[k] : exo_mean_[k];
}

// Updates every candidate's recent squared error with this step's miss. A proportional model's miss that the
// ratio input's new measurement explains (the input changed just after it was measured) is winsorised once
// warmed up (see kScoreClip), and the model learns from the new value: the one the step ran with. Returns
// the ratio input each proportional model learns from.
std::array<double, NarxPredictor::kRatios> NarxPredictor::score_candidates(double speed,
                                                                           const std::vector<double>& exo) {
  const int k = options_.ratio;
  const bool moved = ratio_active() && static_cast<int>(exo.size()) == num_exo_ && std::isfinite(exo[k]) &&
                     exo[k] > 0 && exo[k] != pending_u_[k];
  std::array<double, kRatios> ratio_u{};
  const double floor = kScoreFloor * kScoreFloor * pending_base_ * pending_base_;
  for (int i = 0; i < kCandidates; ++i) {
    const double err = pending_candidates_[i] - speed;
    double e2 = err * err;
    if (ratio_active() && is_ratio(i)) {
      const int m = i - kRatioSlow;
      ratio_u[m] = pending_u_[k];
      const double explained = moved ? ratio_[m] * exo[k] - speed : 0.0;
      if (moved && ratio_[m] > 0 && explained * explained < e2) {
        ratio_u[m] = exo[k];
        if (good_ > kScoreWarm) e2 = std::min(e2, kScoreClip * kScoreClip * std::max(mse_[i], floor));
      }
    }
    mse_[i] += std::max(1.0 / static_cast<double>(good_), kMseAlpha) * (e2 - mse_[i]);
  }
  return ratio_u;
}

// The proportional models learn the speed per unit of the ratio input, the speed clipped to the band around
// recent speeds (a glitch moves them little; a lasting change widens the band).
void NarxPredictor::learn_ratios(double speed, const std::array<double, kRatios>& ratio_u) {
  for (int m = 0; m < kRatios && ratio_active(); ++m) {
    const double r = std::clamp(speed, 0.5 * recent_lo_, 1.5 * recent_hi_) / ratio_u[m];
    if (ratio_u[m] > 0 && std::isfinite(r) && r > 0)
      ratio_[m] = ratio_[m] > 0 ? ratio_[m] + kRatioAlphas[m] * (r - ratio_[m]) : r;
  }
}

// A good speed: the running statistics, last value, EMAs and the band of recent speeds.
void NarxPredictor::update_levels(double speed) {
  ++good_;
  if (good_ == 1) {
    std::fill(y_lags_.begin(), y_lags_.end(), speed);
    ema_.fill(speed);
    std::fill(recent_.begin(), recent_.end(), speed);
    recent_lo_ = recent_hi_ = speed;
  }
  ew_update(y_mean_, y_var_, speed, good_);
  last_ = speed;
  for (int e = 0; e < kEmas; ++e) ema_[e] += kEmaAlphas[e] * (speed - ema_[e]);
  const double evicted = recent_[recent_head_];
  recent_[recent_head_] = speed;
  recent_head_ = (recent_head_ + 1) % options_.window;
  if (evicted == recent_lo_ || evicted == recent_hi_) {
    update_band();  // the old extreme may have left the window
  } else {
    recent_lo_ = std::min(recent_lo_, speed);
    recent_hi_ = std::max(recent_hi_, speed);
  }
}

void NarxPredictor::update_band() {
  auto [lo, hi] = std::minmax_element(recent_.begin(), recent_.end());
  recent_lo_ = *lo;
  recent_hi_ = *hi;
}

// ---- training: batches from the window, gradient steps by Adam ----

// Draws this observation's training batches first (the same random sequence as drawing them step by step: the
// window does not change while training) and prefetches their rows: with thousands of workers the window is
// rarely in cache, and the misses then overlap with the bookkeeping before train().
NarxPredictor::TrainPlan NarxPredictor::plan_training() {
  TrainPlan plan;
  plan.batch = std::min(options_.batch, buffer_count_);
  plan.steps = buffer_count_ > 0 ? options_.epochs : 0;
  plan.steps_per_draw = std::max(1, kMaxDrawn / std::max(plan.batch, 1));
  plan.drawn = std::min(plan.steps, plan.steps_per_draw);
  draw_batches(plan.drawn, plan.batch);
  return plan;
}

void NarxPredictor::draw_batches(int steps, int batch) {
  // The newest sample is always in a batch; the rest are drawn from the window.
  const int n_in = num_inputs();
  const int newest = (buffer_head_ + options_.window - 1) % options_.window;
  int* idx = scratch().indices(steps * batch);
  for (int k = 0; k < steps * batch; ++k) {
    idx[k] =
        k % batch == 0
            ? newest
            : static_cast<int>((newest + options_.window - rng_.below_fast(buffer_count_)) % options_.window);
    __builtin_prefetch(buffer_x_.data() + static_cast<size_t>(idx[k]) * n_in);
  }
}

// The planned gradient steps; the first group of batches was drawn by plan_training().
void NarxPredictor::train(TrainPlan plan) {
  for (int s = 0, at = 0; s < plan.steps; ++s, ++at) {
    if (at == plan.drawn) {  // more steps than kMaxDrawn samples: draw the next group
      plan.drawn = std::min(plan.steps - s, plan.steps_per_draw);
      draw_batches(plan.drawn, plan.batch);
      at = 0;
    }
    train_step(scratch().idx.data() + static_cast<size_t>(at) * plan.batch, plan.batch);
  }
}

void NarxPredictor::train_step(const int* idx, int batch) {
  const int n_in = num_inputs(), h = options_.hidden;
  Scratch& sc = scratch();
  float* __restrict grad = sc.gradient(params_.size());
  float* hidden = sc.hidden(h);
  float* dh = sc.dh.data();
  const float weight = 1.0f / static_cast<float>(batch);
  const float* w = params_.data();
  for (int b = 0; b < batch; ++b) {
    const float* x = buffer_x_.data() + static_cast<size_t>(idx[b]) * n_in;
    narx::accumulate(w, n_in, h, x, buffer_y_[idx[b]], weight, grad, hidden, dh);
  }
  adam_update(grad);
}

// One Adam step on the parameters, the weight decay (L2) added to the gradient.
void NarxPredictor::adam_update(const float* __restrict grad) {
  ++adam_steps_;
  // Bias corrections from the running powers b1^t, b2^t (no pow per step).
  adam_b1t_ = adam_b1t_ < 1e-30 ? 0.0 : adam_b1t_ * 0.9;  // flushed to 0 before it turns denormal
  adam_b2t_ = adam_b2t_ < 1e-30 ? 0.0 : adam_b2t_ * 0.999;
  const double c1 = 1 - adam_b1t_, c2 = 1 - adam_b2t_;
  const float step = static_cast<float>(options_.lr * std::sqrt(c2) / c1);
  const float fb1 = 0.9f, fb2 = 0.999f, decay = static_cast<float>(kWeightDecay);
  float* __restrict p = params_.data();
  float* __restrict m = adam_m_.data();
  float* __restrict v = adam_v_.data();
  const size_t count = params_.size();
  for (size_t i = 0; i < count; ++i) {
    const float g = grad[i] + decay * p[i];
    m[i] = fb1 * m[i] + (1 - fb1) * g;
    v[i] = fb2 * v[i] + (1 - fb2) * g * g;
    p[i] -= step * m[i] / (std::sqrt(v[i]) + 1e-8f);
  }
}

void NarxPredictor::prefetch() const {
  // Everything an update reads in full (the window rows are prefetched when the batches are drawn).
  const char* self = reinterpret_cast<const char*>(this);
  for (size_t at = 0; at < sizeof(*this); at += 64) __builtin_prefetch(self + at);
  prefetch_all(params_);
  prefetch_all(adam_m_);
  prefetch_all(adam_v_);
  prefetch_all(recent_);
  prefetch_all(buffer_y_);
  prefetch_all(y_lags_);
  prefetch_all(exo_lags_);
  prefetch_all(exo_mean_);
  prefetch_all(exo_var_);
  prefetch_all(exo_count_);
  prefetch_all(pending_x_);
  linear_.prefetch();
  prefetch_all(pending_u_);
}

}  // namespace lbbsp::predictors
