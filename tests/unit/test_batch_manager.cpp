// BatchSizeManager owns the lag: with lag L the batch vector of iteration t+1+L is the decision made after
// iteration t, the first L iterations after the start repeat the initial split, and a checkpoint's queue of
// decisions made ahead restores the same sequence.
#include "runtime/train/batch_manager.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace lbbsp::runtime {
namespace {

balancer::BalancerConfig random_config() {
  balancer::BalancerConfig c;
  c.name = "random:7";  // a seeded sequence of splits that ignores the reports: the order is all that differs
  c.workers = 3;
  c.global_batch = 60;
  return c;
}

balancer::IterationReport report_of(int64_t it, const std::vector<int64_t>& batch) {
  balancer::IterationReport r;
  r.iteration = it;
  r.workers.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) r.workers[i].batch = batch[i], r.workers[i].compute_s = 0.01;
  return r;
}

// The batch vectors of iterations 0 .. n-1, the loop's order of calls: next() for t+1 before deciding after t
// with lag >= 1, after it with lag 0.
std::vector<std::vector<int64_t>> run(BatchSizeManager& m, std::vector<int64_t> first, int64_t from,
                                      int64_t n) {
  std::vector<std::vector<int64_t>> seq{first};
  for (int64_t t = from; t + 1 < from + n; ++t) {
    std::vector<int64_t> next;
    if (m.lag() > 0) next = m.next();
    m.decide(report_of(t, seq.back()));
    if (m.lag() == 0) next = m.next();
    seq.push_back(next);
  }
  return seq;
}

TEST(BatchSizeManager, LagLRunsTheLagZeroSequenceLIterationsLater) {
  BatchSizeManager m0(random_config(), 0);
  const auto seq0 = run(m0, m0.initial(), 0, 12);
  for (int lag : {1, 2, 5}) {
    BatchSizeManager m(random_config(), lag);
    const auto seq = run(m, m.initial(), 0, 12);
    for (int64_t t = 0; t < 12; ++t) {
      const auto& want = t <= lag ? seq0[0] : seq0[t - lag];
      EXPECT_EQ(seq[t], want) << "lag " << lag << " iteration " << t;
    }
  }
  EXPECT_NE(seq0[1], seq0[2]);  // the sequence really changes, so a shift is visible
}

TEST(BatchSizeManager, SettledQueueAndStateContinueTheSameSequence) {
  for (int lag : {0, 1, 3}) {
    BatchSizeManager whole(random_config(), lag);
    const auto want = run(whole, whole.initial(), 0, 14);

    BatchSizeManager first(random_config(), lag);
    const auto head = run(first, first.initial(), 0, 6);  // iterations 0..5; the vector of 5 is `batch`
    const auto pending = first.settle();
    ASSERT_EQ(pending.size(), static_cast<size_t>(lag) * 3);
    const auto state = first.balancer().save_state();

    BatchSizeManager resumed(random_config(), lag);
    resumed.initial();
    resumed.balancer().load_state(state);
    resumed.restore_pending(pending);
    auto tail = run(resumed, head.back(), 5, 9);  // iterations 5..13
    for (int64_t t = 5; t < 14; ++t) EXPECT_EQ(tail[t - 5], want[t]) << "lag " << lag << " iteration " << t;
  }
}

TEST(BatchSizeManager, RejectsAQueueOfAnotherLagOrAnInvalidSplit) {
  BatchSizeManager m(random_config(), 2);
  m.initial();
  EXPECT_THROW(m.restore_pending({20, 20, 20}), std::invalid_argument);         // one vector for lag 2
  EXPECT_THROW(m.restore_pending({20, 20, 20, 20, 20, 21}), std::logic_error);  // sums to 61
  EXPECT_THROW(BatchSizeManager(random_config(), -1), std::invalid_argument);
}

}  // namespace
}  // namespace lbbsp::runtime
