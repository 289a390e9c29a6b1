// Checks for CUDA runtime and cuBLAS calls (llm.c's cudaCheck style): a failure throws std::runtime_error
// naming the call, the file and the line.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace lbbsp::models::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line) + " in " +
                           call);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                            int line) {
  throw std::runtime_error(std::string("cuBLAS error ") + cublasGetStatusName(status) + " (" +
                           cublasGetStatusString(status) + ") at " + file + ":" + std::to_string(line) +
                           " in " + call);
}

}  // namespace lbbsp::models::cuda

#define LBBSP_CUDA_CHECK(call)                                                             \
  do {                                                                                     \
    const cudaError_t lbbsp_cuda_err_ = (call);                                            \
    if (lbbsp_cuda_err_ != cudaSuccess)                                                    \
      ::lbbsp::models::cuda::throw_cuda_error(lbbsp_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define LBBSP_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                            \
    const cublasStatus_t lbbsp_cublas_status_ = (call);                                           \
    if (lbbsp_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::lbbsp::models::cuda::throw_cublas_error(lbbsp_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports a bad launch configuration at the launch site (errors inside the kernel
// surface at the next synchronising call, which is checked too).
#define LBBSP_CUDA_CHECK_LAUNCH() LBBSP_CUDA_CHECK(cudaGetLastError())
