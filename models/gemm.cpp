#include "models/gemm.hpp"

#include <cblas.h>
#include <omp.h>

#include "models/model.hpp"

namespace lbbsp::models {

namespace {

void blas_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void blas_use_one_thread() {
  openblas_set_num_threads(1);
}

const char* blas_core() {
  return openblas_get_corename();
}

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  static const bool blas_single = (blas_use_one_thread(), true);  // even if set_num_threads never ran
  (void)blas_single;
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS may skip the beta scaling when k == 0; do it here so the contract always holds.
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Split the longer side of C: every thread packs all of the operand along the other side, so splitting the
  // rows of a short, wide C (a 32-sample batch times 256 units) would pack the whole weight matrix twice.
  const bool by_rows = m >= n;
  const int side = by_rows ? m : n;
  if (threads == 1 || double(m) * n * k < kParallelMinFma || side < 2 * threads)
    return blas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    // Each thread a single-threaded BLAS call: the BLAS never starts threads of its own, so it cannot
    // oversubscribe the cores our OpenMP threads run on.
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    const int s0 = int(int64_t(side) * t / count), s1 = int(int64_t(side) * (t + 1) / count);
    if (s1 > s0 && by_rows) {
      const float* a_rows = trans_a ? a + s0 : a + int64_t(s0) * lda;  // op(A) row r is column r of A^T
      blas_gemm(trans_a, trans_b, s1 - s0, n, k, alpha, a_rows, lda, b, ldb, beta, c + int64_t(s0) * ldc,
                ldc);
    } else if (s1 > s0) {
      const float* b_cols = trans_b ? b + int64_t(s0) * ldb : b + s0;  // op(B) column j is row j of B^T
      blas_gemm(trans_a, trans_b, m, s1 - s0, k, alpha, a, lda, b_cols, ldb, beta, c + s0, ldc);
    }
  }
  mark_team_released();
}

}  // namespace lbbsp::models
