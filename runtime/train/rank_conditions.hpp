// RankConditions: this rank's conditions as the training loop sees them, from one place. The compute time a
// step reports and the metrics the balancer receives come from the machine itself (the real compute, /proc)
// or, under --straggle, from the straggler emulation around it (runtime/straggle/straggler.hpp); which one is
// settled here at set-up, so the loop's blocks name no emulation. What only an emulation knows (the oracle's
// truth) is asked for through truth() and is unknown (NaN) on a real cluster.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "balancer/balancer.hpp"

namespace lbbsp::runtime {

class ResourceMonitor;
class Straggler;

class RankConditions {
 public:
  using Clock = std::chrono::steady_clock;
  // What this rank's slot reports after its compute.
  struct Metrics {
    double cpu_avail = 1, mem_avail = 1, load = 0;
    double capacity = 1;  // this iteration's capacity factor: 1 on a real cluster
  };

  // Throws std::invalid_argument naming the part of the --straggle spec that is wrong.
  RankConditions(const std::string& straggle, int ranks, int rank, uint64_t seed);
  ~RankConditions();
  RankConditions(const RankConditions&) = delete;
  RankConditions& operator=(const RankConditions&) = delete;

  // Most samples this rank may hold (an emulated GPU's memory), else no limit.
  int64_t mem_cap() const;
  // Starts what runs beside the training (the rank's pin and co-tenant), then the /proc monitor on the CPUs
  // it leaves this rank; stop() ends the co-tenant.
  void start();
  void stop();

  // Iteration `iteration` begins, train_s seconds into the training.
  void begin_iteration(int64_t iteration, double train_s);
  // The compute seconds to report for this iteration's n samples, whose real compute began at t_compute and
  // took real_s (released: when this node's ranks left the last step, if the engine knows): the real time, or
  // the emulated one, which this call waits out.
  double compute_seconds(int64_t n, Clock::time_point t_compute, std::optional<Clock::time_point> released,
                         double real_s);
  // After the compute of iteration `iteration`, train_s seconds into the training.
  Metrics metrics(int64_t iteration, double train_s);
  // Emulation only: rank r's truth for iteration `iteration` starting train_s seconds into the training (the
  // measured capacity is left for the caller: it rides in the rank's slot).
  balancer::EmulationTruth truth(int r, int64_t iteration, double train_s) const;

 private:
  std::unique_ptr<Straggler> straggler_;
  std::unique_ptr<ResourceMonitor> monitor_;
  int rank_;
  double replay_now_ = 0;  // the emulation's clock for the current iteration
};

}  // namespace lbbsp::runtime
