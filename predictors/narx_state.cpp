// NarxPredictor's saved state (format narx/4): its writer and its reader.
#include <stdexcept>
#include <utility>

#include "predictors/narx.hpp"

namespace lbbsp::predictors {
namespace {

constexpr const char* kStateTag = "narx/4";  // the one format read: docs/checkpoints.md

template <class T>
void same_size(std::vector<T>& dst, std::vector<T>&& src) {
  if (src.size() != dst.size()) throw std::invalid_argument("narx state has inconsistent sizes");
  dst = std::move(src);
}

void write_options(StateWriter& w, const NarxOptions& o) {
  w.put(o.dy);
  w.put(o.du);
  w.put(o.hidden);
  w.put(o.window);
  w.put(o.lr);
  w.put(o.epochs);
  w.put(o.batch);
  w.put(o.sharp);
  w.put(o.forget);
  w.put(o.ridge);
  w.put(o.ratio);
}

NarxOptions read_options(StateReader& r) {
  NarxOptions o;
  o.dy = r.get<int>();
  o.du = r.get<int>();
  o.hidden = r.get<int>();
  o.window = r.get<int>();
  o.lr = r.get<double>();
  o.epochs = r.get<int>();
  o.batch = r.get<int>();
  o.sharp = r.get<double>();
  o.forget = r.get<double>();
  o.ridge = r.get<double>();
  o.ratio = r.get<int>();
  return o;
}

}  // namespace

// ---- narx/4: options, the network, the levels, the pending forecast, the window, the exogenous models ----

std::string NarxPredictor::save_state() const {
  StateWriter w(StateOf::predictor, kStateTag);
  write_options(w, options_);
  w.put(num_exo_);
  w.put(rng_.state());
  write_network(w);
  write_levels(w);
  write_forecasts(w);
  write_window(w);
  write_exo_models(w);
  return w.str();
}

void NarxPredictor::write_network(StateWriter& w) const {
  w.put_vector(params_);
  w.put_vector(adam_m_);
  w.put_vector(adam_v_);
  w.put(adam_steps_);
  w.put(adam_b1t_);
  w.put(adam_b2t_);
}

void NarxPredictor::write_levels(StateWriter& w) const {
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
}

void NarxPredictor::write_forecasts(StateWriter& w) const {
  w.put(mse_);
  w.put(pending_);
  w.put(stale_);
  w.put_vector(pending_x_);
  w.put(pending_candidates_);
  w.put(pending_base_);
  w.put(pending_scale_);
  w.put(last_prediction_);
}

void NarxPredictor::write_window(StateWriter& w) const {
  w.put_vector(buffer_x_);
  w.put_vector(buffer_y_);
  w.put(buffer_count_);
  w.put(buffer_head_);
}

void NarxPredictor::write_exo_models(StateWriter& w) const {
  linear_.save(w);
  w.put_vector(pending_u_);
  w.put(ratio_);
}

// ---- reading narx/4 ----

void NarxPredictor::load_state(const std::string& state) {
  StateReader r(StateOf::predictor, state, kStateTag);
  const NarxOptions o = read_options(r);
  const int num_exo = r.get<int>();
  NarxPredictor p(o, num_exo, 0);  // validates options and sizes every buffer
  p.rng_.set_state(r.get<uint64_t>());
  p.read_network(r);
  p.read_levels(r);
  p.read_forecasts(r);
  p.read_window(r);
  p.read_exo_models(r);
  r.finish();
  p.update_band();
  if (p.recent_head_ < 0 || p.recent_head_ >= p.options_.window || p.buffer_head_ < 0 ||
      p.buffer_head_ >= p.options_.window || p.buffer_count_ < 0 || p.buffer_count_ > p.options_.window)
    throw std::invalid_argument("narx state has out-of-range indices");
  *this = std::move(p);
}

// Parameters and Adam state.
void NarxPredictor::read_network(StateReader& r) {
  same_size(params_, r.get_vector<float>());
  same_size(adam_m_, r.get_vector<float>());
  same_size(adam_v_, r.get_vector<float>());
  adam_steps_ = r.get<int64_t>();
  adam_b1t_ = r.get<double>();
  adam_b2t_ = r.get<double>();
}

// The speed's statistics and levels, the exogenous statistics, the lags and the ring of recent speeds.
void NarxPredictor::read_levels(StateReader& r) {
  good_ = r.get<int64_t>();
  y_mean_ = r.get<double>();
  y_var_ = r.get<double>();
  last_ = r.get<double>();
  ema_ = r.get<std::array<double, kEmas>>();
  same_size(exo_mean_, r.get_vector<double>());
  same_size(exo_var_, r.get_vector<double>());
  same_size(exo_count_, r.get_vector<int64_t>());
  same_size(y_lags_, r.get_vector<double>());
  same_size(exo_lags_, r.get_vector<double>());
  same_size(recent_, r.get_vector<double>());
  recent_head_ = r.get<int>();
}

// Recent squared errors, the pending forecast and its inputs.
void NarxPredictor::read_forecasts(StateReader& r) {
  mse_ = r.get<std::array<double, kCandidates>>();
  pending_ = r.get<bool>();
  stale_ = r.get<bool>();
  same_size(pending_x_, r.get_vector<float>());
  pending_candidates_ = r.get<std::array<double, kCandidates>>();
  pending_base_ = r.get<double>();
  pending_scale_ = r.get<double>();
  last_prediction_ = r.get<double>();
}

// The training window.
void NarxPredictor::read_window(StateReader& r) {
  const std::vector<float> rows = r.get_vector<float>();
  if (rows.size() != buffer_x_.size()) throw std::invalid_argument("narx state has inconsistent sizes");
  buffer_x_.assign(rows.begin(), rows.end());
  same_size(buffer_y_, r.get_vector<float>());
  buffer_count_ = r.get<int>();
  buffer_head_ = r.get<int>();
}

// The exogenous linear model and the proportional models.
void NarxPredictor::read_exo_models(StateReader& r) {
  linear_.load(r);
  same_size(pending_u_, r.get_vector<double>());
  ratio_ = r.get<std::array<double, kRatios>>();
}

}  // namespace lbbsp::predictors
