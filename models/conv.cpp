#include "models/conv.hpp"

#include <algorithm>

#include "models/gemm.hpp"

namespace lbbsp::models {

namespace {

// im2col chunks are sized to stay in the last-level cache; a fixed size (independent of the thread count)
// keeps the dw summation order, and so the result, the same for any --threads.
constexpr size_t kColChunkFloats = size_t(1) << 19;
// Below this many floats of im2col work a parallel region costs more than it saves.
constexpr size_t kParallelMinFloats = size_t(1) << 15;

int samples_per_chunk(const ConvShape& s) {
  const size_t per_sample = size_t(s.height) * s.width * s.col_width();
  return int(std::max<size_t>(1, kColChunkFloats / std::max<size_t>(1, per_sample)));
}

// Element strides of x for one sample, in either layout.
struct Strides {
  size_t channel, row, col;
};
Strides input_strides(const ConvShape& s) {
  if (s.input_chw) return {size_t(s.height) * s.width, size_t(s.width), 1};
  return {1, size_t(s.width) * s.in_channels, size_t(s.in_channels)};
}

// col[(sample, oy, ox), (ky, kx, ci)] = x(sample, ci, oy + ky - pad, ox + kx - pad), zero outside.
void im2col(const ConvShape& s, const float* x, int samples, float* col) {
  const Strides st = input_strides(s);
  const int k = s.kernel, pad = s.pad(), c = s.in_channels, cw = s.col_width();
#pragma omp parallel for collapse(2) \
    schedule(static) if (size_t(samples) * s.height * s.width * cw > kParallelMinFloats)
  for (int n = 0; n < samples; ++n)
    for (int oy = 0; oy < s.height; ++oy) {
      const float* xs = x + size_t(n) * s.input_size();
      float* dst = col + (size_t(n) * s.height + oy) * s.width * cw;
      for (int ox = 0; ox < s.width; ++ox, dst += cw) {
        float* d = dst;
        for (int ky = 0; ky < k; ++ky) {
          const int iy = oy + ky - pad;
          if (iy < 0 || iy >= s.height) {
            std::fill(d, d + k * c, 0.0f);
            d += k * c;
            continue;
          }
          for (int kx = 0; kx < k; ++kx, d += c) {
            const int ix = ox + kx - pad;
            if (ix < 0 || ix >= s.width) {
              std::fill(d, d + c, 0.0f);
              continue;
            }
            const float* src = xs + iy * st.row + ix * st.col;
            for (int ci = 0; ci < c; ++ci) d[ci] = src[ci * st.channel];
          }
        }
      }
    }
}

// The adjoint of im2col, written as a gather so each dx element is summed by one thread in a fixed order.
void col2im(const ConvShape& s, const float* dcol, int samples, float* dx) {
  const Strides st = input_strides(s);
  const int k = s.kernel, pad = s.pad(), c = s.in_channels, cw = s.col_width();
#pragma omp parallel for collapse(2) \
    schedule(static) if (size_t(samples) * s.height * s.width * cw > kParallelMinFloats)
  for (int n = 0; n < samples; ++n)
    for (int iy = 0; iy < s.height; ++iy) {
      const float* dc = dcol + size_t(n) * s.height * s.width * cw;
      float* dxs = dx + size_t(n) * s.input_size();
      for (int ix = 0; ix < s.width; ++ix) {
        float* out = dxs + iy * st.row + ix * st.col;
        for (int ci = 0; ci < c; ++ci) out[ci * st.channel] = 0.0f;
        for (int ky = 0; ky < k; ++ky) {
          const int oy = iy - ky + pad;
          if (oy < 0 || oy >= s.height) continue;
          for (int kx = 0; kx < k; ++kx) {
            const int ox = ix - kx + pad;
            if (ox < 0 || ox >= s.width) continue;
            const float* src = dc + (size_t(oy) * s.width + ox) * cw + (ky * k + kx) * c;
            for (int ci = 0; ci < c; ++ci) out[ci * st.channel] += src[ci];
          }
        }
      }
    }
}

float input_at(const ConvShape& s, const float* x, int n, int ci, int iy, int ix) {
  if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) return 0.0f;
  const Strides st = input_strides(s);
  return x[n * s.input_size() + ci * st.channel + iy * st.row + ix * st.col];
}

}  // namespace

void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws) {
  const int chunk = samples_per_chunk(s), hw = s.height * s.width, cw = s.col_width();
  ws.col.resize(std::max(ws.col.size(), size_t(std::min(chunk, s.n)) * hw * cw));
  for (int s0 = 0; s0 < s.n; s0 += chunk) {
    const int cs = std::min(chunk, s.n - s0);
    im2col(s, x + s0 * s.input_size(), cs, ws.col.data());
    gemm(false, true, cs * hw, s.out_channels, cw, 1.0f, ws.col.data(), cw, w, cw, 0.0f,
         y + s0 * s.output_size(), s.out_channels);
  }
}

void conv2d_backward(const ConvShape& s, const float* x, const float* w, const float* dy, float* dw,
                     float* dx, ConvWorkspace& ws) {
  const int chunk = samples_per_chunk(s), hw = s.height * s.width, cw = s.col_width();
  const size_t col_floats = size_t(std::min(chunk, s.n)) * hw * cw;
  ws.col.resize(std::max(ws.col.size(), col_floats));
  if (dx) ws.dcol.resize(std::max(ws.dcol.size(), col_floats));
  for (int s0 = 0; s0 < s.n; s0 += chunk) {
    const int cs = std::min(chunk, s.n - s0), rows = cs * hw;
    const float* dys = dy + s0 * s.output_size();
    im2col(s, x + s0 * s.input_size(), cs, ws.col.data());
    gemm(true, false, s.out_channels, cw, rows, 1.0f, dys, s.out_channels, ws.col.data(), cw, 1.0f, dw, cw);
    if (!dx) continue;
    gemm(false, false, rows, cw, s.out_channels, 1.0f, dys, s.out_channels, w, cw, 0.0f, ws.dcol.data(), cw);
    col2im(s, ws.dcol.data(), cs, dx + s0 * s.input_size());
  }
}

void conv2d_forward_ref(const ConvShape& s, const float* x, const float* w, float* y) {
  const int k = s.kernel, pad = s.pad();
  for (int n = 0; n < s.n; ++n)
    for (int oy = 0; oy < s.height; ++oy)
      for (int ox = 0; ox < s.width; ++ox)
        for (int oc = 0; oc < s.out_channels; ++oc) {
          float acc = 0.0f;
          for (int ky = 0; ky < k; ++ky)
            for (int kx = 0; kx < k; ++kx)
              for (int ci = 0; ci < s.in_channels; ++ci)
                acc += w[((oc * k + ky) * k + kx) * s.in_channels + ci] *
                       input_at(s, x, n, ci, oy + ky - pad, ox + kx - pad);
          y[((size_t(n) * s.height + oy) * s.width + ox) * s.out_channels + oc] = acc;
        }
}

void conv2d_backward_ref(const ConvShape& s, const float* x, const float* w, const float* dy, float* dw,
                         float* dx) {
  const int k = s.kernel, pad = s.pad();
  const Strides st = input_strides(s);
  if (dx)
    for (size_t i = 0; i < size_t(s.n) * s.input_size(); ++i) dx[i] = 0.0f;
  for (int n = 0; n < s.n; ++n)
    for (int oy = 0; oy < s.height; ++oy)
      for (int ox = 0; ox < s.width; ++ox)
        for (int oc = 0; oc < s.out_channels; ++oc) {
          const float g = dy[((size_t(n) * s.height + oy) * s.width + ox) * s.out_channels + oc];
          for (int ky = 0; ky < k; ++ky)
            for (int kx = 0; kx < k; ++kx)
              for (int ci = 0; ci < s.in_channels; ++ci) {
                const int iy = oy + ky - pad, ix = ox + kx - pad;
                const size_t wi = ((oc * k + ky) * k + kx) * s.in_channels + ci;
                dw[wi] += g * input_at(s, x, n, ci, iy, ix);
                if (dx && iy >= 0 && iy < s.height && ix >= 0 && ix < s.width)
                  dx[n * s.input_size() + ci * st.channel + iy * st.row + ix * st.col] += g * w[wi];
              }
        }
}

}  // namespace lbbsp::models
