// The --straggle spec, parsed once into a Config that every kind of emulation reads.
//
//   SPEC    := KIND [";" OPTION]...
//   KIND    := none | static:F0,F1,...        capacity factor per rank (cycled when fewer than ranks)
//            | trace:PATH[,PATH...]          capacity time series (files or folders: analysis/traces.hpp)
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
//
// Errors are std::invalid_argument in the shared style of common/spec.hpp: "--straggle: WHY (in 'SPEC';
// valid:
// ...)".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "balancer/balancer.hpp"

namespace lbbsp::runtime::straggle {

enum class Kind { kNone, kStatic, kTrace, kStress };

struct Config {
  std::string text;  // the spec as given
  Kind kind = Kind::kNone;
  int ranks = 1;
  uint64_t seed = 0;  // seed= or the training seed
  // Options (each checked for its range here, and for the kind it belongs to).
  double scale_s = 1.0;  // trace: seconds of training per trace step
  double rate = 0;       // trace: trace seconds per training second (0: scale_s per step)
  bool align_time = false;
  std::vector<int64_t> offsets;  // trace: start step per rank (last one repeated), empty = seeded random
  double noise_sd = 0;
  double period_s = 0;                          // stress: on/off period (0: always on)
  double tick_s = 0;                            // replay clock per iteration (0: the wall clock)
  std::vector<int> pin;                         // stress: CPU per rank (cycled), empty = not pinned
  std::vector<balancer::TimeCurve> gpu_curves;  // per rank (cycled), empty = no GPU profile
  std::vector<int64_t> gpu_caps;                // samples, one per curve
  // Kind arguments.
  std::vector<double> static_factors;    // static: in (0, 1], cycled
  std::vector<std::string> trace_paths;  // trace: files or folders
  std::vector<int> stress_load;          // stress: percent per rank, 0 = no co-tenant
};

// Throws std::invalid_argument naming the part of `text` that is wrong. Does not read trace files.
Config parse(const std::string& text, int ranks, uint64_t seed);

// Throws std::invalid_argument for `config`'s spec in the same style (for errors found later, e.g. in a
// trace).
[[noreturn]] void fail(const Config& config, const std::string& why);

}  // namespace lbbsp::runtime::straggle
