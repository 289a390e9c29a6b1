// Direct convolution kernels on the build's vector unit (models/simd.hpp): no im2col, no BLAS. Each kernel is
// one register tile (R pixels or taps x NV vectors of channels) run over a zero-padded channels-last copy of
// its input, with one OpenMP loop over disjoint output tiles. Every output element is summed by one thread in
// a fixed order, so the result does not depend on the thread count. Plain twins: conv2d_*_ref in conv.cpp.
#include "models/conv_simd.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "models/gemm.hpp"  // kParallelMinFma
#include "models/simd.hpp"

namespace lbbsp::models {
#ifdef LBBSP_SIMD_EMULATE_512
inline namespace emulated512 {
#else
inline namespace native {
#endif

#ifndef LBBSP_SIMD_LANES

bool conv_simd_forward(const ConvShape&, const float*, const float*, float*, ConvWorkspace&) {
  return false;
}
bool conv_simd_backward(const ConvShape&, const float*, const float*, const float*, float*, float*,
                        ConvWorkspace&) {
  return false;
}

#else

namespace {

using simd::Vec;
// Fully unrolled register tiles: with constant indices the compiler keeps acc[][] in registers.
#define LBBSP_UNROLL _Pragma("GCC unroll 32")
constexpr int kL = simd::kLanes;

// Output-channel vectors per tile: two when the channels allow (more reuse of each broadcast), else one.
int tile_vectors(int channels) {
  return channels % (2 * kL) == 0 ? 2 : 1;
}
bool fits_vectors(int channels) {
  return channels > 0 && channels % kL == 0;
}
// Pieces of at most max_piece covering [0, total), as even as possible (14 -> 4, 5, 5 for max_piece 6).
int pieces(int total, int max_piece) {
  return (total + max_piece - 1) / max_piece;
}
int piece_begin(int total, int count, int i) {
  return int(int64_t(i) * total / count);
}

// Zero-padded channels-last copy of one tensor [n, h, w, c] (or a [n, 1, h, w] one) with a border of pad.
struct Padded {
  const float* data;
  size_t row, image;  // floats per padded row and per padded sample
};
Padded pad_input(const ConvShape& s, const float* x, std::vector<float>& buffer) {
  const int pad = s.pad(), c = s.in_channels, hp = s.height + 2 * pad, wp = s.width + 2 * pad;
  const size_t row = size_t(wp) * c, image = size_t(hp) * row, in_row = size_t(s.width) * c;
  buffer.resize(std::max(buffer.size(), size_t(s.n) * image));
#pragma omp parallel for schedule(static) if (double(s.n) * image > kParallelMinFma / 8)
  for (int n = 0; n < s.n; ++n) {
    float* dst = buffer.data() + size_t(n) * image;
    const float* src = x + size_t(n) * s.input_size();  // [c=1, h, w] and [h, w, c] have the same order
    std::fill(dst, dst + size_t(pad) * row, 0.0f);
    std::fill(dst + size_t(pad + s.height) * row, dst + image, 0.0f);
    for (int iy = 0; iy < s.height; ++iy) {
      float* d = dst + size_t(iy + pad) * row;
      std::fill(d, d + size_t(pad) * c, 0.0f);
      std::copy(src + iy * in_row, src + (iy + 1) * in_row, d + size_t(pad) * c);
      std::fill(d + size_t(pad) * c + in_row, d + row, 0.0f);
    }
  }
  return {buffer.data(), row, image};
}

// y[r, v] = sum over ky < k, j < kc of x[offset[r] + ky * row + j] * wt[(ky * kc + j) * oc + v]: R
// consecutive output pixels of one sample (a tile may wrap to the next row), NV vectors of output channels.
// offset[r] is where pixel r's window starts in the padded sample x.
template <int R, int NV>
void forward_tile(const float* x, const size_t* offset, size_t row, int k, int kc, const float* wt, int oc,
                  float* y) {
  const float* px[R];  // loaded once: the compiler keeps them in general registers
  LBBSP_UNROLL
  for (int r = 0; r < R; ++r) px[r] = x + offset[r];
  Vec acc[R][NV];
  LBBSP_UNROLL
  for (int r = 0; r < R; ++r) LBBSP_UNROLL
  for (int v = 0; v < NV; ++v) acc[r][v] = simd::zero();
  for (int ky = 0; ky < k; ++ky) {
    const size_t xr = ky * row;
    const float* wr = wt + size_t(ky) * kc * oc;
    for (int j = 0; j < kc; ++j, wr += oc) {
      Vec w[NV];
      LBBSP_UNROLL
      for (int v = 0; v < NV; ++v) w[v] = simd::load(wr + v * kL);
      LBBSP_UNROLL
      for (int r = 0; r < R; ++r) {
        const Vec b = simd::broadcast(px[r] + xr + j);
        LBBSP_UNROLL
        for (int v = 0; v < NV; ++v) acc[r][v] = simd::fmadd(b, w[v], acc[r][v]);
      }
    }
  }
  LBBSP_UNROLL
  for (int r = 0; r < R; ++r) LBBSP_UNROLL
  for (int v = 0; v < NV; ++v) simd::store(y + r * oc + v * kL, acc[r][v]);
}

// forward_tile for R consecutive pixels of one output row and a K x K kernel: the window of pixel r at column
// kx reads input column r + kx, so each input value is broadcast once and multiplied with the K kernel
// columns that meet it (up to K FMAs per broadcast instead of one). x: the row's first window, c channels per
// column.
template <int R, int K, int NV>
void forward_row_tile(const float* x, size_t row, int c, const float* wt, int oc, float* y) {
  Vec acc[R][NV];
  LBBSP_UNROLL
  for (int r = 0; r < R; ++r) LBBSP_UNROLL
  for (int v = 0; v < NV; ++v) acc[r][v] = simd::zero();
  for (int ky = 0; ky < K; ++ky) {
    const float* xr = x + ky * row;
    const float* wr = wt + size_t(ky) * K * c * oc;
    for (int ci = 0; ci < c; ++ci) {
      Vec w[K][NV];  // kernel column kx of input channel ci
      LBBSP_UNROLL
      for (int kx = 0; kx < K; ++kx) LBBSP_UNROLL
      for (int v = 0; v < NV; ++v) w[kx][v] = simd::load(wr + (size_t(kx) * c + ci) * oc + v * kL);
      LBBSP_UNROLL
      for (int q = 0; q < R + K - 1; ++q) {
        const Vec b = simd::broadcast(xr + q * c + ci);
        LBBSP_UNROLL
        for (int kx = 0; kx < K; ++kx) {
          if (q - kx < 0 || q - kx >= R) continue;
          LBBSP_UNROLL
          for (int v = 0; v < NV; ++v) acc[q - kx][v] = simd::fmadd(b, w[kx][v], acc[q - kx][v]);
        }
      }
    }
  }
  LBBSP_UNROLL
  for (int r = 0; r < R; ++r) LBBSP_UNROLL
  for (int v = 0; v < NV; ++v) simd::store(y + r * oc + v * kL, acc[r][v]);
}

// acc[r, v] += sum over the pixels of `samples` samples of x[pixel + r] * dy[pixel, v]: R neighbouring taps
// (kx, ci) of one kernel row, NV vectors of output channels. acc lives in memory between calls.
template <int R, int NV>
void weight_grad_tile(const float* x, size_t row, size_t image, int c, const float* dy, int samples, int h,
                      int w, int oc, float* acc_mem) {
  Vec acc[R][NV];
  LBBSP_UNROLL
  for (int r = 0; r < R; ++r) LBBSP_UNROLL
  for (int v = 0; v < NV; ++v) acc[r][v] = simd::load(acc_mem + r * oc + v * kL);
  for (int n = 0; n < samples; ++n)
    for (int oy = 0; oy < h; ++oy) {
      const float* xr = x + n * image + oy * row;
      const float* g = dy + (size_t(n) * h + oy) * w * oc;
      for (int ox = 0; ox < w; ++ox, xr += c, g += oc) {
        Vec gv[NV];
        LBBSP_UNROLL
        for (int v = 0; v < NV; ++v) gv[v] = simd::load(g + v * kL);
        LBBSP_UNROLL
        for (int r = 0; r < R; ++r) {
          const Vec b = simd::broadcast(xr + r);
          LBBSP_UNROLL
          for (int v = 0; v < NV; ++v) acc[r][v] = simd::fmadd(b, gv[v], acc[r][v]);
        }
      }
    }
  LBBSP_UNROLL
  for (int r = 0; r < R; ++r) LBBSP_UNROLL
  for (int v = 0; v < NV; ++v) simd::store(acc_mem + r * oc + v * kL, acc[r][v]);
}

// Tables of the tile kernels by R (index R - 1), so a runtime tile width picks a fully unrolled kernel.
// Tile widths by vectors per tile; at most 14 so the tile's broadcast offsets fit the general registers.
constexpr int kMaxTile1 = simd::kAccumulators < 14 ? simd::kAccumulators : 14,
              kMaxTile2 = simd::kAccumulators / 2;
int max_tile(int vectors) {
  return vectors == 2 ? kMaxTile2 : kMaxTile1;
}
using ForwardFn = void (*)(const float*, const size_t*, size_t, int, int, const float*, int, float*);
using WeightGradFn = void (*)(const float*, size_t, size_t, int, const float*, int, int, int, int, float*);
template <int NV, size_t... I>
constexpr std::array<ForwardFn, sizeof...(I)> forward_table(std::index_sequence<I...>) {
  return {&forward_tile<int(I) + 1, NV>...};
}
template <int NV, size_t... I>
constexpr std::array<WeightGradFn, sizeof...(I)> weight_grad_table(std::index_sequence<I...>) {
  return {&weight_grad_tile<int(I) + 1, NV>...};
}
// Row tiles: R accumulators, K weight vectors and the broadcast per vector of channels, in the registers.
constexpr int max_row_tile(int k, int vectors) {
  const int fit = (simd::kRegisters - 1 - k * vectors) / vectors;
  return fit < 14 ? fit : 14;
}
using RowFn = void (*)(const float*, size_t, int, const float*, int, float*);
template <int K, int NV, size_t... I>
constexpr std::array<RowFn, sizeof...(I)> row_table(std::index_sequence<I...>) {
  return {&forward_row_tile<int(I) + 1, K, NV>...};
}
constexpr auto kForward1 = forward_table<1>(std::make_index_sequence<kMaxTile1>());
constexpr auto kForward2 = forward_table<2>(std::make_index_sequence<kMaxTile2>());
constexpr auto kWeightGrad1 = weight_grad_table<1>(std::make_index_sequence<kMaxTile1>());
constexpr auto kWeightGrad2 = weight_grad_table<2>(std::make_index_sequence<kMaxTile2>());

// forward_padded in row tiles (K = 3 or 5; NV vectors of output channels): each output row in tiles of at
// most max_row_tile pixels, each tile's input values broadcast once for the K columns that meet them.
template <int K, int NV>
void forward_rows(const ConvShape& s, const Padded& xp, const float* wt, float* y) {
  static constexpr int kMax = max_row_tile(K, NV);
  static constexpr auto kTiles = row_table<K, NV>(std::make_index_sequence<kMax>());
  const int oc = s.out_channels, block = NV * kL, oblocks = oc / block, c = s.in_channels, w = s.width;
  const int row_tiles = pieces(w, kMax);
  const int64_t items = int64_t(s.n) * s.height * row_tiles * oblocks;
  const double fma = double(s.n) * s.output_size() * K * K * c;
#pragma omp parallel for schedule(dynamic, 4) if (fma > kParallelMinFma)
  for (int64_t item = 0; item < items; ++item) {
    const int ob = int(item % oblocks), t = int(item / oblocks % row_tiles);
    const int64_t out_row = item / oblocks / row_tiles;  // n * height + oy
    const int n = int(out_row / s.height), oy = int(out_row % s.height);
    const int x0 = piece_begin(w, row_tiles, t), x1 = piece_begin(w, row_tiles, t + 1);
    const float* in = xp.data + size_t(n) * xp.image + size_t(oy) * xp.row + size_t(x0) * c;
    kTiles[x1 - x0 - 1](in, xp.row, c, wt + ob * block, oc, y + (size_t(out_row) * w + x0) * oc + ob * block);
  }
}

// The row tiles for one vector of output channels and K = 3 or 5 (with two, K x 2 weight vectors leave too
// few accumulators); false where they do not apply.
bool forward_by_rows(const ConvShape& s, const Padded& xp, const float* wt, float* y) {
  if (tile_vectors(s.out_channels) != 1) return false;
  if (s.kernel == 5) return forward_rows<5, 1>(s, xp, wt, y), true;
  if (s.kernel == 3) return forward_rows<3, 1>(s, xp, wt, y), true;
  return false;
}

// y[n, oy, ox, :] = sum over taps of the padded input times wt ([k * k * c, oc], output channels last). Tiles
// run over each sample's pixels in (oy, ox) order, so a 14-pixel row does not leave a narrow tile at its end.
void forward_padded(const ConvShape& s, const Padded& xp, const float* wt, float* y) {
  if (forward_by_rows(s, xp, wt, y)) return;
  const int oc = s.out_channels, nv = tile_vectors(oc), block = nv * kL, oblocks = oc / block;
  const int pixels = s.height * s.width, tiles = pieces(pixels, max_tile(nv)), c = s.in_channels;
  const int k = s.kernel, kc = k * c;
  const int64_t items = int64_t(s.n) * tiles * oblocks;
  const double fma = double(s.n) * s.output_size() * k * kc;
  // Dynamic: on a shared machine a thread the OS has paused holds up a few tiles, not its static share.
#pragma omp parallel for schedule(dynamic, 4) if (fma > kParallelMinFma)
  for (int64_t item = 0; item < items; ++item) {
    const int ob = int(item % oblocks), t = int(item / oblocks % tiles), n = int(item / oblocks / tiles);
    const int p0 = piece_begin(pixels, tiles, t), p1 = piece_begin(pixels, tiles, t + 1);
    size_t offset[kMaxTile1 > kMaxTile2 ? kMaxTile1 : kMaxTile2];
    for (int p = p0; p < p1; ++p) offset[p - p0] = size_t(p / s.width) * xp.row + size_t(p % s.width) * c;
    float* out = y + (size_t(n) * pixels + p0) * oc + ob * block;
    const ForwardFn fn = nv == 2 ? kForward2[p1 - p0 - 1] : kForward1[p1 - p0 - 1];
    fn(xp.data + size_t(n) * xp.image, offset, xp.row, k, kc, wt + ob * block, oc, out);
  }
}

// acc[(ky * k + kx) * c + ci, o] += sum over pixels of x(tap of pixel) * dy[pixel, o]. Blocks of samples in
// order, each block's tiles shared out dynamically (as in forward_padded); the barrier after each block keeps
// every tile's sum in sample order whichever thread runs it, so the result does not depend on the threads.
void weight_grad_padded(const ConvShape& s, const Padded& xp, const float* dy, float* acc) {
  constexpr int kSampleBlock = 8;  // x and dy of 8 samples of the CNN's second layer: 0.3 MiB, in L2
  const int oc = s.out_channels, nv = tile_vectors(oc), block = nv * kL, oblocks = oc / block;
  const int k = s.kernel, c = s.in_channels, kc = k * c;
  const int j_tiles = pieces(kc, max_tile(nv)), tiles = k * j_tiles * oblocks;
  const double fma = double(s.n) * s.output_size() * k * kc;
#pragma omp parallel if (fma > kParallelMinFma)
  for (int n0 = 0; n0 < s.n; n0 += kSampleBlock) {
    const int samples = std::min(kSampleBlock, s.n - n0);
    const float* x = xp.data + size_t(n0) * xp.image;
    const float* g = dy + size_t(n0) * s.output_size();
#pragma omp for schedule(dynamic)
    for (int tile = 0; tile < tiles; ++tile) {
      const int ob = tile % oblocks, jt = tile / oblocks % j_tiles, ky = tile / oblocks / j_tiles;
      const int j0 = piece_begin(kc, j_tiles, jt), j1 = piece_begin(kc, j_tiles, jt + 1);
      const WeightGradFn fn = nv == 2 ? kWeightGrad2[j1 - j0 - 1] : kWeightGrad1[j1 - j0 - 1];
      fn(x + ky * xp.row + j0, xp.row, xp.image, c, g + ob * block, samples, s.height, s.width, oc,
         acc + (size_t(ky) * kc + j0) * oc + ob * block);
    }
  }
}

// The kernels read x through a channels-last padded copy: [c = 1, h, w] qualifies, [c > 1, h, w] does not.
bool simd_shape(const ConvShape& s) {
  return fits_vectors(s.out_channels) && (!s.input_chw || s.in_channels == 1) && s.kernel % 2 == 1;
}

}  // namespace

bool conv_simd_forward(const ConvShape& s, const float* x, const float* w, float* y, ConvWorkspace& ws) {
  if (!simd_shape(s)) return false;
  if (s.n == 0) return true;
  const int oc = s.out_channels, cw = s.col_width();
  ws.wt.resize(std::max(ws.wt.size(), size_t(cw) * oc));
  for (int o = 0; o < oc; ++o)
    for (int t = 0; t < cw; ++t) ws.wt[size_t(t) * oc + o] = w[size_t(o) * cw + t];
  forward_padded(s, pad_input(s, x, ws.padded), ws.wt.data(), y);
  return true;
}

bool conv_simd_backward(const ConvShape& s, const float* x, const float* w, const float* dy, float* dw,
                        float* dx, ConvWorkspace& ws) {
  // dx is the forward convolution of dy (channels last, out_channels deep) with the kernel flipped in space
  // and transposed in channels: it needs in_channels to fill vectors and a channels-last dx.
  const bool dx_fits = !dx || (fits_vectors(s.in_channels) && !s.input_chw);
  if (!simd_shape(s) || !dx_fits) return false;
  if (s.n == 0) return true;
  const int k = s.kernel, c = s.in_channels, oc = s.out_channels, cw = s.col_width();
  ws.wt.assign(size_t(cw) * oc, 0.0f);
  weight_grad_padded(s, pad_input(s, x, ws.padded), dy, ws.wt.data());
  for (int o = 0; o < oc; ++o)
    for (int t = 0; t < cw; ++t) dw[size_t(o) * cw + t] += ws.wt[size_t(t) * oc + o];
  if (!dx) return true;
  ConvShape t = s;
  t.in_channels = oc;
  t.out_channels = c;
  t.input_chw = false;
  ws.wflip.resize(size_t(t.col_width()) * c);
  for (int ky = 0; ky < k; ++ky)
    for (int kx = 0; kx < k; ++kx)
      for (int o = 0; o < oc; ++o)
        for (int ci = 0; ci < c; ++ci)
          ws.wflip[((size_t(ky) * k + kx) * oc + o) * c + ci] =
              w[((size_t(o) * k + (k - 1 - ky)) * k + (k - 1 - kx)) * c + ci];
  forward_padded(t, pad_input(t, dy, ws.padded), ws.wflip.data(), dx);
  return true;
}

#endif  // LBBSP_SIMD_LANES

}  // namespace emulated512 or native
}  // namespace lbbsp::models
