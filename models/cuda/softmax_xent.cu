// Softmax + cross-entropy per sample (one thread each: classes is small), and the fixed-order reduction of
// the per-sample losses and hits into the step totals.
#include "models/cuda/cuda_check.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models::cuda {

namespace {

// Same arithmetic as the CPU softmax_xent: float max, float sum of exp, the loss difference in double.
__global__ void softmax_xent_kernel(const float* logits, const uint8_t* labels, int n, int classes,
                                    float* dlogits, double* loss, int* correct) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* z = logits + size_t(i) * classes;
  int best = 0;
  for (int c = 1; c < classes; ++c)
    if (z[c] > z[best]) best = c;  // strict '>': the first maximum wins ties
  const float zmax = z[best];
  float sum = 0.0f;
  for (int c = 0; c < classes; ++c) sum += expf(z[c] - zmax);
  const int label = labels[i];
  loss[i] = double(logf(sum)) - double(z[label] - zmax);
  correct[i] = best == label;
  if (dlogits) {
    float* g = dlogits + size_t(i) * classes;
    const float inv = 1.0f / sum;
    for (int c = 0; c < classes; ++c) g[c] = expf(z[c] - zmax) * inv;
    g[label] -= 1.0f;
  }
}

constexpr int kReduceThreads = 256;

// One block: thread t sums samples t, t + 256, ...; then a shared-memory tree. The order is fixed.
__global__ void reduce_stats_kernel(const double* loss, const int* correct, int n, StepTotals* totals) {
  __shared__ double loss_part[kReduceThreads];
  __shared__ long long correct_part[kReduceThreads];
  double l = 0.0;
  long long c = 0;
  for (int i = threadIdx.x; i < n; i += kReduceThreads) l += loss[i], c += correct[i];
  loss_part[threadIdx.x] = l;
  correct_part[threadIdx.x] = c;
  __syncthreads();
  for (int half = kReduceThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss_part[threadIdx.x] += loss_part[threadIdx.x + half];
      correct_part[threadIdx.x] += correct_part[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    totals->loss_sum += loss_part[0];
    totals->correct += correct_part[0];
  }
}

}  // namespace

void softmax_xent(const float* logits, const uint8_t* labels, int n, int classes, float* dlogits,
                  double* loss, int* correct, cudaStream_t stream) {
  if (n == 0) return;
  softmax_xent_kernel<<<(n + kThreadsPerBlock - 1) / kThreadsPerBlock, kThreadsPerBlock, 0, stream>>>(
      logits, labels, n, classes, dlogits, loss, correct);
  LBBSP_CUDA_CHECK_LAUNCH();
}

void reduce_stats(const double* loss, const int* correct, int n, StepTotals* totals, cudaStream_t stream) {
  if (n == 0) return;
  reduce_stats_kernel<<<1, kReduceThreads, 0, stream>>>(loss, correct, n, totals);
  LBBSP_CUDA_CHECK_LAUNCH();
}

}  // namespace lbbsp::models::cuda
