#include "models/init.hpp"

#include <cmath>
#include <numbers>

namespace lbbsp::models {

double NormalRng::uniform01() {
  return double(engine_() >> 11) * 0x1.0p-53;
}

double NormalRng::next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = 1.0 - uniform01();  // (0, 1]: log stays finite
  const double u2 = uniform01();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

void fill_normal(float* p, size_t count, double stddev, NormalRng& rng) {
  for (size_t i = 0; i < count; ++i) p[i] = float(stddev * rng.next());
}

size_t ParamLayout::add(std::string name, std::vector<int> shape) {
  TensorInfo t{std::move(name), size_, std::move(shape)};
  size_ += t.size();
  tensors_.push_back(std::move(t));
  return tensors_.back().offset;
}

}  // namespace lbbsp::models
