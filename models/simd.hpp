// The vector unit the fast kernels are written for, chosen at BUILD time from the compiler's target (the
// Release build uses -march=native): AVX-512F when __AVX512F__ is defined, else AVX2 + FMA. Without either
// (LBBSP_PORTABLE=ON, or a CPU older than Haswell) LBBSP_SIMD_LANES is not defined and the callers keep their
// portable path (im2col + BLAS). docs/threads.md says which path a build took (`lbbsp info` prints it).
#pragma once

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace lbbsp::models::simd {

#if defined(__AVX512F__)
#define LBBSP_SIMD_LANES 16
using Vec = __m512;
inline Vec zero() {
  return _mm512_setzero_ps();
}
inline Vec load(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void store(float* p, Vec v) {
  _mm512_storeu_ps(p, v);
}
inline Vec broadcast(const float* p) {
  return _mm512_set1_ps(*p);
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}  // a * b + c
constexpr int kAccumulators = 24;  // of 32 vector registers: the rest hold weights and a broadcast
constexpr const char* kName = "AVX-512F";
#elif defined(LBBSP_SIMD_EMULATE_512) && defined(__AVX2__) && defined(__FMA__)
// Tests only (tests/unit/test_models_simd512.cpp): the AVX-512 path's 16 lanes and tile shapes on two AVX2
// registers, so its indexing is exercised on a machine without AVX-512.
#define LBBSP_SIMD_LANES 16
struct Vec {
  __m256 lo, hi;
};
inline Vec zero() {
  return {_mm256_setzero_ps(), _mm256_setzero_ps()};
}
inline Vec load(const float* p) {
  return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
inline void store(float* p, Vec v) {
  _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi);
}
inline Vec broadcast(const float* p) {
  return {_mm256_broadcast_ss(p), _mm256_broadcast_ss(p)};
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
constexpr int kAccumulators = 24;
constexpr const char* kName = "AVX-512F emulated on AVX2 (tests)";
#elif defined(__AVX2__) && defined(__FMA__)
#define LBBSP_SIMD_LANES 8
using Vec = __m256;
inline Vec zero() {
  return _mm256_setzero_ps();
}
inline Vec load(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void store(float* p, Vec v) {
  _mm256_storeu_ps(p, v);
}
inline Vec broadcast(const float* p) {
  return _mm256_broadcast_ss(p);
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
constexpr int kAccumulators = 12;  // of 16 vector registers
constexpr const char* kName = "AVX2+FMA";
#else
constexpr const char* kName = "portable (no AVX2+FMA at build time)";
#endif

#ifdef LBBSP_SIMD_LANES
constexpr int kLanes = LBBSP_SIMD_LANES;
#endif

}  // namespace lbbsp::models::simd
