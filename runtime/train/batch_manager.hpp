// BatchSizeManager: lives on rank 0, turns every rank's report into the batch vectors of the coming
// iterations through a Balancer, and owns the lag. With lag 0 it decides iteration t+1's vector after
// iteration t; with lag L >= 1 it decides t+1+L's on a helper thread while t+1 runs, and queues the L
// decisions made ahead.
#pragma once
#include <deque>
#include <future>
#include <memory>
#include <vector>

#include "balancer/balancer.hpp"

namespace lbbsp::runtime {

class BatchSizeManager {
 public:
  BatchSizeManager(const balancer::BalancerConfig& cfg, int lag);
  ~BatchSizeManager();

  int lag() const { return lag_; }
  // The first iteration's batch vector; the L iterations after it run on it too (nothing is decided yet).
  std::vector<int64_t> initial();
  // After iteration t: starts deciding iteration t+1+lag's vector (on the helper thread with lag >= 1).
  void decide(balancer::IterationReport report);
  // Iteration t+1's vector (waits for the decision that makes it, if that is still running).
  std::vector<int64_t> next();
  // Checkpoints: waits for the decision in flight (so the balancer state is settled) and returns the L
  // vectors decided ahead, oldest first, flattened (empty with lag 0); restore_pending() puts a checkpoint's
  // back.
  std::vector<int64_t> settle();
  void restore_pending(const std::vector<int64_t>& flat);
  // Speeds the balancer predicted for the iteration next() last returned (per worker; empty when it has
  // none).
  std::vector<double> predicted_speeds() const { return predicted_; }
  balancer::Balancer& balancer() { return *balancer_; }
  // Validates a batch vector (sum, bounds); throws naming the balancer if it broke its contract.
  void check(const std::vector<int64_t>& b) const;

 private:
  struct Decision {
    std::vector<int64_t> batch;
    std::vector<double> predicted;
  };
  Decision decide_now(const balancer::IterationReport& report);
  void settle_in_flight();

  balancer::BalancerConfig cfg_;
  int lag_;
  std::unique_ptr<balancer::Balancer> balancer_;
  std::future<Decision> in_flight_;  // the newest decision, while the helper thread makes it
  std::deque<Decision> queued_;      // the decisions made, oldest first
  std::vector<double> predicted_;
};

}  // namespace lbbsp::runtime
