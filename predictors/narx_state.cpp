// NarxPredictor's saved state (format narx/4) and the readers of the older formats narx/1 to narx/3.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "predictors/narx.hpp"

namespace lbbsp::predictors {
namespace {

template <class T>
void same_size(std::vector<T>& dst, std::vector<T>&& src) {
  if (src.size() != dst.size()) throw std::invalid_argument("narx state has inconsistent sizes");
  dst = std::move(src);
}

// narx/1 kept the network in double with W1 hidden-major (hidden x inputs).
void same_size_net(std::vector<float>& dst, const std::vector<double>& src, int n_in, int h) {
  if (src.size() != dst.size()) throw std::invalid_argument("narx state has inconsistent sizes");
  for (int j = 0; j < h; ++j)
    for (int i = 0; i < n_in; ++i) dst[i * h + j] = static_cast<float>(src[j * n_in + i]);
  for (size_t k = static_cast<size_t>(h) * n_in; k < src.size(); ++k) dst[k] = static_cast<float>(src[k]);
}

template <class Alloc>
void same_size_float(std::vector<float, Alloc>& dst, const std::vector<double>& src) {
  if (src.size() != dst.size()) throw std::invalid_argument("narx state has inconsistent sizes");
  for (size_t k = 0; k < src.size(); ++k) dst[k] = static_cast<float>(src[k]);
}

bool has_tag(const std::string& state, const std::string& tag) {
  const std::string prefix = StateWriter(StateOf::predictor, tag).str();
  return state.compare(0, prefix.size(), prefix) == 0;
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

// The options of a saved state (narx/1 and narx/2 had no forget and ridge, narx/1 to narx/3 no ratio).
NarxOptions read_options(StateReader& r, int version) {
  NarxOptions o;
  o.dy = r.get<int>();
  o.du = r.get<int>();
  o.hidden = r.get<int>();
  o.window = r.get<int>();
  o.lr = r.get<double>();
  o.epochs = r.get<int>();
  o.batch = r.get<int>();
  o.sharp = r.get<double>();
  if (version >= 3) {
    o.forget = r.get<double>();
    o.ridge = r.get<double>();
  }
  if (version >= 4) o.ratio = r.get<int>();
  return o;
}

}  // namespace

// ---- narx/4: options, the network, the levels, the pending forecast, the window, the exogenous models ----

std::string NarxPredictor::save_state() const {
  StateWriter w(StateOf::predictor, "narx/4");
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

// ---- reading narx/1 to narx/4 ----

// narx/1 and narx/2 had no exogenous linear model, narx/1 to narx/3 no proportional models: they start
// empty (their forecasts are the base until they have data) and with the largest recent squared error of the
// other candidates, so they earn their weight; the ratio input is the default one.
void NarxPredictor::load_state(const std::string& state) {
  const int version = has_tag(state, "narx/1")   ? 1
                      : has_tag(state, "narx/2") ? 2
                      : has_tag(state, "narx/3") ? 3
                                                 : 4;
  StateReader r(StateOf::predictor, state, "narx/" + std::to_string(version));
  const NarxOptions o = read_options(r, version);
  const int num_exo = r.get<int>();
  NarxPredictor p(o, num_exo, 0);  // validates options and sizes every buffer
  p.rng_.set_state(r.get<uint64_t>());
  p.read_network(r, version);
  p.read_levels(r);
  p.read_forecasts(r, version);
  p.read_window(r, version);
  p.read_exo_models(r, version);
  r.finish();
  p.update_band();
  if (p.recent_head_ < 0 || p.recent_head_ >= p.options_.window || p.buffer_head_ < 0 ||
      p.buffer_head_ >= p.options_.window || p.buffer_count_ < 0 || p.buffer_count_ > p.options_.window)
    throw std::invalid_argument("narx state has out-of-range indices");
  *this = std::move(p);
}

// Parameters and Adam state; narx/1 kept them in double with W1 hidden-major and no running powers.
void NarxPredictor::read_network(StateReader& r, int version) {
  const int n_in = num_inputs(), h = options_.hidden;
  if (version == 1) {
    same_size_net(params_, r.get_vector<double>(), n_in, h);
    same_size_net(adam_m_, r.get_vector<double>(), n_in, h);
    same_size_net(adam_v_, r.get_vector<double>(), n_in, h);
  } else {
    same_size(params_, r.get_vector<float>());
    same_size(adam_m_, r.get_vector<float>());
    same_size(adam_v_, r.get_vector<float>());
  }
  adam_steps_ = r.get<int64_t>();
  if (version == 1) {
    adam_b1t_ = std::pow(0.9, static_cast<double>(adam_steps_));
    adam_b2t_ = std::pow(0.999, static_cast<double>(adam_steps_));
  } else {
    adam_b1t_ = r.get<double>();
    adam_b2t_ = r.get<double>();
  }
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

// One value per candidate in the current layout. narx/1 and narx/2 saved kLast, the EMAs and kNet; narx/3
// kLast, the EMAs, kLinear and kNet. The candidates they lacked get `fill`, or with `as_mse` the largest of
// the saved values.
std::array<double, NarxPredictor::kCandidates> NarxPredictor::read_candidates(StateReader& r, int version,
                                                                              bool as_mse, double fill) {
  if (version >= 4) return r.get<std::array<double, kCandidates>>();
  std::array<double, kBase + 2> old{};  // room for narx/3's; narx/1 and /2 use the first kBase + 1
  const size_t n = version == 3 ? kBase + 2 : kBase + 1;
  if (version == 3) {
    old = r.get<std::array<double, kBase + 2>>();
  } else {
    const std::array<double, kBase + 1> v2 = r.get<std::array<double, kBase + 1>>();
    std::copy(v2.begin(), v2.end(), old.begin());
  }
  if (as_mse) fill = *std::max_element(old.begin(), old.begin() + n);
  std::array<double, kCandidates> out{};
  std::copy(old.begin(), old.begin() + kBase, out.begin());
  std::fill(out.begin() + kRatioSlow, out.begin() + kRatioFast + 1, fill);
  out[kLinear] = version == 3 ? old[kBase] : fill;
  out[kNet] = old[n - 1];
  return out;
}

// Recent squared errors, the pending forecast and its inputs. The candidates older states lacked forecast
// the base, which is read after them.
void NarxPredictor::read_forecasts(StateReader& r, int version) {
  mse_ = read_candidates(r, version, true, 0);
  pending_ = r.get<bool>();
  stale_ = version == 1 ? false : r.get<bool>();
  if (version == 1)
    same_size_float(pending_x_, r.get_vector<double>());
  else
    same_size(pending_x_, r.get_vector<float>());
  pending_candidates_ = read_candidates(r, version, false, 0);
  pending_base_ = r.get<double>();
  if (version < 4) {
    std::fill(pending_candidates_.begin() + kRatioSlow, pending_candidates_.begin() + kRatioFast + 1,
              pending_base_);
    if (version < 3) pending_candidates_[kLinear] = pending_base_;
  }
  pending_scale_ = r.get<double>();
  last_prediction_ = r.get<double>();
}

// The training window (narx/1 kept it in double).
void NarxPredictor::read_window(StateReader& r, int version) {
  if (version == 1) {
    same_size_float(buffer_x_, r.get_vector<double>());
    same_size_float(buffer_y_, r.get_vector<double>());
  } else {
    const std::vector<float> rows = r.get_vector<float>();
    if (rows.size() != buffer_x_.size()) throw std::invalid_argument("narx state has inconsistent sizes");
    buffer_x_.assign(rows.begin(), rows.end());
    same_size(buffer_y_, r.get_vector<float>());
  }
  buffer_count_ = r.get<int>();
  buffer_head_ = r.get<int>();
}

// The exogenous linear model (narx/3 on) and the proportional models (narx/4).
void NarxPredictor::read_exo_models(StateReader& r, int version) {
  if (version >= 3) {
    linear_.load(r);
    same_size(pending_u_, r.get_vector<double>());
    if (version >= 4) ratio_ = r.get<std::array<double, kRatios>>();
  } else if (pending_) {
    // The pending forecast's regressors were not saved: the newest measured values stand in.
    const double* newest = options_.du > 0 ? exo_lags_.data() : exo_mean_.data();
    std::copy(newest, newest + num_exo_, pending_u_.begin());
  }
}

}  // namespace lbbsp::predictors
