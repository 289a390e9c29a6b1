// What the predictors count as a speed observation, and what they predict before they have one.
#pragma once
#include <cmath>

namespace lbbsp::predictors {

// A usable speed observation: finite and strictly positive (everything else is "bad or missing").
inline bool is_good_speed(double v) {
  return std::isfinite(v) && v > 0.0;
}

// Prediction returned before any good observation (equal shares for every worker).
inline constexpr double kDefaultSpeed = 1.0;

}  // namespace lbbsp::predictors
