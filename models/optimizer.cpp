#include "models/optimizer.hpp"

#include <cmath>
#include <cstdlib>
#include <numbers>
#include <stdexcept>
#include <string>

#include "common/spec.hpp"
#include "models/model.hpp"

namespace lbbsp::models {

double LrSchedule::lr_at(int64_t iteration) const {
  if (iteration < warmup_iterations)  // linear from base_lr / warmup at iteration 0 up to base_lr
    return base_lr * double(iteration + 1) / double(warmup_iterations);
  const int64_t t = iteration - warmup_iterations;  // iterations since warm-up ended
  switch (kind) {
    case Kind::kConstant:
      return base_lr;
    case Kind::kStep:
      return step_every > 0 ? base_lr * std::pow(step_gamma, double(t / step_every)) : base_lr;
    case Kind::kCosine: {
      const int64_t span = total_iterations - warmup_iterations;
      if (span <= 0 || t >= span) return 0.0;
      return 0.5 * base_lr * (1.0 + std::cos(std::numbers::pi * double(t) / double(span)));
    }
  }
  throw std::invalid_argument("LrSchedule::kind: unknown schedule " + std::to_string(int(kind)));
}

namespace {

// "step:EVERY:GAMMA": EVERY and GAMMA read as strtoll and strtod read them (the whole field must parse).
void parse_step(const spec::Spec& spec, LrSchedule& s) {
  const std::string& rest = spec.args();
  const size_t colon = rest.find(':');
  if (colon == std::string::npos) spec.fail("missing ':GAMMA'");
  const std::string every = rest.substr(0, colon), gamma = rest.substr(colon + 1);
  char* end = nullptr;
  s.step_every = std::strtoll(every.c_str(), &end, 10);
  if (every.empty() || *end != '\0') spec.fail("EVERY must be an integer");
  s.step_gamma = std::strtod(gamma.c_str(), &end);
  if (gamma.empty() || *end != '\0') spec.fail("GAMMA must be a number");
  if (s.step_every <= 0) spec.fail("EVERY must be positive");
  if (!(s.step_gamma > 0.0)) spec.fail("GAMMA must be positive");
  if (!std::isfinite(s.step_gamma)) spec.fail("GAMMA must be finite");
}

}  // namespace

LrSchedule parse_lr_schedule(const std::string& text, double base_lr, int64_t warmup, int64_t total) {
  const spec::Spec spec(text, "--lr-schedule", "valid: constant, step:EVERY:GAMMA, cosine");
  if (warmup < 0) spec.fail("warm-up must not be negative");
  LrSchedule s;
  s.base_lr = base_lr;
  s.warmup_iterations = warmup;
  s.total_iterations = total;
  const std::string& kind = spec.kind();
  if (kind != "constant" && kind != "step" && kind != "cosine") spec.fail("unknown kind");
  spec.expect_no_options();
  if (kind == "step") {
    if (!spec.has_args()) spec.fail("missing ':EVERY:GAMMA'");
    s.kind = LrSchedule::Kind::kStep;
    parse_step(spec, s);
    return s;
  }
  spec.expect_no_args();
  s.kind = kind == "cosine" ? LrSchedule::Kind::kCosine : LrSchedule::Kind::kConstant;
  if (s.kind == LrSchedule::Kind::kCosine && total <= warmup)
    spec.fail("cosine needs total iterations > warm-up");
  return s;
}

Sgd::Sgd(size_t num_params, double momentum, double weight_decay)
    : momentum_(momentum), weight_decay_(weight_decay), velocity_(num_params, 0.0f) {
  if (momentum < 0.0 || momentum >= 1.0)
    throw std::invalid_argument("Sgd: momentum must be in [0, 1), got " + std::to_string(momentum));
  if (weight_decay < 0.0)
    throw std::invalid_argument("Sgd: weight decay must not be negative, got " +
                                std::to_string(weight_decay));
}

void Sgd::step(float* params, const float* grad_sum, int64_t global_batch, double lr) {
  step_range(params, velocity_.data(), grad_sum, velocity_.size(), global_batch, lr);
}

void Sgd::step_range(float* params, float* v, const float* grad_sum, size_t n, int64_t global_batch,
                     double lr) const {
  if (global_batch <= 0)
    throw std::invalid_argument("Sgd::step: global batch must be positive, got " +
                                std::to_string(global_batch));
  // PyTorch's formulation: g = grad/B + wd*w; v = momentum*v + g; w -= lr*v. Element-wise, so any thread
  // split gives the same bits.
  const float inv_batch = float(1.0 / double(global_batch));
  const float wd = float(weight_decay_), mu = float(momentum_), rate = float(lr);
  const int64_t count = int64_t(n);
  // Two threads halve a memory-bound pass only when the second is awake: woken from sleep (after the
  // allreduce it is) it costs 35-90 us, the whole pass over 1M floats; right after a parallel backward (one
  // process, no allreduce) it costs a microsecond, and the pass over 128k floats saves more
  // (docs/threads.md). `parallel :`: an if clause without it would switch off the simd too.
  const bool split = count > (1 << 20) || (count > (1 << 17) && team_is_awake());
#pragma omp parallel for simd schedule(static) if (parallel : split)
  for (int64_t i = 0; i < count; ++i) {
    const float g = grad_sum[i] * inv_batch + wd * params[i];
    v[i] = mu * v[i] + g;
    params[i] -= rate * v[i];
  }
}

}  // namespace lbbsp::models
