// Fully connected layer on row-major batches: y[n, out] = x[n, in] * W[out, in]^T + b (PyTorch weight
// layout).
#pragma once

namespace lbbsp::models {

// Writes y; with relu the bias add and ReLU are fused into one pass over y.
void dense_forward(const float* x, const float* w, const float* b, float* y, int n, int in, int out,
                   bool relu);
void dense_forward_ref(const float* x, const float* w, const float* b, float* y, int n, int in, int out,
                       bool relu);

// dy: gradient w.r.t. the pre-activation output. ADDS dw += dy^T x and db += sum_rows dy (sums over samples);
// WRITES dx = dy W when dx is not null (the first layer skips it).
void dense_backward(const float* x, const float* w, const float* dy, float* dw, float* db, float* dx, int n,
                    int in, int out);
void dense_backward_ref(const float* x, const float* w, const float* dy, float* dw, float* db, float* dx,
                        int n, int in, int out);

}  // namespace lbbsp::models
