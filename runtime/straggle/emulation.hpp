// One kind of straggler emulation behind one interface: none, static factors, trace replay (static.cpp,
// trace_replay.cpp) emulate a slower machine by stretching compute; the stress-ng co-tenant (cotenant.cpp) is
// real interference that is measured, not stretched. The GPU cost model (gpu_cost.hpp) goes on top of any
// kind. runtime::Straggler (runtime/straggle/straggler.hpp) is the one object the trainer holds; it owns one
// Emulation.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "runtime/straggle/spec.hpp"

namespace lbbsp::runtime::straggle {

class Emulation {
 public:
  virtual ~Emulation() = default;

  // static/trace: capacities are emulated (compute is stretched, metrics come from the replay).
  virtual bool replay() const { return false; }
  // The factor compute is stretched by and the GPU curve divided by: static/trace factor, 1 otherwise.
  virtual double replay_capacity(int /*rank*/, double /*elapsed_s*/) const { return 1.0; }
  // The capacity reported to the oracle: the replay factor, or stress's modelled CPU share.
  virtual double capacity(int rank, double elapsed_s) const { return replay_capacity(rank, elapsed_s); }
  // Memory available that a trace reports for rank at elapsed_s; none without a memory column.
  virtual std::optional<double> mem_avail(int /*rank*/, double /*elapsed_s*/) const { return std::nullopt; }
  // Trace: the series rank replays and the time in its own clock at elapsed_s; "" and 0 for other kinds.
  virtual const std::string& source_of(int rank) const;
  virtual double trace_time(int /*rank*/, double /*elapsed_s*/) const { return 0.0; }
  // Stress with pin=: the CPU share rank keeps while the co-tenants on its CPU run; 1 otherwise.
  virtual double stress_share(int /*rank*/) const { return 1.0; }
  // Called with a fresh elapsed time (metrics()): stress ties its wall clock to the trainer's there.
  virtual void anchor_clock(double /*elapsed_s*/) {}
  // Real interference only: pin the rank and start its co-tenant; stop it (idempotent).
  virtual void start(int /*rank*/) {}
  virtual void stop() {}
};

// The Emulation for config.kind. Trace replay reads its files here (errors name the file, in config's spec).
std::unique_ptr<Emulation> make_emulation(const Config& config);

std::unique_ptr<Emulation> make_static(const Config& config);
std::unique_ptr<Emulation> make_trace_replay(const Config& config);
std::unique_ptr<Emulation> make_cotenant(const Config& config);

// period=S: whether co-tenants run at wall-clock time real_s (CLOCK_REALTIME seconds): on in even periods,
// off in odd ones, the same schedule in every rank's process. Always on without a period (period_s <= 0).
bool cotenant_on(double period_s, double real_s);

}  // namespace lbbsp::runtime::straggle
