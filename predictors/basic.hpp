// Baseline predictors: last value, exponential moving average, and the oracle.
#pragma once
#include "predictors/predictor.hpp"

namespace lbbsp::predictors {

class LastPredictor final : public Predictor {
 public:
  std::string name() const override { return "last"; }
  void observe(double speed, const std::vector<double>& exo) override;
  double predict(const std::vector<double>& exo_next) override;
  std::string save_state() const override;
  void load_state(const std::string& state) override;

 private:
  double last_ = 0.0;  // 0 until the first good observation
};

class EmaPredictor final : public Predictor {
 public:
  explicit EmaPredictor(double alpha);  // alpha in (0, 1]
  std::string name() const override;
  void observe(double speed, const std::vector<double>& exo) override;
  double predict(const std::vector<double>& exo_next) override;
  std::string save_state() const override;
  void load_state(const std::string& state) override;
  double alpha() const { return alpha_; }

 private:
  double alpha_;
  double level_ = 0.0;  // 0 until the first good observation
};

// Reads the true next speed given through set_truth; falls back to the last good observation when the truth
// is bad or missing.
class OraclePredictor final : public Predictor {
 public:
  std::string name() const override { return "oracle"; }
  void observe(double speed, const std::vector<double>& exo) override;
  double predict(const std::vector<double>& exo_next) override;
  void set_truth(double next_speed) override { truth_ = next_speed; }
  std::string save_state() const override;
  void load_state(const std::string& state) override;

 private:
  double last_ = 0.0;
  double truth_ = 0.0;
};

}  // namespace lbbsp::predictors
