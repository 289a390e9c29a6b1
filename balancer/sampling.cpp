#include "balancer/sampling.hpp"

#include <numeric>
#include <stdexcept>
#include <string>

namespace lbbsp::balancer {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  if (n < 0) throw std::invalid_argument("epoch_permutation: n must be >= 0, got " + std::to_string(n));
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  // splitmix64 stream: portable, no dependence on std::uniform_int_distribution's implementation.
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch) * 0xBF58476D1CE4E5B9ULL + 1;
  auto next = [&] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(next() % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

int64_t slice_offset(std::span<const int64_t> batch, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) > batch.size())
    throw std::invalid_argument("slice_offset: rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(batch.size()) + "]");
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += batch[r];
  return offset;
}

std::vector<int64_t> rank_indices(std::span<const int64_t> permutation, int64_t step,
                                  std::span<const int64_t> batch, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= batch.size())
    throw std::invalid_argument("rank_indices: rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(batch.size()) + ")");
  int64_t global = 0;
  for (int64_t b : batch) {
    if (b < 0)
      throw std::invalid_argument("rank_indices: batch sizes must be >= 0, got " + std::to_string(b));
    global += b;
  }
  const auto n = static_cast<int64_t>(permutation.size());
  if (step < 0 || (global > 0 && step > (n - global) / global) || (global == 0 && step > n))
    throw std::invalid_argument(
        "rank_indices: step " + std::to_string(step) + " of global batch " + std::to_string(global) +
        " runs past the " + std::to_string(n) +
        "-sample permutation (steps per epoch: " + std::to_string(steps_per_epoch(n, global)) + ")");
  const int64_t begin = step * global + slice_offset(batch, rank);
  return {permutation.begin() + begin, permutation.begin() + begin + batch[rank]};
}

int64_t steps_per_epoch(int64_t n, int64_t global_batch) {
  if (global_batch < 1)
    throw std::invalid_argument("steps_per_epoch: global batch must be >= 1, got " +
                                std::to_string(global_batch));
  return n / global_batch;
}

}  // namespace lbbsp::balancer
