// The telemetry hook: rank 0's per-rank rows (HDF5/CSV) and timeline slices of every iteration, from the
// slots every rank's measurements reached it in (runtime/io/telemetry.hpp writes them).
#include <algorithm>
#include <chrono>

#include "runtime/io/telemetry.hpp"
#include "runtime/train/hooks.hpp"

namespace lbbsp::runtime {

namespace {

class TelemetryHook : public TrainHook {
 public:
  const char* name() const override { return "telemetry"; }
  TelemetryHook(RunLog& log, int ranks) : log_(log), ranks_(ranks) {}

  void on_train_begin(const TrainContext& c) override {
    log_.set_origin(c.t0);
    // The training clock's zero in Unix time: iterations carry when they began on the system clock.
    const auto since_t0 = std::chrono::steady_clock::now() - c.t0;
    origin_unix_s_ =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
        std::chrono::duration<double>(since_t0).count();
  }

  void on_iteration_end(const IterationContext& c) override {
    // The allreduce as rank 0 saw it, less the time it waited there for the slowest rank.
    const double ar_only = std::max(0.0, c.allreduce_s - (c.max_compute - c.compute_s));
    std::vector<IterationRecord> records(ranks_);
    for (int r = 0; r < ranks_; ++r) {
      const float* s = c.buffer->slot(r);
      IterationRecord& rec = records[r];
      rec.iteration = c.iteration;
      rec.rank = r;
      rec.batch = c.batch[r];
      rec.compute_s = s[kCompute];
      rec.wait_s = c.max_compute - s[kCompute];
      rec.allreduce_s = ar_only;
      rec.balancer_s = c.coord_s;
      rec.predicted_speed = c.predicted[r];
      rec.actual_speed = s[kCompute] > 0 ? c.batch[r] / s[kCompute] : 0.0;
      rec.cpu_avail = s[kCpu];
      rec.mem_avail = s[kMem];
      rec.load = s[kLoad];
      rec.capacity = s[kCapacity];
      rec.time_s = origin_unix_s_ + c.start_s;
    }
    log_.add_iteration(c.start_s, records);
  }

  void on_train_end(const TrainEndContext&) override { log_.finish(); }

 private:
  RunLog& log_;
  int ranks_;
  double origin_unix_s_ = 0;
};

}  // namespace

std::unique_ptr<TrainHook> make_telemetry_hook(RunLog& log, int ranks) {
  return std::make_unique<TelemetryHook>(log, ranks);
}

}  // namespace lbbsp::runtime
