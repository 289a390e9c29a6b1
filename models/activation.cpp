#include "models/activation.hpp"

#include <algorithm>
#include <cstdint>

namespace lbbsp::models {

namespace {
// Below this many elements an OpenMP region costs more than it saves.
constexpr int64_t kParallelMinElements = 1 << 15;
}  // namespace

void bias_relu_forward(float* y, const float* bias, int rows, int channels, bool relu) {
#pragma omp parallel for schedule(static) if (int64_t(rows) * channels > kParallelMinElements)
  for (int r = 0; r < rows; ++r) {
    float* row = y + size_t(r) * channels;
    if (relu) {
#pragma omp simd
      for (int c = 0; c < channels; ++c) row[c] = std::max(row[c] + bias[c], 0.0f);
    } else {
#pragma omp simd
      for (int c = 0; c < channels; ++c) row[c] += bias[c];
    }
  }
}

void bias_relu_forward_ref(float* y, const float* bias, int rows, int channels, bool relu) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < channels; ++c) {
      float v = y[size_t(r) * channels + c] + bias[c];
      if (relu && v < 0.0f) v = 0.0f;
      y[size_t(r) * channels + c] = v;
    }
}

void relu_backward(const float* y, float* dy, size_t count) {
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(count) > kParallelMinElements)
  for (size_t i = 0; i < count; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void relu_backward_ref(const float* y, float* dy, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (!(y[i] > 0.0f)) dy[i] = 0.0f;
}

void bias_backward(const float* dy, float* dbias, int rows, int channels) {
  // Each channel is summed by one thread in row order; rows are walked in blocks so dy streams through cache.
  constexpr int kChannelBlock = 64;
#pragma omp parallel for schedule(static) if (int64_t(rows) * channels > kParallelMinElements)
  for (int c0 = 0; c0 < channels; c0 += kChannelBlock) {
    const int c1 = std::min(channels, c0 + kChannelBlock);
    float acc[kChannelBlock];
    for (int c = c0; c < c1; ++c) acc[c - c0] = dbias[c];
    for (int r = 0; r < rows; ++r) {
      const float* row = dy + size_t(r) * channels;
#pragma omp simd
      for (int c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int c = c0; c < c1; ++c) dbias[c] = acc[c - c0];
  }
}

void bias_backward_ref(const float* dy, float* dbias, int rows, int channels) {
  for (int c = 0; c < channels; ++c)
    for (int r = 0; r < rows; ++r) dbias[c] += dy[size_t(r) * channels + c];
}

}  // namespace lbbsp::models
