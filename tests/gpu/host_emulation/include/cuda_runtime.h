// Host emulation of the small part of the CUDA runtime that lbbsp_cuda uses, for checking the backend's logic
// on a machine without a GPU: "device" memory is host memory, copies are memcpy, kernels run block by block
// on the CPU (see emulated_launch.hpp). Not a CUDA implementation: only what models/cuda/ calls.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
using cudaStream_t = struct EmuStream*;
constexpr unsigned cudaStreamNonBlocking = 1;

#define __global__
#define __device__
#define __host__
#define __shared__ static

namespace emu {
inline std::map<void*, size_t>& allocations() {
  static std::map<void*, size_t> a;
  return a;
}
inline size_t allocated_bytes() {
  size_t total = 0;
  for (const auto& [p, s] : allocations()) total += s;
  return total;
}
constexpr size_t kTotalBytes = size_t(8) << 30;
}  // namespace emu

inline const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "emulated error";
}
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  return d == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  // Poison fresh memory so reads of never-written "device" memory show up as NaN in results.
  *p = std::malloc(bytes);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);
  emu::allocations()[*p] = bytes;
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  emu::allocations().erase(p);
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  *total = emu::kTotalBytes;
  *free = emu::kTotalBytes - emu::allocated_bytes();
  return cudaSuccess;
}
