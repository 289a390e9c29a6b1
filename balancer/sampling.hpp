// The global batch and each worker's slice of it: one seeded permutation per epoch, the global batch of step
// k is positions [k X, (k+1) X) of it, and worker r takes positions [k X + b_0 + ... + b_{r-1}, + b_r). Any
// batch vector therefore covers the same samples in the same order, which is why balancing never changes the
// SGD trajectory. Pure C++ (no MPI, no I/O): `lbbsp train`, the Python package and downstream trainers share
// it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace lbbsp::balancer {

// Fisher-Yates from the end over a splitmix64 stream of (seed, epoch), with our own index draw, so the
// permutation is the same on every platform and library. Throws std::invalid_argument when n < 0.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// b_0 + ... + b_{rank-1}: where the worker's slice starts inside the global batch. Throws
// std::invalid_argument for a rank outside [0, batch.size()].
int64_t slice_offset(std::span<const int64_t> batch, int rank);

// The worker's sample indices for step `step` of an epoch: positions [step X + slice_offset, + batch[rank])
// of the permutation, X = the sum of the batch vector. Throws std::invalid_argument when the step's global
// batch runs past the end of the permutation, a batch size is negative or the rank is out of range.
std::vector<int64_t> rank_indices(std::span<const int64_t> permutation, int64_t step,
                                  std::span<const int64_t> batch, int rank);

// Steps per epoch: whole global batches in n samples (the remainder of an epoch is dropped).
int64_t steps_per_epoch(int64_t n, int64_t global_batch);

}  // namespace lbbsp::balancer
