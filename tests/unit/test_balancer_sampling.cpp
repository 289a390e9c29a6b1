// The core's sampling functions: the epoch permutation and each worker's slice of a step's global batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "balancer/sampling.hpp"

using namespace lbbsp::balancer;

TEST(Sampling, PermutationIsAPermutationAndSeeded) {
  auto p = epoch_permutation(1000, 5, 0);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(p, epoch_permutation(1000, 5, 0));
  EXPECT_NE(p, epoch_permutation(1000, 5, 1));
  EXPECT_NE(p, epoch_permutation(1000, 6, 0));
  EXPECT_TRUE(epoch_permutation(0, 1, 0).empty());
  EXPECT_THROW(epoch_permutation(-1, 1, 0), std::invalid_argument);
}

TEST(Sampling, MatchesTheIndependentPythonPort) {
  // Values from the Python port in tests/python/test_package.py (a separate implementation of the same
  // splitmix64 / Fisher-Yates definition): a change here changes every run's sample order.
  EXPECT_EQ(epoch_permutation(10, 1, 0), (std::vector<int64_t>{7, 6, 4, 1, 0, 2, 5, 8, 3, 9}));
  EXPECT_EQ(epoch_permutation(12, 7, 3), (std::vector<int64_t>{6, 7, 9, 1, 2, 10, 4, 0, 8, 11, 3, 5}));
}

TEST(Sampling, AnySplitCoversTheGlobalBatchInOrder) {
  const int64_t n = 500, X = 48;
  const auto perm = epoch_permutation(n, 3, 2);
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int workers = 1 + static_cast<int>(rng() % 6);
    std::vector<int64_t> batch(workers, 0);
    for (int64_t s = 0; s < X; ++s) batch[rng() % workers] += 1;  // zeros are common with 6 workers
    const int64_t step = static_cast<int64_t>(rng() % steps_per_epoch(n, X));
    std::vector<int64_t> joined;
    for (int r = 0; r < workers; ++r) {
      EXPECT_EQ(slice_offset(batch, r), static_cast<int64_t>(joined.size()));
      const auto part = rank_indices(perm, step, batch, r);
      EXPECT_EQ(static_cast<int64_t>(part.size()), batch[r]);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    EXPECT_EQ(joined, std::vector<int64_t>(perm.begin() + step * X, perm.begin() + (step + 1) * X));
  }
}

TEST(Sampling, ErrorsNameTheProblem) {
  const auto perm = epoch_permutation(100, 1, 0);
  const std::vector<int64_t> batch = {30, 0, 20};
  EXPECT_EQ(steps_per_epoch(100, 50), 2);
  EXPECT_NO_THROW(rank_indices(perm, 1, batch, 2));
  EXPECT_THROW(rank_indices(perm, 2, batch, 0), std::invalid_argument);  // step 2 needs 150 samples
  EXPECT_THROW(rank_indices(perm, 0, batch, 3), std::invalid_argument);
  EXPECT_THROW(rank_indices(perm, 0, std::vector<int64_t>{-1, 51}, 0), std::invalid_argument);
  EXPECT_THROW(slice_offset(batch, 4), std::invalid_argument);
  EXPECT_THROW(steps_per_epoch(100, 0), std::invalid_argument);
  try {
    rank_indices(perm, 5, batch, 0);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("step 5"), std::string::npos) << e.what();
  }
}
