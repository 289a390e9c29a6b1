#include "models/pool.hpp"

#include <cstddef>

#include "models/simd.hpp"

namespace lbbsp::models {

namespace {

// One output row with a vector of channels per window (false where the build has no vector unit or c does not
// fill vectors): the compiler's own vectorisation of the scalar loops below takes its width from the uint8
// argmax (64 lanes on AVX-512) and ran 16 or 32 channels scalar, with a branch per cell.
bool forward_row_vectors(const float* in0, const float* in1, int wo, int c, float* out, uint8_t* idx) {
#ifdef LBBSP_SIMD_LANES
  if (c % simd::kLanes != 0) return false;
  const float which_cell[4] = {0.0f, 1.0f, 2.0f, 3.0f};
  for (int ox = 0; ox < wo; ++ox)
    for (int k = 0; k < c; k += simd::kLanes) {
      const float* a = in0 + size_t(2 * ox) * c + k;
      const float* b = in1 + size_t(2 * ox) * c + k;
      const float* cells[4] = {a, a + c, b, b + c};
      simd::Vec best = simd::load(a), which = simd::zero();
      for (int q = 1; q < 4; ++q) {
        const simd::Vec v = simd::load(cells[q]);
        which =
            simd::select_greater(v, best, simd::broadcast(which_cell + q), which);  // strict: first max stays
        best = simd::select_greater(v, best, v, best);
      }
      simd::store(out + size_t(ox) * c + k, best);
      simd::store_bytes(idx + size_t(ox) * c + k, which);
    }
  return true;
#else
  (void)in0, (void)in1, (void)wo, (void)c, (void)out, (void)idx;
  return false;
#endif
}

bool backward_row_vectors(const float* g, const uint8_t* idx, int wo, int c, float* out0, float* out1) {
#ifdef LBBSP_SIMD_LANES
  if (c % simd::kLanes != 0) return false;
  for (int ox = 0; ox < wo; ++ox)
    for (int k = 0; k < c; k += simd::kLanes) {
      const size_t o = size_t(ox) * c + k;
      float* a = out0 + size_t(2 * ox) * c + k;
      float* b = out1 + size_t(2 * ox) * c + k;
      const simd::Vec v = simd::load(g + o);
      simd::store(a, simd::keep_where_equal(idx + o, 0, v));
      simd::store(a + c, simd::keep_where_equal(idx + o, 1, v));
      simd::store(b, simd::keep_where_equal(idx + o, 2, v));
      simd::store(b + c, simd::keep_where_equal(idx + o, 3, v));
    }
  return true;
#else
  (void)g, (void)idx, (void)wo, (void)c, (void)out0, (void)out1;
  return false;
#endif
}

}  // namespace

void maxpool2x2_forward(const float* x, float* y, uint8_t* argmax, int n, int h, int w, int c) {
  const int ho = h / 2, wo = w / 2;
  const size_t row = size_t(w) * c;  // floats per input image row
#pragma omp parallel for collapse(2) schedule(static) if (size_t(n) * h * w * c > (1u << 16))
  for (int s = 0; s < n; ++s)
    for (int oy = 0; oy < ho; ++oy) {
      const float* in0 = x + (size_t(s) * h + 2 * oy) * row;  // top row of the window
      const float* in1 = in0 + row;                           // bottom row
      float* out = y + (size_t(s) * ho + oy) * wo * c;
      uint8_t* idx = argmax + (size_t(s) * ho + oy) * wo * c;
      if (forward_row_vectors(in0, in1, wo, c, out, idx)) continue;
      for (int ox = 0; ox < wo; ++ox) {
        const float* a = in0 + size_t(2 * ox) * c;
        const float* b = in1 + size_t(2 * ox) * c;
        for (int k = 0; k < c; ++k) {
          // Window order 0:(0,0) 1:(0,1) 2:(1,0) 3:(1,1); strict '>' keeps the first maximum.
          float best = a[k];
          uint8_t which = 0;
          if (a[c + k] > best) best = a[c + k], which = 1;
          if (b[k] > best) best = b[k], which = 2;
          if (b[c + k] > best) best = b[c + k], which = 3;
          out[size_t(ox) * c + k] = best;
          idx[size_t(ox) * c + k] = which;
        }
      }
    }
}

void maxpool2x2_forward_ref(const float* x, float* y, uint8_t* argmax, int n, int h, int w, int c) {
  const int ho = h / 2, wo = w / 2;
  for (int s = 0; s < n; ++s)
    for (int oy = 0; oy < ho; ++oy)
      for (int ox = 0; ox < wo; ++ox)
        for (int k = 0; k < c; ++k) {
          float best = 0.0f;
          int which = -1;
          for (int q = 0; q < 4; ++q) {
            const int iy = 2 * oy + q / 2, ix = 2 * ox + q % 2;
            const float v = x[((size_t(s) * h + iy) * w + ix) * c + k];
            if (which < 0 || v > best) best = v, which = q;
          }
          const size_t o = ((size_t(s) * ho + oy) * wo + ox) * c + k;
          y[o] = best;
          argmax[o] = uint8_t(which);
        }
}

void maxpool2x2_backward(const float* dy, const uint8_t* argmax, float* dx, int n, int h, int w, int c) {
  const int ho = h / 2, wo = w / 2;
  const size_t row = size_t(w) * c;
#pragma omp parallel for collapse(2) schedule(static) if (size_t(n) * h * w * c > (1u << 16))
  for (int s = 0; s < n; ++s)
    for (int oy = 0; oy < ho; ++oy) {
      float* out0 = dx + (size_t(s) * h + 2 * oy) * row;
      float* out1 = out0 + row;
      const float* g = dy + (size_t(s) * ho + oy) * wo * c;
      const uint8_t* idx = argmax + (size_t(s) * ho + oy) * wo * c;
      if (backward_row_vectors(g, idx, wo, c, out0, out1)) continue;
      for (int ox = 0; ox < wo; ++ox) {
        float* a = out0 + size_t(2 * ox) * c;
        float* b = out1 + size_t(2 * ox) * c;
        for (int k = 0; k < c; ++k) {
          const float v = g[size_t(ox) * c + k];
          const uint8_t which = idx[size_t(ox) * c + k];
          a[k] = which == 0 ? v : 0.0f;
          a[c + k] = which == 1 ? v : 0.0f;
          b[k] = which == 2 ? v : 0.0f;
          b[c + k] = which == 3 ? v : 0.0f;
        }
      }
    }
}

void maxpool2x2_backward_ref(const float* dy, const uint8_t* argmax, float* dx, int n, int h, int w, int c) {
  const int ho = h / 2, wo = w / 2;
  for (size_t i = 0; i < size_t(n) * h * w * c; ++i) dx[i] = 0.0f;
  for (int s = 0; s < n; ++s)
    for (int oy = 0; oy < ho; ++oy)
      for (int ox = 0; ox < wo; ++ox)
        for (int k = 0; k < c; ++k) {
          const size_t o = ((size_t(s) * ho + oy) * wo + ox) * c + k;
          const int q = argmax[o];
          dx[((size_t(s) * h + 2 * oy + q / 2) * w + 2 * ox + q % 2) * c + k] = dy[o];
        }
}

}  // namespace lbbsp::models
