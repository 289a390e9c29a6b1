// The NARX network's kernels: a scalar reference for any hidden width beside AVX2+FMA versions for widths 8
// and 16 (the defaults), and the dispatch between them. Header-only so they inline into the training loop.
//
// Parameter layout (narx.hpp): W1 input-major (inputs x hidden: each input adds a broadcast multiple of one
// contiguous row to all hidden pre-activations, independent lanes with no reduction chain), b1, w2, b2.
//
// The SIMD versions sum in another order than the scalar ones (two accumulators, a tree for the output) and
// fuse multiply-adds, so they agree to float rounding, not bit for bit (tests/unit/test_predictors_narx.cpp).
#pragma once
#include <algorithm>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LBBSP_NARX_SIMD 1
#else
#define LBBSP_NARX_SIMD 0
#endif

namespace lbbsp::predictors::narx {

// tanh by a [7/6] Pade approximant clamped at +-4.97 (abs. error < 1e-4 everywhere): several times
// cheaper than std::tanh and vectorisable; the NARX update cost is dominated by it otherwise.
inline float fast_tanh(float x) {
  x = std::min(std::max(x, -4.97f), 4.97f);
  const float x2 = x * x;
  const float num = x * (135135.0f + x2 * (17325.0f + x2 * (378.0f + x2)));
  const float den = 135135.0f + x2 * (62370.0f + x2 * (3150.0f + 28.0f * x2));
  return std::min(std::max(num / den, -1.0f), 1.0f);
}

// ---- scalar reference, any width h ----

// One sample through the network (n_in inputs, h hidden units); hidden receives the tanh activations.
inline float scalar_forward(const float* __restrict w, int n_in, int h, const float* __restrict x,
                            float* __restrict hidden) {
  const float* __restrict b1 = w + h * n_in;
  const float* __restrict w2 = b1 + h;
  for (int j = 0; j < h; ++j) hidden[j] = b1[j];
  for (int i = 0; i < n_in; ++i) {
    const float xi = x[i];
    const float* __restrict row = w + i * h;
    for (int j = 0; j < h; ++j) hidden[j] += row[j] * xi;
  }
  float out = w2[h];  // b2
  for (int j = 0; j < h; ++j) {
    hidden[j] = fast_tanh(hidden[j]);
    out += w2[j] * hidden[j];
  }
  return out;
}

// One sample's squared-error gradient (times `weight`) added to grad (same layout as the parameters); dh is
// scratch of h floats.
inline void scalar_accumulate(const float* __restrict w, int n_in, int h, const float* __restrict x,
                              float target, float weight, float* __restrict grad, float* __restrict hidden,
                              float* __restrict dh) {
  const float d_out = (scalar_forward(w, n_in, h, x, hidden) - target) * weight;
  const float* __restrict w2 = w + h * n_in + h;
  float* __restrict g_b1 = grad + h * n_in;
  float* __restrict g_w2 = g_b1 + h;
  g_w2[h] += d_out;
  for (int j = 0; j < h; ++j) {
    g_w2[j] += d_out * hidden[j];
    dh[j] = d_out * w2[j] * (1 - hidden[j] * hidden[j]);
    g_b1[j] += dh[j];
  }
  for (int i = 0; i < n_in; ++i) {
    const float xi = x[i];
    float* __restrict row = grad + i * h;
    for (int j = 0; j < h; ++j) row[j] += xi * dh[j];
  }
}

// ---- AVX2+FMA, h = 8 V ----
#if LBBSP_NARX_SIMD
inline __m256 tanh8(__m256 x) {  // fast_tanh on 8 lanes
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-4.97f)), _mm256_set1_ps(4.97f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 num = _mm256_add_ps(x2, _mm256_set1_ps(378.0f));
  num = _mm256_fmadd_ps(x2, num, _mm256_set1_ps(17325.0f));
  num = _mm256_fmadd_ps(x2, num, _mm256_set1_ps(135135.0f));
  num = _mm256_mul_ps(x, num);
  __m256 den = _mm256_fmadd_ps(x2, _mm256_set1_ps(28.0f), _mm256_set1_ps(3150.0f));
  den = _mm256_fmadd_ps(x2, den, _mm256_set1_ps(62370.0f));
  den = _mm256_fmadd_ps(x2, den, _mm256_set1_ps(135135.0f));
  const __m256 t = _mm256_div_ps(num, den);
  return _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-1.0f)), _mm256_set1_ps(1.0f));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// V blocks of 8 hidden units (h = 8 V); two accumulators per block halve the FMA dependency chain.
template <int V>
inline float simd_forward(const float* __restrict w, int n_in, const float* __restrict x,
                          float* __restrict hidden) {
  constexpr int h = 8 * V;
  const float* b1 = w + h * n_in;
  const float* w2 = b1 + h;
  __m256 a0[V], a1[V];
  for (int v = 0; v < V; ++v) {
    a0[v] = _mm256_loadu_ps(b1 + 8 * v);
    a1[v] = _mm256_setzero_ps();
  }
  int i = 0;
  for (; i + 1 < n_in; i += 2) {
    const __m256 xa = _mm256_set1_ps(x[i]), xb = _mm256_set1_ps(x[i + 1]);
    for (int v = 0; v < V; ++v) {
      a0[v] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i * h + 8 * v), xa, a0[v]);
      a1[v] = _mm256_fmadd_ps(_mm256_loadu_ps(w + (i + 1) * h + 8 * v), xb, a1[v]);
    }
  }
  if (i < n_in) {
    const __m256 xa = _mm256_set1_ps(x[i]);
    for (int v = 0; v < V; ++v) a0[v] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i * h + 8 * v), xa, a0[v]);
  }
  __m256 out = _mm256_setzero_ps();
  for (int v = 0; v < V; ++v) {
    const __m256 t = tanh8(_mm256_add_ps(a0[v], a1[v]));
    _mm256_storeu_ps(hidden + 8 * v, t);
    out = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + 8 * v), t, out);
  }
  return hsum8(out) + w2[h];
}

template <int V>
inline void simd_accumulate(const float* __restrict w, int n_in, const float* __restrict x, float target,
                            float weight, float* __restrict grad, float* __restrict hidden) {
  constexpr int h = 8 * V;
  const float d_out = (simd_forward<V>(w, n_in, x, hidden) - target) * weight;
  const float* w2 = w + h * n_in + h;
  float* g_b1 = grad + h * n_in;
  float* g_w2 = g_b1 + h;
  g_w2[h] += d_out;
  const __m256 d = _mm256_set1_ps(d_out), one = _mm256_set1_ps(1.0f);
  __m256 dh[V];
  for (int v = 0; v < V; ++v) {
    const __m256 t = _mm256_loadu_ps(hidden + 8 * v);
    _mm256_storeu_ps(g_w2 + 8 * v, _mm256_fmadd_ps(d, t, _mm256_loadu_ps(g_w2 + 8 * v)));
    dh[v] = _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(w2 + 8 * v)), _mm256_fnmadd_ps(t, t, one));
    _mm256_storeu_ps(g_b1 + 8 * v, _mm256_add_ps(_mm256_loadu_ps(g_b1 + 8 * v), dh[v]));
  }
  for (int i = 0; i < n_in; ++i) {
    const __m256 xi = _mm256_set1_ps(x[i]);
    for (int v = 0; v < V; ++v) {
      float* row = grad + i * h + 8 * v;
      _mm256_storeu_ps(row, _mm256_fmadd_ps(xi, dh[v], _mm256_loadu_ps(row)));
    }
  }
}
#endif

// ---- dispatch: the SIMD version where there is one for this width, the scalar one otherwise ----

inline float forward(const float* w, int n_in, int h, const float* x, float* hidden) {
#if LBBSP_NARX_SIMD
  if (h == 8) return simd_forward<1>(w, n_in, x, hidden);
  if (h == 16) return simd_forward<2>(w, n_in, x, hidden);
#endif
  return scalar_forward(w, n_in, h, x, hidden);
}

inline void accumulate(const float* w, int n_in, int h, const float* x, float target, float weight,
                       float* grad, float* hidden, float* dh) {
#if LBBSP_NARX_SIMD
  if (h == 8) return simd_accumulate<1>(w, n_in, x, target, weight, grad, hidden);
  if (h == 16) return simd_accumulate<2>(w, n_in, x, target, weight, grad, hidden);
#endif
  scalar_accumulate(w, n_in, h, x, target, weight, grad, hidden, dh);
}

}  // namespace lbbsp::predictors::narx
