// Trace-driven simulation of synchronous data-parallel training: simulated workers (capacities replayed from
// traces, CPU linear or GPU piecewise-linear cost, memory caps, ring-allreduce cost) drive the real balancers
// and predictors (balancer/, predictors/) exactly as the trainer's BatchSizeManager does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/analysis/traces.hpp"

namespace lbbsp::runtime {

struct SimulatorConfig {
  int workers = 16;
  int64_t iterations = 200;
  std::string profile = "cpu";  // cpu: t = b * cost_i / capacity; gpu: t = curve_i(b) / capacity, memory caps
  int64_t global_batch = 0;     // 0: 32 samples per worker
  // Entries: bsp, static[:K], random:SEED, lbbsp-cpu[:PREDICTOR][;band=F][;track=F][;follow=0|1],
  // lbbsp-gpu[:W], lbbsp-gpu-model, oracle. bsp and oracle are always run (appended when missing): they are
  // the baselines of the ratios.
  std::vector<std::string> balancers = {"bsp", "oracle"};
  std::string predictor = "ema";  // lbbsp-cpu entries without their own spec
  uint64_t seed = 1;
  // 0: one trace sample per iteration (every balancer sees the same capacity sequence, so the oracle is a
  // strict upper bound). > 0: one trace sample lasts this many simulated seconds (faster balancers move
  // through the trace more slowly per iteration). The capacity is held for the whole of an iteration either
  // way.
  double time_scale_s = 0.0;
  double sample_cost_s = 2e-3;    // CPU: seconds per sample at capacity 1 on the fastest worker
  double heterogeneity = 2.0;     // slowest worker's base cost / the fastest's (seeded, uniform in [1, H])
  double gpu_floor_s = 0.05;      // GPU: time of any batch up to the saturation batch (fastest worker)
  double gpu_sat_batch = 32;      // GPU: saturation batch, samples
  double gpu_slope_s = 1.5e-3;    // GPU: seconds per sample above the saturation batch (fastest worker)
  double mem_factor = 2.0;        // GPU memory cap = mem_factor * X / N * U(0.75, 1.25) samples (seeded)
  double grad_bytes = 1 << 20;    // ring allreduce: 2 (N-1)/N bytes / bandwidth + 2 (N-1) latency
  double bandwidth_Bps = 1.25e9;  // 10 GbE
  double latency_s = 25e-6;
  bool exo_next = false;    // pass the coming step's capacity as exo_next (the co-tenant's known load)
  int64_t min_batch = 0;    // per worker, for every balancer
  std::string trace_out;    // CSV of per-iteration batch vectors when not empty
  std::string reports_out;  // CSV of the reports every balancer received (per iteration and worker)
};

struct BalancerResult {
  std::string balancer;
  std::string predictor;  // empty for balancers without one
  double mean_iteration_s = 0;
  double mean_compute_s = 0;  // slowest worker's compute time, averaged
  double efficiency_vs_oracle = 0;
  double speedup_vs_bsp = 0;
  double wait_fraction = 0;  // worker time spent waiting for the slowest / worker time of the compute phases
  double decision_ms_per_iteration = 0;  // measured wall time of Balancer::next()
};

struct SimulationResult {
  int workers = 0;
  int64_t iterations = 0;
  std::string profile;
  int64_t global_batch = 0;
  size_t trace_series = 0;
  double allreduce_s = 0;
  std::vector<BalancerResult> results;
};

// Seconds for a ring allreduce of `bytes` over `workers`.
double ring_allreduce_s(int workers, double bytes, double bandwidth_Bps, double latency_s);

// Splits "bsp,lbbsp-cpu:narx:hidden=8,window=32,oracle" into entries: a comma-separated piece that does not
// start with a balancer name belongs to the previous entry's predictor spec.
std::vector<std::string> split_balancer_list(const std::string& list);

// Throws std::invalid_argument for bad settings or balancer names, std::runtime_error for empty traces or a
// balancer breaking the rules (sum, memory caps).
SimulationResult simulate(const SimulatorConfig& cfg, const std::vector<TraceSeries>& traces);

std::string to_markdown(const SimulationResult& result);
nlohmann::json to_json(const SimulationResult& result);

}  // namespace lbbsp::runtime
