// Straggler emulation (--straggle SPEC): recreates a non-dedicated cluster on a small, quiet machine.
// The grammar is in runtime/straggle/spec.hpp; each kind lives in runtime/straggle/ behind the Emulation
// interface (straggle/emulation.hpp). Straggler is the one object the trainer holds: it picks the kind, adds
// the GPU cost model (gpu=), the replay clock (tick=) and the noise on replayed metrics (noise=).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "balancer/balancer.hpp"
#include "runtime/monitor.hpp"
#include "runtime/straggle/emulation.hpp"
#include "runtime/straggle/gpu_cost.hpp"
#include "runtime/straggle/spec.hpp"
#include "runtime/straggle/trace_replay.hpp"

namespace lbbsp::runtime {

using straggle::CapacitySeries;

class Straggler {
 public:
  // Throws std::invalid_argument naming the spec part (and trace file/line) that is wrong.
  Straggler(const std::string& spec, int ranks, uint64_t seed);
  ~Straggler();
  Straggler(const Straggler&) = delete;
  Straggler& operator=(const Straggler&) = delete;

  const std::string& spec() const { return config_.text; }
  bool active() const { return config_.kind != straggle::Kind::kNone; }
  bool replay() const { return emulation_->replay(); }
  bool gpu_profile() const { return gpu_.enabled(); }

  // The time the replay functions below take as elapsed_s, for iteration `iteration` starting at wall_s
  // seconds of training: wall_s, or iteration * S with tick=S.
  double replay_clock(double wall_s, int64_t iteration) const {
    return config_.tick_s > 0 ? static_cast<double>(iteration) * config_.tick_s : wall_s;
  }
  // Emulated capacity factor of `rank` at `elapsed_s` seconds of training (1 for real interference).
  double capacity(int rank, double elapsed_s) const { return emulation_->capacity(rank, elapsed_s); }
  // Most samples `rank` may hold (GPU profile), else no limit.
  int64_t mem_cap(int rank) const { return gpu_.mem_cap(rank); }
  // GPU-like cost curve of `rank` at `elapsed_s` (already divided by the capacity); zero curve without a
  // profile.
  balancer::TimeCurve curve(int rank, double elapsed_s) const {
    return gpu_.curve(rank, emulation_->replay_capacity(rank, elapsed_s));
  }
  // The compute time to report for a slice that really took real_s: stretched by the capacity (or raised to
  // the GPU curve). Throws when batch exceeds the GPU memory cap, as an out-of-memory would.
  double emulated_seconds(int rank, double elapsed_s, int64_t batch, double real_s) const;
  // Waits until an emulated compute that started `real_s` ago has lasted `target_s` (sleeps, then yields the
  // CPU through the last millisecond); never returns before.
  static void stretch_to(double real_s, double target_s);
  // Metrics reported to predictors: from the trace in replay mode (with noise), else measured from /proc.
  ResourceMetrics metrics(int rank, double elapsed_s, const ResourceMetrics& measured);

  // Real interference: pins the rank (with pin=) and starts its stress-ng co-tenant (if any) on the CPUs this
  // rank runs on.
  void start_cotenant(int rank) { emulation_->start(rank); }
  void stop_cotenant() { emulation_->stop(); }

  // stress with pin=: the CPU share a rank keeps while the co-tenants on its CPU run, relative to a rank on a
  // CPU without one: k / (k + sum of the co-tenants' loads / 100) for k ranks pinned to that CPU (CFS shares
  // a CPU equally among runnable tasks; a co-tenant at L% is runnable L% of the time). 1 without pin= or
  // co-tenant. An a-priori model, not a measurement.
  double stress_share(int rank) const { return emulation_->stress_share(rank); }
  // stress with period=: whether the co-tenants run at wall-clock time real_s (CLOCK_REALTIME seconds): on in
  // even periods, off in odd ones, the same schedule in every rank's process.
  bool cotenant_on(double real_s) const { return straggle::cotenant_on(config_.period_s, real_s); }
  // Trace: the series (file#machine) rank replays, and the time in that trace's own clock it replays at
  // elapsed_s (the sample shown is the latest one at or before it).
  const std::string& source_of(int rank) const { return emulation_->source_of(rank); }
  double trace_time(int rank, double elapsed_s) const { return emulation_->trace_time(rank, elapsed_s); }

 private:
  double next_uniform();  // the seeded noise stream behind noise=

  straggle::Config config_;
  std::unique_ptr<straggle::Emulation> emulation_;
  straggle::GpuCost gpu_;
  uint64_t noise_state_ = 0;
};

}  // namespace lbbsp::runtime
