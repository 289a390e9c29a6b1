// 2x2 max pooling, stride 2, on channels-last feature maps [n, h, w, c] (h and w even).
#pragma once
#include <cstdint>

namespace lbbsp::models {

// y: [n, h/2, w/2, c]; argmax (same size as y) records which of the 4 window cells won (0..3, first on ties).
void maxpool2x2_forward(const float* x, float* y, uint8_t* argmax, int n, int h, int w, int c);
void maxpool2x2_forward_ref(const float* x, float* y, uint8_t* argmax, int n, int h, int w, int c);

// WRITES dx (all of it): each window's winner gets dy, the other three cells 0.
void maxpool2x2_backward(const float* dy, const uint8_t* argmax, float* dx, int n, int h, int w, int c);
void maxpool2x2_backward_ref(const float* dy, const uint8_t* argmax, float* dx, int n, int h, int w, int c);

}  // namespace lbbsp::models
