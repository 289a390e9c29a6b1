// Helpers shared by the test_models_* executables (random data, closeness checks).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace lbbsp::models::testing {

inline std::vector<float> random_floats(size_t count, std::mt19937_64& rng, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<uint8_t> random_labels(size_t count, int classes, std::mt19937_64& rng) {
  std::vector<uint8_t> v(count);
  for (uint8_t& y : v) y = uint8_t(rng() % classes);
  return v;
}

// Max |a - b| must be within tol * max(1, max |b|): float rounding scales with the magnitude of the data.
inline ::testing::AssertionResult all_close(const std::vector<float>& a, const std::vector<float>& b,
                                            double tol = 2e-5) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes " << a.size() << " != " << b.size();
  double scale = 1.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, double(std::fabs(b[i])));
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= worst)) worst = d, at = i;  // also catches NaN
  }
  if (worst <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": " << a[at] << " vs " << b[at] << " (|diff| "
                                       << worst << " > " << tol * scale << ")";
}

}  // namespace lbbsp::models::testing
