// Per-channel bias + ReLU forward and ReLU backward (element-wise, grid-stride loops).
#include "models/cuda/cuda_check.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models::cuda {

namespace {

__global__ void bias_relu_forward_kernel(float* y, const float* bias, size_t count, int channels, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const float v = y[i] + bias[i % channels];  // row-major [rows, channels]: the channel is i mod channels
    y[i] = (relu && v < 0.0f) ? 0.0f : v;
  }
}

__global__ void relu_backward_kernel(const float* y, float* dy, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x)
    if (!(y[i] > 0.0f)) dy[i] = 0.0f;
}

}  // namespace

void bias_relu_forward(float* y, const float* bias, size_t rows, int channels, bool relu,
                       cudaStream_t stream) {
  const size_t count = rows * size_t(channels);
  if (count == 0) return;
  bias_relu_forward_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(y, bias, count, channels, relu);
  LBBSP_CUDA_CHECK_LAUNCH();
}

void relu_backward(const float* y, float* dy, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  relu_backward_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(y, dy, count);
  LBBSP_CUDA_CHECK_LAUNCH();
}

}  // namespace lbbsp::models::cuda
