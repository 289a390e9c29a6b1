// Speed predictors: one state per worker, one-step-ahead. Pure C++ (no MPI, no I/O).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lbbsp::predictors {

class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual std::string name() const = 0;
  // Step t's measured speed (samples/s; NaN, Inf, <= 0 mean "bad or missing" and must be tolerated) and the
  // exogenous inputs measured for step t (CPU available, memory available, ...; fixed length per worker).
  virtual void observe(double speed, const std::vector<double>& exo) = 0;
  // Speed expected at step t+1, given the exogenous inputs already known for it (may be empty).
  // Always finite and > 0.
  virtual double predict(const std::vector<double>& exo_next) = 0;
  // A hint that observe()/predict() on this state come next: starts loading the state into cache (a fleet of
  // thousands of workers does not fit in cache; a caller looping over them prefetches the next one).
  // Changes nothing observable.
  virtual void prefetch() const {}
  // Opaque state for checkpoints: restore(save()) continues identically.
  virtual std::string save_state() const = 0;
  virtual void load_state(const std::string& state) = 0;

  // ---- emulation only (balancer::EmulationTruth): never called on a real cluster ----
  // The true speed of the coming step; only the oracle predictor listens.
  virtual void set_truth(double /*next_speed*/) {}
};

// spec: "last", "ema[:ALPHA]", "arima[:P,D,Q]", "narx[:key=value,...]", "oracle".
// num_exo: length of the exogenous vectors this worker will report. Throws std::invalid_argument naming the
// spec.
std::unique_ptr<Predictor> make_predictor(const std::string& spec, int num_exo, uint64_t seed);
// The kinds make_predictor() knows, in the order of its help: the one list (the Python package reads it).
const std::vector<std::string>& predictor_kinds();

}  // namespace lbbsp::predictors
