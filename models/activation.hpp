// Per-channel bias and ReLU on row-major [rows, channels] data (dense outputs and channels-last feature
// maps).
#pragma once
#include <cstddef>

namespace lbbsp::models {

// y[r, c] = max(y[r, c] + bias[c], 0) when relu, else y[r, c] + bias[c]. One pass (the fused epilogue).
void bias_relu_forward(float* y, const float* bias, int rows, int channels, bool relu);
void bias_relu_forward_ref(float* y, const float* bias, int rows, int channels, bool relu);

// dy[i] = 0 where the ReLU output y[i] was not positive (in place).
void relu_backward(const float* y, float* dy, size_t count);
void relu_backward_ref(const float* y, float* dy, size_t count);

// dbias[c] += sum over rows of dy[r, c], summed in row order (deterministic for any thread count).
void bias_backward(const float* dy, float* dbias, int rows, int channels);
void bias_backward_ref(const float* dy, float* dbias, int rows, int channels);

}  // namespace lbbsp::models
