#include "predictors/basic.hpp"

#include <stdexcept>

#include "common/state_io.hpp"
#include "predictors/speed.hpp"

namespace lbbsp::predictors {

void LastPredictor::observe(double speed, const std::vector<double>&) {
  if (is_good_speed(speed)) last_ = speed;
}
double LastPredictor::predict(const std::vector<double>&) {
  return last_ > 0 ? last_ : kDefaultSpeed;
}
std::string LastPredictor::save_state() const {
  StateWriter w(StateOf::predictor, "last/1");
  w.put(last_);
  return w.str();
}
void LastPredictor::load_state(const std::string& state) {
  StateReader r(StateOf::predictor, state, "last/1");
  double last = r.get<double>();
  r.finish();
  last_ = last;
}

EmaPredictor::EmaPredictor(double alpha) : alpha_(alpha) {
  if (!(alpha > 0.0 && alpha <= 1.0)) throw std::invalid_argument("ema alpha must be in (0, 1]");
}
std::string EmaPredictor::name() const {
  return "ema";
}
void EmaPredictor::observe(double speed, const std::vector<double>&) {
  if (!is_good_speed(speed)) return;
  level_ = level_ > 0 ? level_ + alpha_ * (speed - level_) : speed;
}
double EmaPredictor::predict(const std::vector<double>&) {
  return level_ > 0 ? level_ : kDefaultSpeed;
}
std::string EmaPredictor::save_state() const {
  StateWriter w(StateOf::predictor, "ema/1");
  w.put(alpha_);
  w.put(level_);
  return w.str();
}
void EmaPredictor::load_state(const std::string& state) {
  StateReader r(StateOf::predictor, state, "ema/1");
  double alpha = r.get<double>(), level = r.get<double>();
  r.finish();
  alpha_ = alpha;
  level_ = level;
}

void OraclePredictor::observe(double speed, const std::vector<double>&) {
  if (is_good_speed(speed)) last_ = speed;
}
double OraclePredictor::predict(const std::vector<double>&) {
  if (is_good_speed(truth_)) return truth_;
  return last_ > 0 ? last_ : kDefaultSpeed;
}
std::string OraclePredictor::save_state() const {
  StateWriter w(StateOf::predictor, "oracle/1");
  w.put(last_);
  w.put(truth_);
  return w.str();
}
void OraclePredictor::load_state(const std::string& state) {
  StateReader r(StateOf::predictor, state, "oracle/1");
  double last = r.get<double>(), truth = r.get<double>();
  r.finish();
  last_ = last;
  truth_ = truth;
}

}  // namespace lbbsp::predictors
