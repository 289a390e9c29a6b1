// 2-D convolution, stride 1, 'same' zero padding (odd kernel, pad = kernel / 2), no bias (the CNN adds the
// per-channel bias after pooling, where it is 4x cheaper: max(a + b, c + b) == max(a, c) + b).
// Fast path (models/conv_simd.cpp): direct register-tiled kernels on AVX-512F or AVX2+FMA, chosen at build
// time. Portable path (any build, any shape): im2col over a chunk of samples + one GEMM per chunk; layers
// with at most 32 taps per output (a first layer on one channel) use a direct loop instead. Output and
// weights are channels-last: y [n, h, w, out_channels], w [out_channels, kernel, kernel, in_channels].
#pragma once
#include <cstddef>
#include <vector>

namespace lbbsp::models {

struct ConvShape {
  int n = 0;
  int height = 0;
  int width = 0;
  int in_channels = 0;
  int out_channels = 0;
  int kernel = 5;
  bool input_chw = false;  // layout of x (and dx) per sample: [c, h, w] (the data layer) or [h, w, c]
  int pad() const { return kernel / 2; }
  int col_width() const { return kernel * kernel * in_channels; }
  size_t input_size() const { return size_t(height) * width * in_channels; }  // floats per sample
  size_t output_size() const { return size_t(height) * width * out_channels; }
};

// Scratch space held by the caller (the model) so that no call allocates once sizes have settled.
struct ConvWorkspace {
  std::vector<float> col;
  std::vector<float> dy_col;   // input gradient: im2col over dy
  std::vector<float> wflip;    // input gradient: weights flipped in space, transposed in channels
  std::vector<float> staging;  // input gradient: channels-last dx before its transpose to [c, h, w]
  std::vector<float> wt;       // direct path: weights or weight gradient as [tap, out_channel]
  std::vector<float> padded;   // direct paths: zero-padded channels-last copy of x (or of dy)
  bool portable = false;       // true: skip the vector kernels (tests run both paths in one build)
};

void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws);
void conv2d_forward_ref(const ConvShape& s, const float* x, const float* w, float* y);

// ADDS dw += sum over samples; WRITES dx when it is not null (the first layer skips it).
void conv2d_backward(const ConvShape& s, const float* x, const float* w, const float* dy, float* dw,
                     float* dx, ConvWorkspace& ws);
void conv2d_backward_ref(const ConvShape& s, const float* x, const float* w, const float* dy, float* dw,
                         float* dx);

}  // namespace lbbsp::models
