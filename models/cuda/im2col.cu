// im2col (forward and weight gradient of a 'same' convolution) and its adjoint col2im (input gradient), one
// thread per written element. col2im gathers instead of scattering, so it needs no atomics and the sum order
// is fixed.
#include "models/cuda/cuda_check.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models::cuda {

namespace {

// Offset of input element (s, ci, iy, ix) in either per-sample layout.
__device__ size_t input_offset(const ConvGeometry& g, size_t s, int ci, int iy, int ix) {
  const size_t base = s * g.input_size();
  if (g.input_chw) return base + (size_t(ci) * g.height + iy) * g.width + ix;
  return base + (size_t(iy) * g.width + ix) * g.channels + ci;
}

// Element e of col is (row, t) with row = (s * h + oy) * w + ox and t = (ky * k + kx) * c + ci.
__global__ void im2col_kernel(ConvGeometry g, const float* x, size_t count, float* col) {
  const int cw = g.col_width();
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < count;
       e += size_t(gridDim.x) * blockDim.x) {
    const int t = int(e % cw);
    const size_t row = e / cw;
    const int ci = t % g.channels, kx = (t / g.channels) % g.kernel, ky = t / g.channels / g.kernel;
    const int ox = int(row % g.width), oy = int(row / g.width % g.height);
    const size_t s = row / g.width / g.height;
    const int iy = oy + ky - g.pad(), ix = ox + kx - g.pad();
    const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
    col[e] = inside ? x[input_offset(g, s, ci, iy, ix)] : 0.0f;
  }
}

// Element e of dx is (s, ci, iy, ix) in dx's layout. It was copied by im2col into every (oy, ox, ky, kx) with
// oy + ky - pad == iy and ox + kx - pad == ix, i.e. oy = iy - ky + pad, ox = ix - kx + pad, when inside.
__global__ void col2im_kernel(ConvGeometry g, const float* col, size_t count, float* dx) {
  const int cw = g.col_width(), c = g.channels, h = g.height, w = g.width, k = g.kernel, pad = g.pad();
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < count;
       e += size_t(gridDim.x) * blockDim.x) {
    int ci, iy, ix;
    size_t s;
    if (g.input_chw) {  // [s][c][h][w]
      ix = int(e % w), iy = int(e / w % h), ci = int(e / w / h % c);
      s = e / w / h / c;
    } else {  // [s][h][w][c]
      ci = int(e % c), ix = int(e / c % w), iy = int(e / c / w % h);
      s = e / c / w / h;
    }
    float acc = 0.0f;
    for (int ky = 0; ky < k; ++ky) {
      const int oy = iy - ky + pad;
      if (oy < 0 || oy >= h) continue;
      for (int kx = 0; kx < k; ++kx) {
        const int ox = ix - kx + pad;
        if (ox < 0 || ox >= w) continue;
        acc += col[((s * h + oy) * w + ox) * cw + (ky * k + kx) * c + ci];
      }
    }
    dx[e] = acc;
  }
}

}  // namespace

void im2col(const ConvGeometry& g, const float* x, int samples, float* col, cudaStream_t stream) {
  const size_t count = size_t(samples) * g.height * g.width * g.col_width();
  if (count == 0) return;
  im2col_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(g, x, count, col);
  LBBSP_CUDA_CHECK_LAUNCH();
}

void col2im(const ConvGeometry& g, const float* col, int samples, float* dx, cudaStream_t stream) {
  const size_t count = size_t(samples) * g.input_size();
  if (count == 0) return;
  col2im_kernel<<<grid_for(count), kThreadsPerBlock, 0, stream>>>(g, col, count, dx);
  LBBSP_CUDA_CHECK_LAUNCH();
}

}  // namespace lbbsp::models::cuda
