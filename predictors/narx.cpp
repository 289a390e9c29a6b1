#include "predictors/narx.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace lbbsp::predictors {
namespace {

constexpr std::array<double, 3> kEmaAlphas = {0.5, 0.15, 0.03};
constexpr double kStatsAlpha = 0.01;  // online normalisation: ~100-step memory once warmed up
constexpr double kMseAlpha = 0.05;    // candidate scoring: ~20-step memory
constexpr double kClipInput = 6.0;    // normalised inputs and targets are clipped (outlier robustness)
constexpr double kWeightDecay = 1e-4;

double clip(double v, double bound) {
  return std::clamp(v, -bound, bound);
}

// tanh by a [7/6] Pade approximant clamped at +-4.97 (abs. error < 1e-4 everywhere): several times
// cheaper than std::tanh and vectorisable; the NARX update cost is dominated by it otherwise.
inline double fast_tanh(double x) {
  x = std::clamp(x, -4.97, 4.97);
  const double x2 = x * x;
  const double num = x * (135135.0 + x2 * (17325.0 + x2 * (378.0 + x2)));
  const double den = 135135.0 + x2 * (62370.0 + x2 * (3150.0 + 28.0 * x2));
  return std::clamp(num / den, -1.0, 1.0);
}

void ew_update(double& mean, double& var, double value, int64_t count) {
  const double a = std::max(1.0 / static_cast<double>(count), kStatsAlpha);
  const double delta = value - mean;
  mean += a * delta;
  var = (1 - a) * (var + a * delta * delta);
}

}  // namespace

NarxPredictor::NarxPredictor(const NarxOptions& o, int num_exo, uint64_t seed)
    : options_(o), num_exo_(num_exo), rng_(seed ^ 0x6E617278ull) {
  if (o.dy < 1 || o.dy > 64) throw std::invalid_argument("narx dy must be in [1, 64]");
  if (o.du < 0 || o.du > 64) throw std::invalid_argument("narx du must be in [0, 64]");
  if (o.hidden < 1 || o.hidden > 1024) throw std::invalid_argument("narx hidden must be in [1, 1024]");
  if (o.window < 2 || o.window > 100000) throw std::invalid_argument("narx window must be in [2, 100000]");
  if (!(o.lr > 0 && o.lr < 1)) throw std::invalid_argument("narx lr must be in (0, 1)");
  if (o.epochs < 0 || o.epochs > 1000) throw std::invalid_argument("narx epochs must be in [0, 1000]");
  if (o.batch < 1 || o.batch > 4096) throw std::invalid_argument("narx batch must be in [1, 4096]");
  if (!(o.sharp >= 0 && o.sharp <= 16)) throw std::invalid_argument("narx sharp must be in [0, 16]");
  if (num_exo < 0) throw std::invalid_argument("narx num_exo must be >= 0");
  const int n_in = num_inputs(), h = o.hidden;
  params_.assign(num_params(), 0.0);
  const double w1_scale = 1.0 / std::sqrt(static_cast<double>(n_in));
  for (int i = 0; i < h * n_in; ++i) params_[i] = w1_scale * rng_.normal();
  const double w2_scale = 0.1 / std::sqrt(static_cast<double>(h));
  for (int j = 0; j < h; ++j) params_[h * n_in + h + j] = w2_scale * rng_.normal();
  adam_m_.assign(params_.size(), 0.0);
  grad_.assign(params_.size(), 0.0);
  hidden_.assign(o.hidden, 0.0);
  adam_v_.assign(params_.size(), 0.0);
  exo_mean_.assign(num_exo, 0.0);
  exo_var_.assign(num_exo, 0.0);
  exo_count_.assign(num_exo, 0);
  y_lags_.assign(o.dy, 0.0);
  exo_lags_.assign(static_cast<size_t>(o.du) * num_exo, 0.0);
  recent_.assign(o.window, 0.0);
  pending_x_.assign(n_in, 0.0);
  buffer_x_.assign(static_cast<size_t>(o.window) * n_in, 0.0);
  buffer_y_.assign(o.window, 0.0);
}

// Inputs: dy speed lags, kEmas EMA levels (all relative to the base forecast, in units of the speed's std),
// then the coming step's exogenous values and du past ones (normalised online).
int NarxPredictor::num_inputs() const {
  return options_.dy + kEmas + (options_.du + 1) * num_exo_;
}
int NarxPredictor::num_params() const {
  return options_.hidden * (num_inputs() + 2) + 1;
}

std::vector<double> NarxPredictor::clean_exo(const std::vector<double>& exo) const {
  std::vector<double> out(exo_mean_);  // missing or bad entries read as their running mean
  if (static_cast<int>(exo.size()) != num_exo_) return out;
  for (int k = 0; k < num_exo_; ++k)
    if (std::isfinite(exo[k])) out[k] = exo[k];
  return out;
}

void NarxPredictor::update_exo_stats(const std::vector<double>& exo) {
  if (static_cast<int>(exo.size()) != num_exo_) return;
  for (int k = 0; k < num_exo_; ++k)
    if (std::isfinite(exo[k])) ew_update(exo_mean_[k], exo_var_[k], exo[k], ++exo_count_[k]);
}

void NarxPredictor::blend_weights(double* w, int count) const {
  double best = mse_[0];
  for (int i = 1; i < count; ++i) best = std::min(best, mse_[i]);
  double total = 0;
  for (int i = 0; i < count; ++i) {
    // Relative to the best, so the weights are scale-free; a tiny floor avoids 0/0 on constant series.
    const double ratio = (best + 1e-300) / (mse_[i] + 1e-300);
    const double r2 = ratio * ratio;
    w[i] = options_.sharp == 4 ? r2 * r2 : options_.sharp == 2 ? r2 : std::pow(ratio, options_.sharp);
    total += w[i];
  }
  for (int i = 0; i < count; ++i) w[i] /= total;
}

double NarxPredictor::forward(const double* x, double* hidden) const {
  const int n_in = num_inputs(), h = options_.hidden;
  const double* w1 = params_.data();
  const double* b1 = w1 + h * n_in;
  const double* w2 = b1 + h;
  double out = w2[h];  // b2
  for (int j = 0; j < h; ++j) {
    double a = b1[j];
    const double* row = w1 + j * n_in;
    for (int i = 0; i < n_in; ++i) a += row[i] * x[i];
    hidden[j] = fast_tanh(a);
    out += w2[j] * hidden[j];
  }
  return out;
}

void NarxPredictor::prepare(const std::vector<double>& exo_next) {
  std::array<double, kCandidates> c{};
  c[0] = last_;
  for (int e = 0; e < kEmas; ++e) c[1 + e] = ema_[e];
  double w[kCandidates];
  blend_weights(w, kCandidates - 1);
  double base = 0;
  for (int i = 0; i < kCandidates - 1; ++i) base += w[i] * c[i];
  // Scale: the speed's running std, floored relative to its level so near-constant series stay well posed.
  const double scale = std::max(std::sqrt(y_var_), 1e-3 * std::abs(y_mean_) + 1e-12);
  double* x = pending_x_.data();
  int at = 0;
  for (int k = 0; k < options_.dy; ++k) x[at++] = clip((y_lags_[k] - base) / scale, kClipInput);
  for (int e = 0; e < kEmas; ++e) x[at++] = clip((ema_[e] - base) / scale, kClipInput);
  const std::vector<double> next = clean_exo(exo_next);
  auto put_exo = [&](const double* u) {
    for (int k = 0; k < num_exo_; ++k) {
      const double sd = std::sqrt(exo_var_[k]) + 1e-12 * std::abs(exo_mean_[k]) + 1e-300;
      x[at++] = exo_var_[k] > 0 ? clip((u[k] - exo_mean_[k]) / sd, kClipInput) : 0.0;
    }
  };
  // Without values for the coming step, the last measured ones stand in (persistence).
  const bool have_next = static_cast<int>(exo_next.size()) == num_exo_;
  put_exo(have_next ? next.data() : (options_.du > 0 ? exo_lags_.data() : next.data()));
  for (int l = 0; l < options_.du; ++l) put_exo(exo_lags_.data() + static_cast<size_t>(l) * num_exo_);
  c[kCandidates - 1] = base + scale * forward(x, hidden_.data());
  pending_candidates_ = c;
  pending_base_ = base;
  pending_scale_ = scale;
  pending_ = true;
}

void NarxPredictor::observe(double speed, const std::vector<double>& exo) {
  update_exo_stats(exo);
  const std::vector<double> u = clean_exo(exo);
  if (options_.du > 0) {
    std::copy_backward(exo_lags_.begin(), exo_lags_.end() - num_exo_, exo_lags_.end());
    std::copy(u.begin(), u.end(), exo_lags_.begin());
  }
  std::copy_backward(y_lags_.begin(), y_lags_.end() - 1, y_lags_.end());
  if (!is_good_speed(speed)) {
    // Missing step: the lag slot gets our own forecast; nothing is learned or scored.
    y_lags_[0] = good_ > 0 ? (last_prediction_ > 0 ? last_prediction_ : last_) : 0.0;
    if (good_ > 0) prepare({});
    return;
  }
  y_lags_[0] = speed;
  if (pending_ && good_ > 0) {
    for (int i = 0; i < kCandidates; ++i) {
      const double err = pending_candidates_[i] - speed;
      mse_[i] += std::max(1.0 / static_cast<double>(good_), kMseAlpha) * (err * err - mse_[i]);
    }
    const int n_in = num_inputs();
    std::copy(pending_x_.begin(), pending_x_.end(),
              buffer_x_.begin() + static_cast<size_t>(buffer_head_) * n_in);
    buffer_y_[buffer_head_] = clip((speed - pending_base_) / pending_scale_, kClipInput);
    buffer_head_ = (buffer_head_ + 1) % options_.window;
    buffer_count_ = std::min(buffer_count_ + 1, options_.window);
  }
  ++good_;
  if (good_ == 1) {
    std::fill(y_lags_.begin(), y_lags_.end(), speed);
    ema_.fill(speed);
    std::fill(recent_.begin(), recent_.end(), speed);
  }
  ew_update(y_mean_, y_var_, speed, good_);
  last_ = speed;
  for (int e = 0; e < kEmas; ++e) ema_[e] += kEmaAlphas[e] * (speed - ema_[e]);
  recent_[recent_head_] = speed;
  recent_head_ = (recent_head_ + 1) % options_.window;
  for (int s = 0; s < options_.epochs && buffer_count_ > 0; ++s) train_step();
  prepare({});
}

void NarxPredictor::train_step() {
  const int n_in = num_inputs(), h = options_.hidden;
  const int newest = (buffer_head_ + options_.window - 1) % options_.window;
  const int batch = std::min(options_.batch, buffer_count_);
  std::vector<double>& grad = grad_;
  std::fill(grad.begin(), grad.end(), 0.0);
  double* hidden = hidden_.data();
  double* g_w1 = grad.data();
  double* g_b1 = g_w1 + h * n_in;
  double* g_w2 = g_b1 + h;
  const double* w2 = params_.data() + h * n_in + h;
  for (int b = 0; b < batch; ++b) {
    // The newest sample is always in the batch; the rest are drawn from the window.
    const int idx =
        b == 0 ? newest
               : static_cast<int>((newest + options_.window - rng_.below(buffer_count_)) % options_.window);
    const double* x = buffer_x_.data() + static_cast<size_t>(idx) * n_in;
    const double d_out = (forward(x, hidden) - buffer_y_[idx]) / batch;
    g_w2[h] += d_out;
    for (int j = 0; j < h; ++j) {
      g_w2[j] += d_out * hidden[j];
      const double dh = d_out * w2[j] * (1 - hidden[j] * hidden[j]);
      g_b1[j] += dh;
      double* row = g_w1 + j * n_in;
      for (int i = 0; i < n_in; ++i) row[i] += dh * x[i];
    }
  }
  ++adam_steps_;
  const double b1 = 0.9, b2 = 0.999;
  // Bias corrections; past ~10^4 steps they are 1 to double precision, so skip the pow there.
  const double c1 = adam_steps_ > 10000 ? 1.0 : 1 - std::pow(b1, static_cast<double>(adam_steps_));
  const double c2 = adam_steps_ > 100000 ? 1.0 : 1 - std::pow(b2, static_cast<double>(adam_steps_));
  const double step = options_.lr * std::sqrt(c2) / c1;
  for (size_t i = 0; i < params_.size(); ++i) {
    const double g = grad[i] + kWeightDecay * params_[i];
    adam_m_[i] = b1 * adam_m_[i] + (1 - b1) * g;
    adam_v_[i] = b2 * adam_v_[i] + (1 - b2) * g * g;
    params_[i] -= step * adam_m_[i] / (std::sqrt(adam_v_[i]) + 1e-8);
  }
}

double NarxPredictor::predict(const std::vector<double>& exo_next) {
  if (good_ == 0) return kDefaultSpeed;
  if (static_cast<int>(exo_next.size()) == num_exo_ && num_exo_ > 0) prepare(exo_next);
  double w[kCandidates];
  blend_weights(w, kCandidates);
  double y = 0;
  for (int i = 0; i < kCandidates; ++i) y += w[i] * pending_candidates_[i];
  auto [lo, hi] = std::minmax_element(recent_.begin(), recent_.end());
  // Within a band around recently seen speeds (lo > 0: only good speeds enter recent_).
  y = std::isfinite(y) ? std::clamp(y, 0.5 * *lo, 1.5 * *hi) : last_;
  last_prediction_ = y;
  return y;
}

std::string NarxPredictor::save_state() const {
  StateWriter w("narx/1");
  w.put(options_.dy);
  w.put(options_.du);
  w.put(options_.hidden);
  w.put(options_.window);
  w.put(options_.lr);
  w.put(options_.epochs);
  w.put(options_.batch);
  w.put(options_.sharp);
  w.put(num_exo_);
  w.put(rng_.state());
  w.put_vector(params_);
  w.put_vector(adam_m_);
  w.put_vector(adam_v_);
  w.put(adam_steps_);
  w.put(good_);
  w.put(y_mean_);
  w.put(y_var_);
  w.put(last_);
  w.put(ema_);
  w.put_vector(exo_mean_);
  w.put_vector(exo_var_);
  w.put_vector(exo_count_);
  w.put_vector(y_lags_);
  w.put_vector(exo_lags_);
  w.put_vector(recent_);
  w.put(recent_head_);
  w.put(mse_);
  w.put(pending_);
  w.put_vector(pending_x_);
  w.put(pending_candidates_);
  w.put(pending_base_);
  w.put(pending_scale_);
  w.put(last_prediction_);
  w.put_vector(buffer_x_);
  w.put_vector(buffer_y_);
  w.put(buffer_count_);
  w.put(buffer_head_);
  return w.str();
}

void NarxPredictor::load_state(const std::string& state) {
  StateReader r(state, "narx/1");
  NarxOptions o;
  o.dy = r.get<int>();
  o.du = r.get<int>();
  o.hidden = r.get<int>();
  o.window = r.get<int>();
  o.lr = r.get<double>();
  o.epochs = r.get<int>();
  o.batch = r.get<int>();
  o.sharp = r.get<double>();
  const int num_exo = r.get<int>();
  NarxPredictor p(o, num_exo, 0);  // validates options and sizes every buffer
  p.rng_.set_state(r.get<uint64_t>());
  auto same_size = [](std::vector<auto>& dst, auto&& src) {
    if (src.size() != dst.size()) throw std::invalid_argument("narx state has inconsistent sizes");
    dst = std::move(src);
  };
  same_size(p.params_, r.get_vector<double>());
  same_size(p.adam_m_, r.get_vector<double>());
  same_size(p.adam_v_, r.get_vector<double>());
  p.adam_steps_ = r.get<int64_t>();
  p.good_ = r.get<int64_t>();
  p.y_mean_ = r.get<double>();
  p.y_var_ = r.get<double>();
  p.last_ = r.get<double>();
  p.ema_ = r.get<std::array<double, kEmas>>();
  same_size(p.exo_mean_, r.get_vector<double>());
  same_size(p.exo_var_, r.get_vector<double>());
  same_size(p.exo_count_, r.get_vector<int64_t>());
  same_size(p.y_lags_, r.get_vector<double>());
  same_size(p.exo_lags_, r.get_vector<double>());
  same_size(p.recent_, r.get_vector<double>());
  p.recent_head_ = r.get<int>();
  p.mse_ = r.get<std::array<double, kCandidates>>();
  p.pending_ = r.get<bool>();
  same_size(p.pending_x_, r.get_vector<double>());
  p.pending_candidates_ = r.get<std::array<double, kCandidates>>();
  p.pending_base_ = r.get<double>();
  p.pending_scale_ = r.get<double>();
  p.last_prediction_ = r.get<double>();
  same_size(p.buffer_x_, r.get_vector<double>());
  same_size(p.buffer_y_, r.get_vector<double>());
  p.buffer_count_ = r.get<int>();
  p.buffer_head_ = r.get<int>();
  r.finish();
  if (p.recent_head_ < 0 || p.recent_head_ >= p.options_.window || p.buffer_head_ < 0 ||
      p.buffer_head_ >= p.options_.window || p.buffer_count_ < 0 || p.buffer_count_ > p.options_.window)
    throw std::invalid_argument("narx state has out-of-range indices");
  *this = std::move(p);
}

}  // namespace lbbsp::predictors
