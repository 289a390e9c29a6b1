// SGD with momentum and weight decay, and learning-rate schedules. Gradients arrive as SUMS over the global
// batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lbbsp::models {

struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine };
  Kind kind = Kind::kConstant;
  double base_lr = 0.05;
  int64_t warmup_iterations = 0;  // linear warm-up from 0 to base_lr
  int64_t total_iterations = 0;   // cosine: length of the decay
  int64_t step_every = 0;         // step: decay interval in iterations
  double step_gamma = 0.1;        // step: factor per interval
  // Iteration i < warmup: base_lr * (i + 1) / warmup (never 0). After it, with t = i - warmup: constant
  // base_lr; step base_lr * gamma^(t / step_every); cosine from base_lr at t = 0 to 0 at i =
  // total_iterations.
  double lr_at(int64_t iteration) const;
};

// Parses "constant", "step:EVERY:GAMMA", "cosine"; throws std::invalid_argument naming the spec
// ("--lr-schedule: WHY (in 'SPEC'; valid: ...)").
LrSchedule parse_lr_schedule(const std::string& spec, double base_lr, int64_t warmup, int64_t total);

class Sgd {
 public:
  Sgd(size_t num_params, double momentum, double weight_decay);
  // w -= lr * (grad_sum / global_batch + wd * w), with momentum. Identical on every rank.
  void step(float* params, const float* grad_sum, int64_t global_batch, double lr);
  // The same update on count elements with a velocity kept elsewhere (a share of parameters that live in
  // memory shared by several ranks); bit for bit what step() does to those elements.
  void step_range(float* params, float* velocity, const float* grad_sum, size_t count, int64_t global_batch,
                  double lr) const;
  std::vector<float>& velocity() { return velocity_; }
  const std::vector<float>& velocity() const { return velocity_; }

 private:
  double momentum_;
  double weight_decay_;
  std::vector<float> velocity_;
};

}  // namespace lbbsp::models
