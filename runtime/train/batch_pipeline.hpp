// BatchPipeline: how the batch vectors rank 0's BatchSizeManager decides reach every rank, and the one place
// the loop's blocks meet the lag. With lag 0 the next iteration's vector is decided after the allreduce and
// broadcast; with lag L >= 1 it was decided L iterations ago and rides in this iteration's allreduce (the
// buffer's batch slots), so no rank waits for a message.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace lbbsp::balancer {
struct IterationReport;
}

namespace lbbsp::runtime {

class BatchSizeManager;
class Comm;
class ReductionBuffer;

class BatchPipeline {
 public:
  // manager: rank 0's; null on the other ranks.
  BatchPipeline(int lag, BatchSizeManager* manager) : lag_(lag), manager_(manager) {}

  // Before the allreduce: rank 0 puts the next iteration's vector into the buffer when it is already decided
  // (waiting for the helper thread if it is still deciding).
  void before_allreduce(ReductionBuffer& buf);
  // After it: rank 0 decides from report() (for the next iteration with lag 0, for the one L after it
  // otherwise); returns the next iteration's vector, the same on every rank.
  std::vector<int64_t> after_allreduce(const ReductionBuffer& buf, Comm& comm,
                                       const std::function<balancer::IterationReport()>& report);
  // A decision made after iteration t is for iteration t + 1 + lag.
  int64_t decided_for(int64_t iteration) const { return iteration + 1 + lag_; }
  int lag() const { return lag_; }

 private:
  int lag_;
  BatchSizeManager* manager_;
};

}  // namespace lbbsp::runtime
