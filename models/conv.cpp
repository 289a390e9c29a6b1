#include "models/conv.hpp"

#include <algorithm>

#include "models/conv_simd.hpp"
#include "models/gemm.hpp"

namespace lbbsp::models {

namespace {

// im2col chunks are sized to stay in L2 (512 KiB; measured best of 2^17..2^20 floats for the CNN). The size
// does not depend on the thread count, so neither does the order in which chunks add into dw.
constexpr size_t kColChunkFloats = size_t(1) << 17;
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

// Channels last (or a single channel): one kernel row of one output pixel reads a contiguous run of x.
bool contiguous_taps(const ConvShape& s) {
  return !s.input_chw || s.in_channels == 1;
}

// col[(sample, oy, ox), (ky, kx, ci)] = x(sample, ci, oy + ky - pad, ox + kx - pad), zero outside.
void im2col(const ConvShape& s, const float* x, int samples, float* col) {
  const Strides st = input_strides(s);
  const int k = s.kernel, pad = s.pad(), c = s.in_channels, cw = s.col_width();
  const bool runs = contiguous_taps(s);
#pragma omp parallel for collapse(2) \
    schedule(static) if (size_t(samples) * s.height * s.width * cw > kParallelMinFloats)
  for (int n = 0; n < samples; ++n)
    for (int oy = 0; oy < s.height; ++oy) {
      const float* xs = x + size_t(n) * s.input_size();
      float* dst = col + (size_t(n) * s.height + oy) * s.width * cw;
      for (int ox = 0; ox < s.width; ++ox, dst += cw) {
        const int kx0 = std::max(0, pad - ox), kx1 = std::min(k, s.width + pad - ox);  // taps inside x
        float* d = dst;
        for (int ky = 0; ky < k; ++ky, d += k * c) {
          const int iy = oy + ky - pad;
          if (iy < 0 || iy >= s.height) {
            std::fill(d, d + k * c, 0.0f);
            continue;
          }
          std::fill(d, d + kx0 * c, 0.0f);
          std::fill(d + kx1 * c, d + k * c, 0.0f);
          const float* src = xs + iy * st.row + (ox + kx0 - pad) * st.col;
          if (runs) {
            std::copy(src, src + (kx1 - kx0) * c, d + kx0 * c);
            continue;
          }
          for (int kx = kx0; kx < kx1; ++kx, src += st.col)
            for (int ci = 0; ci < c; ++ci) d[kx * c + ci] = src[ci * st.channel];
        }
      }
    }
}

// Layers with a narrow im2col row (a first layer on one channel: 25 taps) skip im2col and GEMM, whose
// packing would cost more than the arithmetic, and accumulate straight from x. Weights are staged as
// [tap, out_channel] so the innermost loop runs over output channels (contiguous in y and dy).
constexpr int kDirectMaxColWidth = 32;
bool use_direct(const ConvShape& s) {
  return s.col_width() <= kDirectMaxColWidth;
}

// Plain direct loops for any shape; the register-blocked versions below take the common ones.
void plain_direct_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws) {
  const Strides st = input_strides(s);
  const int k = s.kernel, pad = s.pad(), c = s.in_channels, cw = s.col_width();
  const int oc = s.out_channels;
  ws.wt.resize(std::max(ws.wt.size(), size_t(cw) * oc));
  float* wt = ws.wt.data();
  for (int o = 0; o < oc; ++o)
    for (int t = 0; t < cw; ++t) wt[t * oc + o] = w[o * cw + t];
      // Per output row, each tap adds an outer product (x along the row) x (weights over channels): the
      // updates of one tap are independent, so there is no add-latency chain through a single accumulator.
#pragma omp parallel for collapse(2) \
    schedule(static) if (size_t(s.n) * s.output_size() * cw > kParallelMinFloats)
  for (int n = 0; n < s.n; ++n)
    for (int oy = 0; oy < s.height; ++oy) {
      const float* xs = x + size_t(n) * s.input_size();
      float* out = y + (size_t(n) * s.height + oy) * s.width * oc;
      std::fill(out, out + size_t(s.width) * oc, 0.0f);
      for (int ky = 0; ky < k; ++ky) {
        const int iy = oy + ky - pad;
        if (iy < 0 || iy >= s.height) continue;
        for (int kx = 0; kx < k; ++kx) {
          const int ox0 = std::max(0, pad - kx), ox1 = std::min(s.width, s.width + pad - kx);  // ix in range
          for (int ci = 0; ci < c; ++ci) {
            const float* src = xs + iy * st.row + ci * st.channel + (ox0 + kx - pad) * st.col;
            const float* wr = wt + ((ky * k + kx) * c + ci) * oc;
            for (int ox = ox0; ox < ox1; ++ox, src += st.col) {
              const float v = *src;
              float* o = out + size_t(ox) * oc;
#pragma omp simd
              for (int j = 0; j < oc; ++j) o[j] += v * wr[j];
            }
          }
        }
      }
    }
}

// dw[o, tap] += sum over pixels of dy[pixel, o] * x(tap of pixel). One thread owns each kernel row ky and
// walks the pixels in order, so the sum is the same for any thread count.
void plain_direct_weight_grad(const ConvShape& s, const float* x, const float* dy, float* dw,
                              ConvWorkspace& ws) {
  const Strides st = input_strides(s);
  const int k = s.kernel, pad = s.pad(), c = s.in_channels, cw = s.col_width();
  const int oc = s.out_channels;
  ws.wt.resize(std::max(ws.wt.size(), size_t(cw) * oc));
  float* acc = ws.wt.data();
  std::fill(acc, acc + size_t(cw) * oc, 0.0f);
#pragma omp parallel for schedule(static) if (size_t(s.n) * s.output_size() * cw > kParallelMinFloats)
  for (int ky = 0; ky < k; ++ky)
    for (int n = 0; n < s.n; ++n)
      for (int oy = 0; oy < s.height; ++oy) {
        const int iy = oy + ky - pad;
        if (iy < 0 || iy >= s.height) continue;
        const float* xrow = x + size_t(n) * s.input_size() + iy * st.row;
        const float* g = dy + (size_t(n) * s.height + oy) * s.width * oc;
        for (int ox = 0; ox < s.width; ++ox, g += oc) {
          const int kx0 = std::max(0, pad - ox), kx1 = std::min(k, s.width + pad - ox);
          for (int kx = kx0; kx < kx1; ++kx) {
            const float* src = xrow + (ox + kx - pad) * st.col;
            for (int ci = 0; ci < c; ++ci) {
              const float v = src[ci * st.channel];
              float* a = acc + ((ky * k + kx) * c + ci) * oc;
#pragma omp simd
              for (int o = 0; o < oc; ++o) a[o] += v * g[o];
            }
          }
        }
      }
  for (int o = 0; o < oc; ++o)
    for (int t = 0; t < cw; ++t) dw[o * cw + t] += acc[t * oc + o];
}

// Channels-last copy of x with a zero border of pad (plus slack for the last register block's over-read),
// so the blocked loops below need no bounds checks.
const float* padded_input(const ConvShape& s, const float* x, ConvWorkspace& ws, int slack) {
  const Strides st = input_strides(s);
  const int pad = s.pad(), c = s.in_channels, hp = s.height + 2 * pad, wp = s.width + 2 * pad;
  ws.padded.assign(size_t(s.n) * hp * wp * c + slack, 0.0f);
  for (int n = 0; n < s.n; ++n)
    for (int iy = 0; iy < s.height; ++iy)
      for (int ix = 0; ix < s.width; ++ix)
        for (int ci = 0; ci < c; ++ci)
          ws.padded[((size_t(n) * hp + iy + pad) * wp + ix + pad) * c + ci] =
              x[n * s.input_size() + iy * st.row + ix * st.col + ci * st.channel];
  return ws.padded.data();
}

// Register-blocked direct forward: kBlock neighbouring output pixels x kOc channels of accumulators stay in
// registers across all taps (8 AVX2 registers for 4 x 16).
constexpr int kBlock = 4;
template <int kK, int kOc>
void blocked_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws) {
  const int k = kK > 0 ? kK : s.kernel, c = s.in_channels, cw = s.col_width();
  const int hp = s.height + 2 * s.pad(), wp = s.width + 2 * s.pad();
  const float* xp = padded_input(s, x, ws, kBlock * c);
  ws.wt.resize(std::max(ws.wt.size(), size_t(cw) * kOc));
  float* wt = ws.wt.data();
  for (int o = 0; o < kOc; ++o)
    for (int t = 0; t < cw; ++t) wt[t * kOc + o] = w[o * cw + t];
#pragma omp parallel for collapse(2) \
    schedule(static) if (size_t(s.n) * s.output_size() * cw > kParallelMinFloats)
  for (int n = 0; n < s.n; ++n)
    for (int oy = 0; oy < s.height; ++oy) {
      const float* xs = xp + size_t(n) * hp * wp * c;
      float* out = y + (size_t(n) * s.height + oy) * s.width * kOc;
      for (int ox0 = 0; ox0 < s.width; ox0 += kBlock) {
        float acc[kBlock][kOc] = {};
        for (int ky = 0; ky < k; ++ky)
          for (int kx = 0; kx < k; ++kx)
            for (int ci = 0; ci < c; ++ci) {
              const float* wr = wt + ((ky * k + kx) * c + ci) * kOc;
              const float* src = xs + (size_t(oy + ky) * wp + ox0 + kx) * c + ci;
              for (int b = 0; b < kBlock; ++b) {
                const float v = src[b * c];
#pragma omp simd
                for (int j = 0; j < kOc; ++j) acc[b][j] += v * wr[j];
              }
            }
        const int valid = std::min(kBlock, s.width - ox0);  // the last block may hang over the row end
        for (int b = 0; b < valid; ++b) std::copy(acc[b], acc[b] + kOc, out + size_t(ox0 + b) * kOc);
      }
    }
}

// Register-blocked weight gradient: for one (ky, ci), kK x kOc accumulators (10 AVX2 registers for 5 x 16)
// run over every pixel in order; each (ky, ci) belongs to one thread, so the sum order is fixed.
template <int kK, int kOc>
void blocked_weight_grad(const ConvShape& s, const float* x, const float* dy, float* dw, ConvWorkspace& ws) {
  const int c = s.in_channels, cw = s.col_width();
  const int hp = s.height + 2 * s.pad(), wp = s.width + 2 * s.pad();
  const float* xp = padded_input(s, x, ws, 0);
#pragma omp parallel for schedule(static) if (size_t(s.n) * s.output_size() * cw > kParallelMinFloats)
  for (int row = 0; row < kK * c; ++row) {
    const int ky = row / c, ci = row % c;
    float acc[kK][kOc] = {};
    for (int n = 0; n < s.n; ++n)
      for (int oy = 0; oy < s.height; ++oy) {
        const float* g = dy + (size_t(n) * s.height + oy) * s.width * kOc;
        const float* src = xp + ((size_t(n) * hp + oy + ky) * wp) * c + ci;
        for (int ox = 0; ox < s.width; ++ox, g += kOc, src += c)
          for (int kx = 0; kx < kK; ++kx) {
            const float v = src[kx * c];
#pragma omp simd
            for (int j = 0; j < kOc; ++j) acc[kx][j] += v * g[j];
          }
      }
    for (int kx = 0; kx < kK; ++kx)
      for (int j = 0; j < kOc; ++j) dw[j * cw + (ky * kK + kx) * c + ci] += acc[kx][j];
  }
}

void direct_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws) {
  if (s.out_channels == 16)
    return s.kernel == 5 ? blocked_forward<5, 16>(s, x, w, y, ws) : blocked_forward<0, 16>(s, x, w, y, ws);
  plain_direct_forward(s, x, w, y, ws);
}

void direct_weight_grad(const ConvShape& s, const float* x, const float* dy, float* dw, ConvWorkspace& ws) {
  if (s.kernel == 5 && s.out_channels == 16) return blocked_weight_grad<5, 16>(s, x, dy, dw, ws);
  plain_direct_weight_grad(s, x, dy, dw, ws);
}

float input_at(const ConvShape& s, const float* x, int n, int ci, int iy, int ix) {
  if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) return 0.0f;
  const Strides st = input_strides(s);
  return x[n * s.input_size() + ci * st.channel + iy * st.row + ix * st.col];
}

// dx is the 'full' correlation of dy with the kernel flipped in space and transposed in channels:
// dx[p, ci] = sum over (ky, kx, o) of dy[p + (ky - pad, kx - pad), o] * w[o, k-1-ky, k-1-kx, ci].
// So: im2col over dy and one GEMM straight into dx, with no col_width-wide gradient buffer to scatter back.
void input_grad(const ConvShape& s, const float* w, const float* dy, float* dx, ConvWorkspace& ws) {
  ConvShape t = s;  // the transposed convolution: dy (channels last) in, dx out
  t.in_channels = s.out_channels;
  t.out_channels = s.in_channels;
  t.input_chw = false;
  const int k = s.kernel, c = s.in_channels, oc = s.out_channels, tw = t.col_width(), hw = s.height * s.width;
  ws.wflip.resize(size_t(tw) * c);
  for (int ky = 0; ky < k; ++ky)
    for (int kx = 0; kx < k; ++kx)
      for (int o = 0; o < oc; ++o)
        for (int ci = 0; ci < c; ++ci)
          ws.wflip[((ky * k + kx) * oc + o) * c + ci] =
              w[((o * k + (k - 1 - ky)) * k + (k - 1 - kx)) * c + ci];
  const bool to_chw = s.input_chw && c > 1;  // the GEMM writes channels last; a CHW dx needs a transpose
  const int chunk = samples_per_chunk(t), rows_max = std::min(chunk, s.n) * hw;
  ws.dy_col.resize(std::max(ws.dy_col.size(), size_t(rows_max) * tw));
  if (to_chw) ws.staging.resize(std::max(ws.staging.size(), size_t(rows_max) * c));
  for (int s0 = 0; s0 < s.n; s0 += chunk) {
    const int cs = std::min(chunk, s.n - s0);
    im2col(t, dy + s0 * s.output_size(), cs, ws.dy_col.data());
    float* target = to_chw ? ws.staging.data() : dx + s0 * s.input_size();
    gemm(false, false, cs * hw, c, tw, 1.0f, ws.dy_col.data(), tw, ws.wflip.data(), c, 0.0f, target, c);
    if (!to_chw) continue;
    for (int n = 0; n < cs; ++n)
      for (int p = 0; p < hw; ++p)
        for (int ci = 0; ci < c; ++ci)
          dx[(s0 + n) * s.input_size() + size_t(ci) * hw + p] = target[(size_t(n) * hw + p) * c + ci];
  }
}

}  // namespace

void conv2d_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws) {
  if (!ws.portable && conv_simd_forward(s, x, w, y, ws)) return;
  if (use_direct(s)) return direct_forward(s, x, w, y, ws);
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
  if (!ws.portable && conv_simd_backward(s, x, w, dy, dw, dx, ws)) return;
  if (use_direct(s)) {
    direct_weight_grad(s, x, dy, dw, ws);
  } else {
    const int chunk = samples_per_chunk(s), hw = s.height * s.width, cw = s.col_width();
    ws.col.resize(std::max(ws.col.size(), size_t(std::min(chunk, s.n)) * hw * cw));
    for (int s0 = 0; s0 < s.n; s0 += chunk) {
      const int cs = std::min(chunk, s.n - s0);
      im2col(s, x + s0 * s.input_size(), cs, ws.col.data());
      gemm(true, false, s.out_channels, cw, cs * hw, 1.0f, dy + s0 * s.output_size(), s.out_channels,
           ws.col.data(), cw, 1.0f, dw, cw);
    }
  }
  if (dx) input_grad(s, w, dy, dx, ws);
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
