// Host-side launchers of our CUDA kernels (one .cu file per family) and the row-major cuBLAS GEMM. Every
// launcher is asynchronous on `stream`, takes DEVICE pointers, and mirrors the CPU function of the same name
// in models/*.hpp (same layouts, same sum-not-mean semantics, same tie rules).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// Small helpers below are called from kernels too.
#ifdef __CUDACC__
#define LBBSP_HOST_DEVICE __host__ __device__
#else
#define LBBSP_HOST_DEVICE
#endif

namespace lbbsp::models::cuda {

// ---- activation.cu: per-channel bias and ReLU on row-major [rows, channels] ----
// y[r, c] = max(y[r, c] + bias[c], 0) when relu, else y[r, c] + bias[c].
void bias_relu_forward(float* y, const float* bias, size_t rows, int channels, bool relu,
                       cudaStream_t stream);
// dy[i] = 0 where the ReLU output y[i] was not positive (in place).
void relu_backward(const float* y, float* dy, size_t count, cudaStream_t stream);

// ---- bias_grad.cu: column sums ----
// Floats of scratch bias_backward needs for `channels` columns.
size_t bias_backward_workspace_floats(int channels);
// dbias[c] += sum over rows of dy[r, c]. Two passes (fixed row slices, then the slices in order), so the sum
// order depends only on rows: deterministic, no atomics.
void bias_backward(const float* dy, float* dbias, size_t rows, int channels, float* workspace,
                   cudaStream_t stream);

// ---- softmax_xent.cu ----
// Per sample: loss[i] = -log softmax(logits)[label] and correct[i] = (first arg-max == label); when dlogits
// is not null, WRITES softmax - onehot. Labels must already be checked (< classes).
void softmax_xent(const float* logits, const uint8_t* labels, int n, int classes, float* dlogits,
                  double* loss, int* correct, cudaStream_t stream);
// Device-side totals of a step; reduce_stats ADDS the sums of loss[0..n) and correct[0..n) into them in a
// fixed order (one block).
struct StepTotals {
  double loss_sum;
  long long correct;
};
void reduce_stats(const double* loss, const int* correct, int n, StepTotals* totals, cudaStream_t stream);

// ---- pool.cu: 2x2 max pooling, stride 2, channels-last [n, h, w, c] ----
// argmax records the winning window cell 0:(0,0) 1:(0,1) 2:(1,0) 3:(1,1), the first on ties.
void maxpool2x2_forward(const float* x, float* y, uint8_t* argmax, int n, int h, int w, int c,
                        cudaStream_t stream);
// WRITES all of dx: each window's winner gets dy, the other three cells 0.
void maxpool2x2_backward(const float* dy, const uint8_t* argmax, float* dx, int n, int h, int w, int c,
                         cudaStream_t stream);

// ---- im2col.cu: 'same' convolution (odd kernel, stride 1, pad kernel/2) as GEMMs ----
struct ConvGeometry {
  int height = 0, width = 0, channels = 0;  // of the input (= of the output: 'same' padding)
  int kernel = 5;
  bool input_chw = false;  // input (and input gradient) per sample: [c, h, w], else [h, w, c]
  LBBSP_HOST_DEVICE int pad() const { return kernel / 2; }
  LBBSP_HOST_DEVICE int col_width() const { return kernel * kernel * channels; }
  LBBSP_HOST_DEVICE size_t input_size() const { return size_t(height) * width * channels; }
};
// col[(s, oy, ox), (ky, kx, ci)] = x(s, ci, oy + ky - pad, ox + kx - pad), 0 outside; col is
// [samples * h * w, col_width].
void im2col(const ConvGeometry& g, const float* x, int samples, float* col, cudaStream_t stream);
// The adjoint of im2col: WRITES dx(s, ci, iy, ix) = sum of the col entries that im2col copied from it.
void col2im(const ConvGeometry& g, const float* col, int samples, float* dx, cudaStream_t stream);

// ---- sgd.cu: the optimizer on device-resident parameters (models::Sgd::step on the CPU) ----
// g = grad_sum * inv_batch + weight_decay * params; velocity = momentum * velocity + g; params -= lr *
// velocity.
void sgd_momentum_step(float* params, const float* grad_sum, float* velocity, size_t count, float inv_batch,
                       float weight_decay, float momentum, float lr, cudaStream_t stream);

// ---- gemm.cpp: row-major C = alpha * op(A) * op(B) + beta * C, the signature of models/gemm.hpp ----
// Full FP32 (no TF32), so results match the CPU to rounding.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc);

// Blocks for a grid-stride loop over count elements with kThreadsPerBlock threads each.
constexpr int kThreadsPerBlock = 256;
inline unsigned grid_for(size_t count) {
  const size_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return unsigned(blocks < (size_t(1) << 20) ? (blocks > 0 ? blocks : 1) : (size_t(1) << 20));
}

}  // namespace lbbsp::models::cuda
