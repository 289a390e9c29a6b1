// Portable, seed-deterministic parameter initialisation and the flat-buffer layout builder shared by models.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "models/model.hpp"

namespace lbbsp::models {

// Standard normal samples from std::mt19937_64 via our own Box-Muller, so the values are identical across
// standard libraries (std::normal_distribution's algorithm is implementation-defined).
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : engine_(seed) {}
  double next();

 private:
  double uniform01();  // in [0, 1), 53 random bits
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// Fills count floats with N(0, stddev^2).
void fill_normal(float* p, size_t count, double stddev, NormalRng& rng);

// Appends tensors one after another in the flat buffer; returns each tensor's offset.
class ParamLayout {
 public:
  size_t add(std::string name, std::vector<int> shape);
  size_t size() const { return size_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

 private:
  std::vector<TensorInfo> tensors_;
  size_t size_ = 0;
};

// Grows a workspace buffer to at least count elements (never shrinks, so steady-state calls do not allocate).
template <typename T>
T* ensure_size(std::vector<T>& v, size_t count) {
  if (v.size() < count) v.resize(count);
  return v.data();
}

}  // namespace lbbsp::models
