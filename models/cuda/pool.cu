// 2x2 max pooling, stride 2, on channels-last maps [n, h, w, c]: one thread per pooled output element.
#include "models/cuda/cuda_check.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models::cuda {

namespace {

// Output element o = ((s * ho + oy) * wo + ox) * c + k; its window's top-left input cell is
// ((s * h + 2 oy) * w + 2 ox) * c + k (h = 2 ho, w = 2 wo). Returns that input offset.
__device__ size_t window_origin(size_t o, int ho, int wo, int c) {
  const size_t k = o % c;
  size_t rest = o / c;
  const size_t ox = rest % wo;
  rest /= wo;
  const size_t oy = rest % ho;
  const size_t s = rest / ho;
  const size_t w = 2 * size_t(wo), h = 2 * size_t(ho);
  return ((s * h + 2 * oy) * w + 2 * ox) * c + k;
}

__global__ void maxpool_forward_kernel(const float* x, float* y, uint8_t* argmax, size_t count, int ho,
                                       int wo, int c) {
  const size_t row = 2 * size_t(wo) * c;  // floats per input row
  for (size_t o = blockIdx.x * size_t(blockDim.x) + threadIdx.x; o < count;
       o += size_t(gridDim.x) * blockDim.x) {
    const float* a = x + window_origin(o, ho, wo, c);
    // Window order 0:(0,0) 1:(0,1) 2:(1,0) 3:(1,1); strict '>' keeps the first maximum (as on the CPU).
    float best = a[0];
    uint8_t which = 0;
    if (a[c] > best) best = a[c], which = 1;
    if (a[row] > best) best = a[row], which = 2;
    if (a[row + c] > best) best = a[row + c], which = 3;
    y[o] = best;
    argmax[o] = which;
  }
}

__global__ void maxpool_backward_kernel(const float* dy, const uint8_t* argmax, float* dx, size_t count,
                                        int ho, int wo, int c) {
  const size_t row = 2 * size_t(wo) * c;
  for (size_t o = blockIdx.x * size_t(blockDim.x) + threadIdx.x; o < count;
       o += size_t(gridDim.x) * blockDim.x) {
    float* a = dx + window_origin(o, ho, wo, c);
    const float g = dy[o];
    const uint8_t which = argmax[o];
    a[0] = which == 0 ? g : 0.0f;
    a[c] = which == 1 ? g : 0.0f;
    a[row] = which == 2 ? g : 0.0f;
    a[row + c] = which == 3 ? g : 0.0f;
  }
}

}  // namespace

void maxpool2x2_forward(const float* x, float* y, uint8_t* argmax, int n, int h, int w, int c,
                        cudaStream_t stream) {
  const size_t count = size_t(n) * (h / 2) * (w / 2) * c;
  if (count == 0) return;
  maxpool_forward_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(x, y, argmax, count, h / 2, w / 2,
                                                                           c);
  LBBSP_CUDA_CHECK_LAUNCH();
}

void maxpool2x2_backward(const float* dy, const uint8_t* argmax, float* dx, int n, int h, int w, int c,
                         cudaStream_t stream) {
  const size_t count = size_t(n) * (h / 2) * (w / 2) * c;
  if (count == 0) return;
  maxpool_backward_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(dy, argmax, dx, count, h / 2,
                                                                            w / 2, c);
  LBBSP_CUDA_CHECK_LAUNCH();
}

}  // namespace lbbsp::models::cuda
