// Where a model computes: the host CPU or the current CUDA device (models/cuda/cuda_models.hpp). The flag's
// spellings ("cpu", "cuda") live in runtime/train/run_options.hpp.
#pragma once

namespace lbbsp::models {

enum class Device { kCpu, kCuda };

}  // namespace lbbsp::models
