// `lbbsp simulate`: run the real balancers and predictors against trace-driven simulated workers.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "runtime/analysis/simulator.hpp"
#include "runtime/analysis/traces.hpp"
#include "runtime/cli/checks.hpp"
#include "runtime/cli/commands.hpp"

namespace lbbsp::cli {

void add_simulate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("simulate",
                                 "Replay capacity traces on simulated workers and compare balancers (mean "
                                 "iteration time, efficiency vs the "
                                 "oracle, speed-up vs BSP, wait fraction, decision cost)");
  read_config_section(cmd);
  struct Options {
    runtime::SimulatorConfig cfg;
    std::string traces;
    std::string balancers = "bsp,static,lbbsp-cpu,oracle";
    std::string format = "md";
  };
  auto opt = std::make_shared<Options>();
  auto& c = opt->cfg;
  cmd->add_option("--workers", c.workers, "Simulated workers")
      ->check(CLI::Range(1, 10'000'000))
      ->capture_default_str();
  cmd->add_option("--traces", opt->traces, "Trace file or folder (searched recursively)")->required();
  cmd->add_option("--balancers", opt->balancers,
                  "Comma-separated: bsp, static[:K], random:SEED, "
                  "lbbsp-cpu[:PREDICTOR][;band=F][;track=F][;follow=0|1], "
                  "lbbsp-gpu[:W], "
                  "lbbsp-gpu-model, oracle (bsp and oracle are always added)")
      ->capture_default_str();
  cmd->add_option("--iterations", c.iterations, "Iterations per balancer")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000'000}))
      ->capture_default_str();
  cmd->add_option("--profile", c.profile,
                  "cpu: time linear in batch; gpu: flat below saturation, memory caps")
      ->check(CLI::IsMember({"cpu", "gpu"}))
      ->capture_default_str();
  cmd->add_option("--global-batch", c.global_batch, "Global batch X (0: 32 per worker)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--predictor", c.predictor, "Predictor for lbbsp-cpu entries without their own")
      ->capture_default_str();
  cmd->add_option("--seed", c.seed, "Seed of trace assignment, offsets and worker speeds")
      ->capture_default_str();
  cmd->add_option("--format", opt->format, "Output format")
      ->check(CLI::IsMember({"md", "json"}))
      ->capture_default_str();
  cmd->add_option("--time-scale", c.time_scale_s,
                  "Simulated seconds per trace sample (0: one trace sample per iteration)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--sample-cost", c.sample_cost_s,
                  "CPU seconds per sample at full capacity (fastest worker)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--heterogeneity", c.heterogeneity, "Slowest / fastest base cost (uniform in [1, H])")
      ->check(CLI::Range(1.0, 1e9))
      ->capture_default_str();
  cmd->add_option("--gpu-floor", c.gpu_floor_s, "GPU seconds for any batch up to saturation")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--gpu-sat", c.gpu_sat_batch, "GPU saturation batch (samples)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--gpu-slope", c.gpu_slope_s, "GPU seconds per sample above saturation")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--mem-factor", c.mem_factor, "GPU memory cap = F * X / N * U(0.75, 1.25) samples")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--grad-bytes", c.grad_bytes, "Gradient bytes per allreduce")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--bandwidth", c.bandwidth_Bps, "Link bandwidth, bytes/s (10 GbE = 1.25e9)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--latency", c.latency_s, "Per-message latency, seconds")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--min-batch", c.min_batch, "Minimum samples per worker for every balancer")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_flag("--exo-next", c.exo_next,
                "Tell predictors the coming step's capacity (known co-tenant load)");
  cmd->add_option("--trace-out", c.trace_out,
                  "CSV of per-iteration batch vectors (balancer,iteration,...,b0..)");
  cmd->add_option(
      "--reports-out", c.reports_out,
      "CSV of the report each balancer got per iteration and worker (batch, compute_s, cpu_avail, ...)");
  cmd->callback([opt] {
    opt->cfg.balancers = runtime::split_balancer_list(opt->balancers);
    const auto traces = runtime::load_traces(opt->traces);
    const auto start = std::chrono::steady_clock::now();
    const auto result = runtime::simulate(opt->cfg, traces);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (opt->format == "json") {
      std::cout << runtime::to_json(result).dump(2) << '\n';
    } else {
      std::cout << runtime::to_markdown(result);
      std::cout << "\nsimulation wall time " << wall << " s\n";
    }
  });
}

}  // namespace lbbsp::cli
