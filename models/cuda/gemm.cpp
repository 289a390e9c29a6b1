// Row-major GEMM on cuBLAS (column-major): a row-major matrix is the transpose of the same memory read
// column-major, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and
// m/n.
#include "models/cuda/cuda_check.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models::cuda {

void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  LBBSP_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta,
                                 c, ldc));
}

}  // namespace lbbsp::models::cuda
