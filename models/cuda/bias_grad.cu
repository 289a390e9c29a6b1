// Bias gradient: column sums of a row-major [rows, channels] matrix, added into dbias. Deterministic: pass 1
// gives each (row slice, channel) one partial sum in a fixed order, pass 2 adds the slices in order.
#include <algorithm>

#include "models/cuda/cuda_check.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models::cuda {

namespace {

constexpr int kChannelTile = 32;  // threadIdx.x: neighbouring channels, so a warp reads contiguous floats
constexpr int kRowLanes = 8;      // threadIdx.y: rows interleaved inside a slice
constexpr int kMaxSlices = 128;   // gridDim.y: row slices summed in parallel

__global__ void column_partial_sums(const float* dy, size_t rows, int channels, size_t rows_per_slice,
                                    float* partials) {
  __shared__ float lane_sums[kRowLanes][kChannelTile];
  const int c = blockIdx.x * kChannelTile + threadIdx.x;
  const size_t begin = blockIdx.y * rows_per_slice;
  const size_t end = begin + rows_per_slice < rows ? begin + rows_per_slice : rows;
  float acc = 0.0f;
  if (c < channels)
    for (size_t r = begin + threadIdx.y; r < end; r += kRowLanes) acc += dy[r * channels + c];
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += lane_sums[lane][threadIdx.x];
    partials[size_t(blockIdx.y) * channels + c] = total;
  }
}

__global__ void add_slices(const float* partials, int slices, int channels, float* dbias) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float total = 0.0f;
  for (int s = 0; s < slices; ++s) total += partials[size_t(s) * channels + c];
  dbias[c] += total;
}

}  // namespace

size_t bias_backward_workspace_floats(int channels) {
  return size_t(kMaxSlices) * channels;
}

void bias_backward(const float* dy, float* dbias, size_t rows, int channels, float* workspace,
                   cudaStream_t stream) {
  if (rows == 0 || channels == 0) return;
  // At least 64 rows per slice so tiny batches do not launch idle slices.
  const size_t rows_per_slice = std::max<size_t>(64, (rows + kMaxSlices - 1) / kMaxSlices);
  const int slices = int((rows + rows_per_slice - 1) / rows_per_slice);
  const dim3 grid((channels + kChannelTile - 1) / kChannelTile, slices);
  column_partial_sums<<<grid, dim3(kChannelTile, kRowLanes), 0, stream>>>(dy, rows, channels, rows_per_slice,
                                                                          workspace);
  LBBSP_CUDA_CHECK_LAUNCH();
  add_slices<<<(channels + 127) / 128, 128, 0, stream>>>(workspace, slices, channels, dbias);
  LBBSP_CUDA_CHECK_LAUNCH();
}

}  // namespace lbbsp::models::cuda
