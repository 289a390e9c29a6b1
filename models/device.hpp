// Where a model computes: the host CPU or the current CUDA device (models/cuda/cuda_models.hpp).
#pragma once
#include <stdexcept>
#include <string>

namespace lbbsp::models {

enum class Device { kCpu, kCuda };

// "cpu" or "cuda"; anything else is std::invalid_argument naming the choices.
inline Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  throw std::invalid_argument("unknown device '" + name + "' (expected cpu or cuda)");
}

}  // namespace lbbsp::models
