// The BSP training loop: per-rank slices of one seeded global batch, one allreduce per iteration, rank 0
// re-sizing the slices through the BatchSizeManager. Hooks (telemetry, timeline, progress) observe it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "balancer/sampling.hpp"
#include "runtime/comm.hpp"
#include "runtime/run_options.hpp"

namespace lbbsp::runtime {

struct TrainConfig {
  std::string data;
  std::string model = "mlp";
  Device device = Device::kCpu;                      // kCuda: one GPU per rank, chosen from the local rank
  GpuParams gpu_params = GpuParams::kDevice;         // cuda: resident, or copied in and out every step
  HostAllreduce allreduce = HostAllreduce::kAuto;    // host parameters (runtime/step_engine.hpp)
  GpuAllreduce gpu_allreduce = GpuAllreduce::kAuto;  // cuda resident (runtime/step_engine.hpp)
  std::vector<int> hidden = {256, 128};
  int epochs = 1;
  int64_t global_batch = 64;
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string lr_schedule = "constant";
  int64_t warmup_iterations = 0;
  uint64_t seed = 1;
  int threads = 1;
  int64_t max_iterations = 0;  // 0: no limit
  int64_t train_subset = 0;    // use only the first N training rows (0: all)
  int64_t test_subset = 0;     // evaluate on the first N test rows (0: all)
  size_t data_memory_mb = 4096;
  std::string balancer = "bsp";
  std::string predictor = "narx";
  int64_t min_batch = 0;
  int lag = 0;
  std::string straggle = "none";
  std::string log_dir;
  std::string config_toml;  // the run's flags as a `--config` file; written to log_dir/config.toml when set
  bool csv = false;
  std::string timeline;
  std::string timeline_iterations;  // FIRST:END: the timeline records only iterations FIRST .. END-1
  std::string summary_json;
  std::string save_params;
  Binding bind = Binding::kNone;
  std::string inject_fault;          // RANK:ITERATION:KIND
  double iteration_timeout_s = 300;  // a rank stuck this long ends the job
  int64_t eval_every = 0;            // evaluate every N iterations (0: after each epoch)
  double target_accuracy = 0;        // report training time to reach it (0: off)
  int64_t progress_every = 0;        // plain progress line every N iterations (0: about 20 per run)
  bool quiet = false;
  std::string checkpoint_dir;    // write / resume checkpoints here
  int64_t checkpoint_every = 0;  // iterations between checkpoints (0: only at the end of the run)
  int checkpoint_keep = 2;       // newest checkpoints kept
  bool resume = false;           // continue from the newest valid checkpoint in checkpoint_dir
};

// Runs the whole training on this rank. Throws on any error (the caller aborts the job with the message).
// Returns 0, or 128 + the signal when a SIGTERM, SIGINT or SIGUSR1 stopped it early
// (runtime/stop_signal.hpp): then every rank stopped after the same iteration and the checkpoint, if any, is
// written. (1 on ranks other than 0 after a set-up error, which rank 0 reports by aborting the job.)
int run_training(const TrainConfig& cfg, Comm& comm);

// The epoch permutation lives in the core library (balancer/sampling.hpp), shared with the Python package.
using balancer::epoch_permutation;

}  // namespace lbbsp::runtime
