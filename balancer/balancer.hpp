// Batch-size balancers: consume one report per iteration for all workers, return the next batch vector.
// Pure C++ (no MPI, no I/O); the runtime's BatchSizeManager on rank 0 and the simulator drive them alike.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace lbbsp::balancer {

// GPU-like cost of a batch: flat below the saturation batch, linear above it.
struct TimeCurve {
  double floor_s = 0.0;           // time for any batch <= sat_batch
  double sat_batch = 0.0;         // samples
  double slope_s_per_sample = 0;  // above sat_batch
  double time(double b) const {
    return b <= 0 ? 0.0 : floor_s + (b > sat_batch ? (b - sat_batch) * slope_s_per_sample : 0.0);
  }
};

// Emulation only: what an emulated cluster (`lbbsp train --straggle`, the simulator) knows of a worker and a
// real one never does. Only the oracle balancer and the oracle predictor read it; NaN / a zero curve when
// unknown, as on every real cluster.
struct EmulationTruth {
  double capacity = std::numeric_limits<double>::quiet_NaN();       // this iteration's capacity factor
  double capacity_next = std::numeric_limits<double>::quiet_NaN();  // the iteration decided for
  TimeCurve curve_next;                                             // its GPU profile
};

struct WorkerReport {
  int64_t batch = 0;             // samples processed this iteration
  double compute_s = 0.0;        // compute time (excluding waiting)
  std::vector<double> exo;       // exogenous metrics measured for this iteration (cpu avail, mem avail, ...)
  std::vector<double> exo_next;  // exogenous inputs already known for the coming iteration (may be empty)
  int64_t mem_cap = std::numeric_limits<int64_t>::max();  // most samples this worker can hold
  EmulationTruth truth;                                   // emulation only (above)
};

struct IterationReport {
  int64_t iteration = 0;
  std::vector<WorkerReport> workers;
};

struct BalancerConfig {
  // bsp | static[:K] | random:SEED | lbbsp-cpu[:PREDICTOR_SPEC][;band=F][;track=F][;follow=0|1] |
  // lbbsp-gpu[:W] | lbbsp-gpu-model | oracle
  // ("lbbsp-cpu:SPEC" overrides `predictor`; lbbsp-gpu's W is its first monitoring window, default 2).
  std::string name = "bsp";
  std::string predictor = "narx";  // for lbbsp-cpu
  int workers = 1;
  int64_t global_batch = 0;
  int64_t min_batch = 0;  // per worker
  int num_exo = 0;        // length of WorkerReport::exo
  // Index into WorkerReport::exo of a capacity-like availability in (0, 1] (CPU/GPU share left by
  // co-tenants), or -1 for none. lbbsp-cpu and lbbsp-gpu-model use it to keep tracking a worker they give
  // 0 samples (speed at capacity 1 x the capacity now), so they may idle a hopeless straggler;
  // lbbsp-gpu-model also normalises its curve fit by it. Without it every worker keeps at least one sample
  // (when X >= workers) to stay measured.
  int capacity_exo = -1;
  uint64_t seed = 0;
  // Memory caps (samples) known before the first report, used by initial(); empty = unlimited. After that the
  // caps come from WorkerReport::mem_cap.
  std::vector<int64_t> mem_cap;
};

class Balancer {
 public:
  virtual ~Balancer() = default;
  virtual std::string name() const = 0;
  // Batch vector for the first iteration (before any report).
  virtual std::vector<int64_t> initial() = 0;
  // Batch vector for the next iteration given this one's report. Always sums to X and respects the bounds.
  virtual std::vector<int64_t> next(const IterationReport& report) = 0;
  // Speeds (samples/s) predicted for the coming iteration, per worker (empty when the balancer has none).
  virtual std::vector<double> predicted_speeds() const { return {}; }
  // The relative miss (log of measured / predicted speed, RMS over the workers) the band is measured in, as
  // of the last decision (a new split had to beat ;band= times it, 0.5 by default); 0 where the balancer
  // holds no band (all but lbbsp-cpu).
  virtual double noise_band() const { return 0.0; }
  virtual std::string save_state() const = 0;
  virtual void load_state(const std::string& state) = 0;
};

// Throws std::invalid_argument naming the bad name or value.
std::unique_ptr<Balancer> make_balancer(const BalancerConfig& cfg);
// A kind of one's own (a benchmark's peer, a policy of one's own): make_balancer() then builds it for the
// specs KIND and KIND:ARGS, handing the factory the text after the colon ("" without). Register before the
// first make_balancer() (a static initialiser of the program); a built-in kind or a kind registered twice
// throws.
using BalancerFactory =
    std::function<std::unique_ptr<Balancer>(const BalancerConfig&, const std::string& args)>;
void register_balancer(const std::string& kind, BalancerFactory factory);
// The kinds make_balancer() knows (static:K, random:SEED, lbbsp-cpu:PREDICTOR, lbbsp-gpu:W take arguments):
// the one list (the Python package reads it).
const std::vector<std::string>& balancer_kinds();

// The exogenous inputs `lbbsp train` and lbbsp.torch measure on every rank (runtime/monitor.hpp), in the
// order of WorkerReport::exo; the first is capacity-like (BalancerConfig::capacity_exo).
inline constexpr std::array<const char*, 3> kRankExo = {"cpu_avail", "mem_avail", "load"};
inline constexpr int kRankCapacityExo = 0;

}  // namespace lbbsp::balancer
