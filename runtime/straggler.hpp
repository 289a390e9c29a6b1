// Straggler emulation (--straggle SPEC): recreates a non-dedicated cluster on a small, quiet machine.
//
//   SPEC    := KIND [";" OPTION]...
//   KIND    := none | static:F0,F1,...        capacity factor per rank (cycled when fewer than ranks)
//            | trace:PATH[,PATH...]          capacity time series (files or folders, see runtime/traces.hpp)
//            | stress:RANK=LOAD[,...]        a real stress-ng co-tenant next to RANK at LOAD percent
//   OPTION  := scale=S          seconds of training per trace step (default 1)
//            | rate=K           instead of scale: replay by the trace's own timestamps, K trace seconds per
//                               second of training (the value of the latest sample is held until the next)
//            | align=time       trace with rate: every rank starts at one seeded trace time (co-located
//                               machines of one cluster at the same moment) instead of its own random step
//            | offset=O[,O...]  trace step each rank starts at (default: seeded random)
//            | noise=SD         Gaussian noise on the CPU availability reported in replay (default 0)
//            | period=S         stress: co-tenant on for S seconds, off for S seconds (default: always on)
//            | gpu=FLOOR:SAT:SLOPE:CAP[,...]  GPU-like cost per rank: time(b) = FLOOR + SLOPE*(b-SAT)+
//            seconds
//                               divided by the capacity, and at most CAP samples (more is an out-of-memory
//                               error)
//            | tick=S           static/trace: the replay clock advances S seconds per iteration instead of
//            with
//                               the wall clock, so every balancer meets the same capacity sequence
//            | seed=N           seed for trace assignment, offsets and noise (default: the training seed)
//            | pin=C0,C1,...    stress: pin rank r to CPU C(r mod n) (its co-tenant runs there too), so that
//                               only the ranks sharing a co-tenant's CPU slow down; capacity() then models
//                               their share of that CPU (see stress_share) so that the oracle has a truth
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "balancer/balancer.hpp"
#include "runtime/monitor.hpp"

namespace lbbsp::runtime {

struct CapacitySeries {
  std::string source;
  std::vector<double> capacity;   // one value per trace step, in [0.05, 1]
  std::vector<double> mem_avail;  // per step, empty when the trace has no memory column
  std::vector<double> time_s;     // per step, seconds from origin_s (the trace's own clock)
  double origin_s = 0;
  double span_s() const { return time_s.empty() ? 0.0 : time_s.back(); }
};

class Straggler {
 public:
  // Throws std::invalid_argument naming the spec part (and trace file/line) that is wrong.
  Straggler(const std::string& spec, int ranks, uint64_t seed);
  ~Straggler();
  Straggler(const Straggler&) = delete;
  Straggler& operator=(const Straggler&) = delete;

  const std::string& spec() const { return spec_; }
  bool active() const { return kind_ != Kind::kNone; }
  bool replay() const { return kind_ == Kind::kStatic || kind_ == Kind::kTrace; }
  bool gpu_profile() const { return !curves_.empty(); }

  // The time the replay functions below take as elapsed_s, for iteration `iteration` starting at wall_s
  // seconds of training: wall_s, or iteration * S with tick=S.
  double replay_clock(double wall_s, int64_t iteration) const {
    return tick_s_ > 0 ? static_cast<double>(iteration) * tick_s_ : wall_s;
  }
  // Emulated capacity factor of `rank` at `elapsed_s` seconds of training (1 for real interference).
  double capacity(int rank, double elapsed_s) const;
  // Most samples `rank` may hold (GPU profile), else no limit.
  int64_t mem_cap(int rank) const;
  // GPU-like cost curve of `rank` at `elapsed_s` (already divided by the capacity); zero curve without a
  // profile.
  balancer::TimeCurve curve(int rank, double elapsed_s) const;
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
  void start_cotenant(int rank);
  void stop_cotenant();

  // stress with pin=: the CPU share a rank keeps while the co-tenants on its CPU run, relative to a rank on a
  // CPU without one: k / (k + sum of the co-tenants' loads / 100) for k ranks pinned to that CPU (CFS shares
  // a CPU equally among runnable tasks; a co-tenant at L% is runnable L% of the time). 1 without pin= or
  // co-tenant. An a-priori model, not a measurement.
  double stress_share(int rank) const;
  // stress with period=: whether the co-tenants run at wall-clock time real_s (CLOCK_REALTIME seconds): on in
  // even periods, off in odd ones, the same schedule in every rank's process.
  bool cotenant_on(double real_s) const;
  // Trace: the series (file#machine) rank replays, and the time in that trace's own clock it replays at
  // elapsed_s (the sample shown is the latest one at or before it).
  const std::string& source_of(int rank) const;
  double trace_time(int rank, double elapsed_s) const;

 private:
  enum class Kind { kNone, kStatic, kTrace, kStress };
  const CapacitySeries& series_of(int rank) const;
  int64_t step_of(int rank, double elapsed_s) const;

  std::string spec_;
  Kind kind_ = Kind::kNone;
  int ranks_ = 1;
  double scale_s_ = 1.0;
  double noise_sd_ = 0.0;
  double period_s_ = 0.0;
  double tick_s_ = 0.0;  // replay clock per iteration (0: the wall clock)
  uint64_t seed_ = 0;
  std::vector<double> static_factors_;
  std::vector<CapacitySeries> series_;  // trace: loaded series
  std::vector<int> series_of_rank_;     // trace: which series each rank replays
  std::vector<int64_t> offsets_;        // trace: start step per rank
  std::vector<balancer::TimeCurve> curves_;
  std::vector<int64_t> caps_;
  std::vector<int> stress_load_;  // percent per rank, 0 = none
  std::vector<int> pin_;          // stress: CPU per rank (cycled), empty = not pinned
  double rate_ = 0;               // trace: trace seconds per training second (0: scale_s_ per step)
  bool align_time_ = false;
  double start_time_ = 0;              // trace with align=time: common start, in the traces' own clock
  std::vector<double> start_of_rank_;  // trace with rate: trace time (from the series' origin) at elapsed 0
  mutable double real_origin_ = -1;    // stress: CLOCK_REALTIME at the trainer's elapsed 0 (set lazily)
  double real_at(double elapsed_s) const;
  double replay_capacity(int rank, double elapsed_s) const;  // static/trace factor, 1 otherwise
  pid_t cotenant_ = -1;
  uint64_t noise_state_ = 0;
  void* switcher_ = nullptr;  // std::thread* toggling the co-tenant on a period
};

}  // namespace lbbsp::runtime
