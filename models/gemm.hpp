// Row-major single-precision GEMM shared by the kernels: C = alpha * op(A) * op(B) + beta * C (OpenBLAS).
// Threads are ours: a large GEMM splits the longer side of C (rows or columns) over the OpenMP threads and
// every BLAS call runs on one thread (docs/threads.md), so the BLAS never adds threads of its own to the ones
// our kernels use.
#pragma once

namespace lbbsp::models {

// Below this many multiply-adds (about 10 us on one core) a kernel's split over threads saves less than it
// costs, even with the other thread awake (spinning since the last parallel loop;
// runtime/platform/kernel_env.hpp). MLP at 2 threads, batch 64: 1.27x one thread at 2^22, 1.73x at
// 2^20, 1.55x at 2^18. gemm and the convolutions.
constexpr double kParallelMinFma = double(1 << 20);

// Sets the BLAS to one thread per call (gemm does this on first use; set_num_threads does it too).
void blas_use_one_thread();

// The core whose kernels OpenBLAS runs ("Haswell", "SkylakeX", ...): its pick for this CPU when it loaded, or
// OPENBLAS_CORETYPE's.
const char* blas_core();

// op(A) is m x k, op(B) is k x n, C is m x n; lda/ldb/ldc are the row strides of the stored matrices.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace lbbsp::models
