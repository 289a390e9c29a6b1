// Row-major single-precision GEMM shared by the kernels: C = alpha * op(A) * op(B) + beta * C (OpenBLAS).
#pragma once

namespace lbbsp::models {

// op(A) is m x k, op(B) is k x n, C is m x n; lda/ldb/ldc are the row strides of the stored matrices.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace lbbsp::models
