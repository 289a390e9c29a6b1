// make_model for the emulated test binary: test_gpu_models.cpp is compiled with -Dmake_model=emu_make_model,
// and this sends device "cuda" to the (host-emulated) CUDA backend, everything else to the real make_model of
// a CPU-only lbbsp_models.
#include "models/cuda/cuda_models.hpp"
#include "models/model.hpp"

namespace lbbsp::models {

std::unique_ptr<Model> emu_make_model(const ModelConfig& cfg) {
  if (cfg.device != Device::kCuda) return make_model(cfg);
  ModelConfig host = cfg;
  host.device = Device::kCpu;
  return make_cuda_model(cfg, make_model(host));
}

}  // namespace lbbsp::models
