// Device selection, free memory and the per-sample memory footprint.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "models/cuda/cuda_check.hpp"
#include "models/cuda/cuda_models.hpp"

namespace lbbsp::models {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky 'no device / no driver' error
    return 0;
  }
  return count;
}

int select_cuda_device(int local_rank) {
  if (local_rank < 0)
    throw std::invalid_argument("select_cuda_device: local rank must be >= 0, got " +
                                std::to_string(local_rank));
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    const std::string why = err != cudaSuccess
                                ? std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err)
                                : "0 devices";
    (void)cudaGetLastError();
    throw std::runtime_error("--device cuda: no CUDA GPU visible (" + why +
                             "); check nvidia-smi and CUDA_VISIBLE_DEVICES, or train with --device cpu");
  }
  const int device = local_rank % count;
  LBBSP_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

size_t cuda_free_bytes() {
  size_t free = 0, total = 0;
  LBBSP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

// Mirrors the per-sample buffers of CudaMlp and CudaCnn in cuda_model.cpp.
size_t per_sample_bytes(const ModelConfig& cfg) {
  const size_t label_loss_hit = sizeof(uint8_t) + sizeof(double) + sizeof(int);
  const size_t in = size_t(cfg.input.size());
  if (cfg.kind == "logreg" || cfg.kind == "mlp") {
    // Input, every layer's output, and two activation-gradient buffers of the widest layer (logits included).
    size_t floats = in, widest = in;
    std::vector<int> widths = cfg.kind == "mlp" ? cfg.hidden : std::vector<int>{};
    widths.push_back(cfg.classes);
    for (int w : widths) floats += size_t(w), widest = std::max(widest, size_t(w));
    return (floats + 2 * widest) * sizeof(float) + label_loss_hit;
  }
  if (cfg.kind == "cnn") {
    const size_t hw = size_t(cfg.input.height) * cfg.input.width, pooled1 = hw / 4 * 16,
                 pooled2 = hw / 16 * 32;
    // x, conv1 out (reused for its gradient), pool1 out + its gradient, conv2 out (same reuse), pool2 out +
    // its gradient, logits + their gradient; one byte of argmax per pooled element.
    const size_t floats = in + hw * 16 + 2 * pooled1 + hw / 4 * 32 + 2 * pooled2 + 2 * size_t(cfg.classes);
    return floats * sizeof(float) + (pooled1 + pooled2) * sizeof(uint8_t) + label_loss_hit;
  }
  throw std::invalid_argument("per_sample_bytes: unknown model '" + cfg.kind +
                              "' (expected logreg, mlp or cnn)");
}

}  // namespace lbbsp::models
