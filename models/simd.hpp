// The vector unit the fast kernels are written for, chosen at BUILD time from the compiler's target (the
// Release build uses -march=native): AVX-512F when __AVX512F__ is defined, else AVX2 + FMA. Without either
// (LBBSP_PORTABLE=ON, or a CPU older than Haswell) LBBSP_SIMD_LANES is not defined and the callers keep their
// portable path (im2col + BLAS). docs/threads.md says which path a build took (`lbbsp info` prints it).
#pragma once

#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace lbbsp::models::simd {

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// 8-lane helpers of the AVX2 path, also the halves of the emulated 16-lane one.
inline __m256 select_greater8(__m256 a, __m256 b, __m256 x, __m256 y) {
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
}
inline __m256 keep_where_equal8(const uint8_t* idx, int q, __m256 v) {
  const __m256i i = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(idx)));
  return _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(i, _mm256_set1_epi32(q))), v);
}
inline void store_bytes8(uint8_t* p, __m256 whole) {
  const __m256i i = _mm256_cvttps_epi32(whole);
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
}
#endif

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
// The maskz forms with every lane set: GCC 12 warns of an uninitialised operand in the plain ones.
constexpr __mmask16 kAll = 0xFFFF;
inline Vec select_greater(Vec a, Vec b, Vec x, Vec y) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), y, x);
}  // a > b ? x : y per lane (false where either is NaN)
inline Vec keep_where_equal(const uint8_t* idx, int q, Vec v) {
  const __m512i i = _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(idx)));
  return _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, _mm512_set1_epi32(q)), v);
}  // idx[l] == q ? v[l] : 0, from kLanes bytes
inline void store_bytes(uint8_t* p, Vec whole) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm512_maskz_cvtepi32_epi8(kAll, _mm512_maskz_cvttps_epi32(kAll, whole)));
}  // lanes holding whole numbers 0..255, as kLanes bytes
constexpr int kAccumulators = 24;  // of 32 vector registers: the rest hold weights and a broadcast
constexpr int kRegisters = 32;
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
inline Vec select_greater(Vec a, Vec b, Vec x, Vec y) {
  return {select_greater8(a.lo, b.lo, x.lo, y.lo), select_greater8(a.hi, b.hi, x.hi, y.hi)};
}
inline Vec keep_where_equal(const uint8_t* idx, int q, Vec v) {
  return {keep_where_equal8(idx, q, v.lo), keep_where_equal8(idx + 8, q, v.hi)};
}
inline void store_bytes(uint8_t* p, Vec whole) {
  store_bytes8(p, whole.lo), store_bytes8(p + 8, whole.hi);
}
constexpr int kAccumulators = 24;
constexpr int kRegisters = 32;  // as on AVX-512: the tile shapes under test are AVX-512's
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
inline Vec select_greater(Vec a, Vec b, Vec x, Vec y) {
  return select_greater8(a, b, x, y);
}
inline Vec keep_where_equal(const uint8_t* idx, int q, Vec v) {
  return keep_where_equal8(idx, q, v);
}
inline void store_bytes(uint8_t* p, Vec whole) {
  store_bytes8(p, whole);
}
constexpr int kAccumulators = 12;  // of 16 vector registers
constexpr int kRegisters = 16;
constexpr const char* kName = "AVX2+FMA";
#else
constexpr const char* kName = "portable (no AVX2+FMA at build time)";
#endif

#ifdef LBBSP_SIMD_LANES
constexpr int kLanes = LBBSP_SIMD_LANES;
#endif

}  // namespace lbbsp::models::simd
