#include "runtime/train/rank_conditions.hpp"

#include "runtime/monitor.hpp"
#include "runtime/straggle/straggler.hpp"

namespace lbbsp::runtime {

namespace {
double seconds_since(RankConditions::Clock::time_point t) {
  return std::chrono::duration<double>(RankConditions::Clock::now() - t).count();
}
}  // namespace

RankConditions::RankConditions(const std::string& straggle, int ranks, int rank, uint64_t seed)
    : straggler_(std::make_unique<Straggler>(straggle, ranks, seed)), rank_(rank) {}

RankConditions::~RankConditions() = default;

int64_t RankConditions::mem_cap() const {
  return straggler_->mem_cap(rank_);
}

void RankConditions::start() {
  straggler_->start_cotenant(rank_);
  monitor_ = std::make_unique<ResourceMonitor>();  // after the pin: it measures the CPUs this rank runs on
}

void RankConditions::stop() {
  straggler_->stop_cotenant();
}

void RankConditions::begin_iteration(int64_t iteration, double train_s) {
  replay_now_ = straggler_->replay_clock(train_s, iteration);
}

double RankConditions::compute_seconds(int64_t n, Clock::time_point t_compute,
                                       std::optional<Clock::time_point> released, double real_s) {
  const double target_s = straggler_->emulated_seconds(rank_, replay_now_, n, real_s);
  // A modelled cost curve stands for a dedicated machine, which starts when the step does: when this node's
  // ranks left the last one, not when an OS with more ranks than cores got round to this rank.
  const auto t_start = straggler_->gpu_profile() ? released.value_or(t_compute) : t_compute;
  Straggler::stretch_to(seconds_since(t_start), target_s);
  return seconds_since(t_start);
}

RankConditions::Metrics RankConditions::metrics(int64_t iteration, double train_s) {
  // From the trace under replay (with noise), else as measured: the Straggler chooses by its spec.
  const ResourceMetrics m =
      straggler_->metrics(rank_, straggler_->replay_clock(train_s, iteration + 1), monitor_->sample());
  return {m.cpu_avail, m.mem_avail, m.load, straggler_->capacity(rank_, replay_now_)};
}

balancer::EmulationTruth RankConditions::truth(int r, int64_t iteration, double train_s) const {
  const double start = straggler_->replay_clock(train_s, iteration);
  balancer::EmulationTruth t;
  t.capacity_next = straggler_->capacity(r, start);
  t.curve_next = straggler_->curve(r, start);
  return t;
}

}  // namespace lbbsp::runtime
