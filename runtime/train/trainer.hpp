// The BSP training loop: per-rank slices of one seeded global batch, one allreduce per iteration, rank 0
// re-sizing the slices through the BatchSizeManager. Hooks (runtime/train/hooks.hpp: telemetry, timeline,
// evaluation, checkpoints, progress, summary) observe it.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/platform/comm.hpp"
#include "runtime/train/fault_injection.hpp"
#include "runtime/train/hooks.hpp"
#include "runtime/train/reduction_buffer.hpp"
#include "runtime/train/run_options.hpp"
#include "runtime/train/run_stats.hpp"

namespace lbbsp::balancer {
struct IterationReport;
}
namespace lbbsp::models {
class Model;
class Sgd;
struct LrSchedule;
}  // namespace lbbsp::models

namespace lbbsp::runtime {

// The run's settings, in the groups `lbbsp train --help` lists them (flags and config.toml keys are flat:
// runtime/cli/train.cpp maps each flag to its field).
struct DataConfig {
  std::string path;          // --data
  int64_t train_subset = 0;  // use only the first N training rows (0: all)
  int64_t test_subset = 0;   // evaluate on the first N test rows (0: all)
  size_t memory_mb = 4096;   // --data-memory-mb: larger datasets are read out of core
};

struct OptimizerConfig {
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string lr_schedule = "constant";
  int64_t warmup_iterations = 0;
};

struct BalancingConfig {
  std::string balancer = "bsp";
  std::string predictor = "narx";
  int64_t min_batch = 0;
  int lag = 0;  // a decision after iteration t is for iteration t + 1 + lag
};

struct EmulationConfig {
  std::string straggle = "none";  // --straggle SPEC (runtime/straggle/spec.hpp)
  std::string inject_fault;       // RANK:ITERATION:KIND, for tests
};

struct EvaluationConfig {
  int64_t every = 0;           // evaluate every N iterations (0: after each epoch)
  double target_accuracy = 0;  // report training time to reach it (0: off)
};

struct LoggingConfig {
  std::string log_dir;
  std::string config_toml;  // the run's flags as a `--config` file; written to log_dir/config.toml when set
  bool csv = false;
  std::string timeline;
  std::string timeline_iterations;  // FIRST:END: the timeline records only iterations FIRST .. END-1
  std::string summary_json;
  std::string save_params;
  int64_t progress_every = 0;  // plain progress line every N iterations (0: about 20 per run)
  bool quiet = false;
};

struct CheckpointConfig {
  std::string dir;                      // write / resume checkpoints here
  int64_t every = 0;                    // iterations between checkpoints (0: only at the end of the run)
  int keep = 2;                         // newest checkpoints kept
  bool resume = false;                  // continue from the newest valid checkpoint in dir
  bool allow_optimizer_change = false;  // resume although lr, schedule, momentum or weight decay differ
};

struct TrainConfig {
  // The model and where it runs.
  std::string model = "mlp";
  std::vector<int> hidden = {256, 128};
  Device device = Device::kCpu;                      // kCuda: one GPU per rank, chosen from the local rank
  GpuParams gpu_params = GpuParams::kDevice;         // cuda: resident, or copied in and out every step
  HostAllreduce allreduce = HostAllreduce::kAuto;    // host parameters (runtime/train/step_engine.hpp)
  GpuAllreduce gpu_allreduce = GpuAllreduce::kAuto;  // cuda resident (runtime/train/step_engine.hpp)
  int threads = 1;
  Binding bind = Binding::kNone;
  // The run's length and its one seed (initialisation, data order, emulation).
  int epochs = 1;
  int64_t global_batch = 64;
  int64_t max_iterations = 0;  // 0: no limit
  uint64_t seed = 1;
  double iteration_timeout_s = 300;  // a rank stuck this long ends the job

  DataConfig data;
  OptimizerConfig optimizer;
  BalancingConfig balancing;
  EmulationConfig emulation;
  EvaluationConfig evaluation;
  LoggingConfig logging;
  CheckpointConfig checkpoint;
};

// Runs the whole training on this rank. Throws on any error (the caller aborts the job with the message).
// Returns 0, or 128 + the signal when a SIGTERM, SIGINT or SIGUSR1 stopped it early
// (runtime/train/stop_signal.hpp): then every rank stopped after the same iteration and the checkpoint, if
// any, is written. (1 on ranks other than 0 after a set-up error, which rank 0 reports by aborting the job.)
int run_training(const TrainConfig& cfg, Comm& comm);

class BatchPipeline;
class BatchSizeManager;
class StepEngine;
class StopSignals;
class RankConditions;

// One rank's training: set_up() (checks, data, model, balancer, logs, resume, step engine, hooks), then the
// loop in run(), then finish() (the parameter check across ranks, the hooks' on_train_end).
class Trainer {
 public:
  Trainer(const TrainConfig& cfg, Comm& comm);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  int run();  // as run_training

 private:
  using Clock = std::chrono::steady_clock;
  // What one iteration carries from block to block (runtime/train/trainer.cpp).
  struct Step {
    int64_t it = 0, epoch = 0, pos = 0, n = 0;
    Clock::time_point t_iter, t_compute;
    double real_s = 0, compute_s = 0, allreduce_s = 0, coord_s = 0, max_compute = 0;
    std::vector<int64_t> next_batch;
  };

  // Set-up (runtime/train/trainer_setup.cpp); false on ranks other than 0 after a set-up error.
  bool set_up();
  void check_config() const;
  void prepare_outputs() const;
  void load_data_and_model();
  bool make_balancer();
  void make_run_log();
  void print_banner() const;
  void allocate();
  bool resume();
  bool load_checkpoint(TrainState* st, std::string* used, std::string* meta);
  void check_optimizer(const TrainState& st, const std::string& used) const;
  void restore_balancer(const TrainState& st, const std::string& used, bool same_split,
                        const std::vector<double>& predicted);
  void make_engine();
  void make_hooks();
  // Checkpoints (runtime/train/trainer.cpp): the state a checkpoint holds.
  TrainState snapshot(int64_t next_iteration);

  // The loop's blocks (runtime/train/trainer.cpp).
  Step begin_iteration(int64_t it);
  void slice(Step& s);
  void forward_backward(Step& s, models::StepStats& stats);
  void fill_slots(Step& s, const models::StepStats& stats);
  void allreduce(Step& s);
  void decide(Step& s);
  balancer::IterationReport report(const Step& s) const;
  void sgd_step(Step& s);
  IterationContext end_iteration(Step& s);
  int finish(int64_t it);
  double params_checksum();

  const TrainConfig& cfg_;
  Comm& comm_;
  const int R_, me_;
  const bool root_;
  Fault fault_;
  std::unique_ptr<Dataset> train_, test_;
  int64_t n_train_ = 0, n_test_ = 0, X_ = 0, per_epoch_ = 0, total_ = 0, start_it_ = 0;
  int64_t my_cap_ = 0;
  std::unique_ptr<models::Model> model_;
  std::vector<float> params_;
  std::unique_ptr<models::Sgd> sgd_;
  std::unique_ptr<models::LrSchedule> schedule_;
  std::unique_ptr<RankConditions> conditions_;  // compute time and metrics: the machine's or emulated
  std::vector<int64_t> caps_;                   // most samples each rank may take
  std::unique_ptr<BatchSizeManager> manager_;   // rank 0
  std::unique_ptr<BatchPipeline> pipeline_;     // every rank: the lag
  std::vector<int64_t> batch_;                  // this iteration's batch vector
  std::unique_ptr<RunLog> run_log_;             // rank 0 with --log-dir or --timeline
  std::unique_ptr<ReductionBuffer> buf_;
  std::vector<float> x_;
  std::vector<uint8_t> y_;
  std::vector<int64_t> perm_, rows_;
  std::unique_ptr<Watchdog> watchdog_;
  RunStats stats_;
  bool tty_ = false;
  CheckpointIdentity ckpt_id_;
  OptimizerRecord optimizer_;  // recorded in checkpoints, compared on --resume
  std::unique_ptr<StepEngine> engine_;
  std::unique_ptr<StopSignals> stop_signals_;
  int stop_sig_ = 0;  // the first stop signal any rank received: the same on every rank
  Clock::time_point t0_;
  Hooks hooks_;
};

}  // namespace lbbsp::runtime
