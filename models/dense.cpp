#include "models/dense.hpp"

#include "models/activation.hpp"
#include "models/gemm.hpp"

namespace lbbsp::models {

void dense_forward(const float* x, const float* w, const float* b, float* y, int n, int in, int out,
                   bool relu) {
  gemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  bias_relu_forward(y, b, n, out, relu);
}

void dense_forward_ref(const float* x, const float* w, const float* b, float* y, int n, int in, int out,
                       bool relu) {
  for (int s = 0; s < n; ++s)
    for (int o = 0; o < out; ++o) {
      float acc = b[o];
      for (int i = 0; i < in; ++i) acc += x[s * in + i] * w[o * in + i];
      y[s * out + o] = (relu && acc < 0.0f) ? 0.0f : acc;
    }
}

void dense_backward(const float* x, const float* w, const float* dy, float* dw, float* db, float* dx, int n,
                    int in, int out) {
  gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  bias_backward(dy, db, n, out);
  if (dx) gemm(false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

void dense_backward_ref(const float* x, const float* w, const float* dy, float* dw, float* db, float* dx,
                        int n, int in, int out) {
  for (int o = 0; o < out; ++o) {
    for (int s = 0; s < n; ++s) db[o] += dy[s * out + o];
    for (int i = 0; i < in; ++i) {
      float acc = 0.0f;
      for (int s = 0; s < n; ++s) acc += dy[s * out + o] * x[s * in + i];
      dw[o * in + i] += acc;
    }
  }
  if (!dx) return;
  for (int s = 0; s < n; ++s)
    for (int i = 0; i < in; ++i) {
      float acc = 0.0f;
      for (int o = 0; o < out; ++o) acc += dy[s * out + o] * w[o * in + i];
      dx[s * in + i] = acc;
    }
}

}  // namespace lbbsp::models
