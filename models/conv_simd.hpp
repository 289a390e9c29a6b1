// Direct convolution on the build's vector unit (models/simd.hpp). Each call returns false, doing nothing,
// when the build or the shape has no such path (no AVX2+FMA at build time; channels not a multiple of the
// vector width; a multi-channel [c, h, w] input); conv2d_forward/backward then take the portable path.
#pragma once
#include "models/conv.hpp"

namespace lbbsp::models {

// A test build of these kernels with LBBSP_SIMD_EMULATE_512 (models/simd.hpp) links beside the real ones.
#ifdef LBBSP_SIMD_EMULATE_512
inline namespace emulated512 {
#else
inline namespace native {
#endif

bool conv_simd_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws);
bool conv_simd_backward(const ConvShape& s, const float* x, const float* w, const float* dy, float* dw,
                        float* dx, ConvWorkspace& ws);

}  // namespace emulated512 or native
}  // namespace lbbsp::models
