// SGD with momentum and weight decay on device-resident parameters: the GPU twin of models::Sgd::step
// (models/optimizer.cpp, the CPU reference), element-wise, so every rank computes the same bits.
#include "models/cuda/cuda_check.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models::cuda {

namespace {

__global__ void sgd_momentum_kernel(float* params, const float* grad_sum, float* velocity, size_t count,
                                    float inv_batch, float weight_decay, float momentum, float lr) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const float g = grad_sum[i] * inv_batch + weight_decay * params[i];
    const float v = momentum * velocity[i] + g;
    velocity[i] = v;
    params[i] -= lr * v;
  }
}

}  // namespace

void sgd_momentum_step(float* params, const float* grad_sum, float* velocity, size_t count, float inv_batch,
                       float weight_decay, float momentum, float lr, cudaStream_t stream) {
  if (count == 0) return;
  sgd_momentum_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(
      params, grad_sum, velocity, count, inv_batch, weight_decay, momentum, lr);
  LBBSP_CUDA_CHECK_LAUNCH();
}

}  // namespace lbbsp::models::cuda
