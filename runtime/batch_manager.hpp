// BatchSizeManager: lives on rank 0, turns every rank's report into the next batch vector through a Balancer.
// With lag 1 the decision for iteration t+2 runs on a helper thread while rank 0 computes iteration t+1.
#pragma once
#include <future>
#include <memory>
#include <vector>

#include "balancer/balancer.hpp"

namespace lbbsp::runtime {

class BatchSizeManager {
 public:
  BatchSizeManager(const balancer::BalancerConfig& cfg, int lag);
  ~BatchSizeManager();

  std::vector<int64_t> initial();
  // lag 0: decides now and returns the batch vector for the next iteration.
  std::vector<int64_t> decide(const balancer::IterationReport& report);
  // lag 1: starts deciding in the background; collect() returns the result (blocking if not ready yet).
  void decide_async(balancer::IterationReport report);
  bool pending() const { return pending_.valid() || !ready_.empty(); }
  std::vector<int64_t> collect();
  // Checkpoints: waits for the decision in flight (so the balancer state is settled) and returns it;
  // collect() then returns it again. restore_pending() puts a checkpoint's pending decision back.
  std::vector<int64_t> settle();
  void restore_pending(const std::vector<int64_t>& b);
  // Speeds the balancer predicted in its last decision (per worker; empty when it has none).
  std::vector<double> predicted_speeds() const { return predicted_; }
  balancer::Balancer& balancer() { return *balancer_; }
  // Validates a batch vector (sum, bounds); throws naming the balancer if it broke its contract.
  void check(const std::vector<int64_t>& b) const;

 private:
  balancer::BalancerConfig cfg_;
  int lag_;
  std::unique_ptr<balancer::Balancer> balancer_;
  std::future<std::vector<int64_t>> pending_;
  std::vector<double> predicted_;
  std::vector<double> pending_predicted_;
  std::vector<int64_t> ready_;  // a settled decision not collected yet
};

}  // namespace lbbsp::runtime
