// Hooks: the trainer's side concerns (telemetry, evaluation, checkpoints, progress, stop messages, summary,
// fault injection), each a TrainHook that observes the loop at a few points, as LBANN's callbacks do. The
// trainer calls every hook at each point through Hooks, in the order added except where a hook names the
// hooks it must follow (`after`: a dependency, such as the summary reading what the telemetry flushed); that
// order is the order of their side effects (log lines, files). Each hook is built from a set-up with named
// fields; the contexts carry what changes per iteration.
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/checkpoint.hpp"
#include "runtime/train/reduction_buffer.hpp"
#include "runtime/train/run_stats.hpp"

namespace lbbsp::models {
class Model;
struct StepStats;
}  // namespace lbbsp::models

namespace lbbsp::runtime {

class Comm;
class Dataset;
class RunLog;
class StepEngine;
class Watchdog;
struct TrainConfig;

struct TrainContext {
  // The training clock's zero (a resumed run's earlier training time lies before it).
  std::chrono::steady_clock::time_point t0;
  int64_t start_iteration = 0;
};

// The iteration that just ended: its measurements (after the allreduce, every rank's slot) and what comes
// next.
struct IterationContext {
  int64_t iteration = 0;
  int64_t epoch = 0;
  bool epoch_end = false;         // the last iteration of its epoch
  bool last = false;              // the last iteration of the run
  bool stopping = false;          // a stop signal ends the run after this iteration (never on the last one)
  int stop_signal = 0;            // the first stop signal any rank received (0: none)
  double start_s = 0;             // when its compute began, seconds of training
  std::vector<int64_t> batch;     // the batch vector it ran with
  std::vector<double> predicted;  // rank 0: the speeds the balancer predicted for it
  const ReductionBuffer* buffer = nullptr;  // the reduced buffer: every rank's slot
  double max_compute = 0;                   // the slowest rank's compute time
  double compute_s = 0;                     // this rank's
  double allreduce_s = 0;           // the allreduce as this rank saw it (waiting for the slowest included)
  double coord_s = 0;               // deciding and distributing the batch vector
  double epoch_train_loss = NAN;    // mean training loss of its epoch so far
  const RunStats* stats = nullptr;  // updated for this iteration
};

struct TrainEndContext {
  int64_t iterations = 0;  // iterations done, those of the runs before a resume included
  int64_t start_iteration = 0;
  int exit_status = 0;  // 0, or 128 + the stop signal
  int stop_signal = 0;
  double params_checksum = 0;
  std::chrono::steady_clock::time_point t0;
  const RunStats* stats = nullptr;
  std::vector<std::pair<std::string, double>> hook_seconds;  // each hook's time in the run, before this point
};

class TrainHook {
 public:
  virtual ~TrainHook() = default;
  // A string literal: the hook's entry in the summary's hook times, the phase the watchdog names while it
  // runs, and what other hooks' `after` lists refer to.
  virtual const char* name() const = 0;
  virtual void on_train_begin(const TrainContext&) {}
  // Around this rank's forward/backward pass (the stats are this rank's, before they enter the buffer).
  virtual void on_compute_begin(int64_t /*iteration*/) {}
  virtual void on_compute_end(int64_t /*iteration*/, models::StepStats& /*stats*/) {}
  virtual void on_iteration_end(const IterationContext&) {}
  virtual void on_train_end(const TrainEndContext&) {}
};

// The trainer's hooks. At the end of an iteration and at the start and end of the run it beats the watchdog
// with each hook's name before calling it (a hook that hangs is named), and it times every hook.
class Hooks {
 public:
  explicit Hooks(Watchdog* watchdog = nullptr) : watchdog_(watchdog) {}
  // Adds a hook (null: nothing) that runs after the hooks named in `after` (where those are added at all).
  void add(std::unique_ptr<TrainHook> hook, std::vector<std::string> after = {});
  void on_train_begin(const TrainContext& c);
  void on_compute_begin(int64_t iteration);
  void on_compute_end(int64_t iteration, models::StepStats& stats);
  void on_iteration_end(const IterationContext& c);
  void on_train_end(TrainEndContext c);  // c.hook_seconds filled in
  // The hooks' names in calling order (orders them first).
  std::vector<std::string> names();

 private:
  struct Entry {
    std::unique_ptr<TrainHook> hook;
    std::vector<std::string> after;
    double seconds = 0;
  };
  void order();  // stable: the order added, each hook moved behind the ones it names
  template <class Call>
  void each(const int64_t* beat_iteration, Call&& call);
  std::vector<std::pair<std::string, double>> seconds() const;

  Watchdog* watchdog_;
  std::vector<Entry> entries_;
  bool ordered_ = false;
};

// Rank 0, "telemetry": one telemetry row per rank and the timeline slices per iteration
// (runtime/io/telemetry.hpp); flushes at the end.
std::unique_ptr<TrainHook> make_telemetry_hook(RunLog& log, int ranks);

// Every rank (collective), "evaluation": the test-set evaluation after each epoch (or every --eval-every
// iterations) and at the end; records it in stats (accuracy curve, time to target) and rank 0 prints it.
struct EvaluationSetup {
  const TrainConfig* cfg = nullptr;
  StepEngine* engine = nullptr;
  const Dataset* test = nullptr;
  int64_t test_rows = 0;
  Comm* comm = nullptr;
  Watchdog* watchdog = nullptr;
  RunStats* stats = nullptr;
  int64_t per_epoch = 1, total = 0;
  bool tty = false;
};
std::unique_ptr<TrainHook> make_evaluation_hook(const EvaluationSetup& setup);

// Every rank, "checkpoint": checkpoints every --checkpoint-every iterations, at the end and when stopped by a
// signal; rank 0 writes snapshot(next iteration). A failed write is a warning (the older checkpoints stay).
std::unique_ptr<TrainHook> make_checkpoint_hook(const TrainConfig& cfg, Watchdog& watchdog, bool root,
                                                CheckpointIdentity id,
                                                std::function<TrainState(int64_t)> snapshot);

// Rank 0 unless --quiet, "progress": the live bar on a terminal, else a line every --progress-every
// iterations.
struct ProgressSetup {
  const TrainConfig* cfg = nullptr;
  int ranks = 1;
  int64_t total = 0;  // iterations of the run
  bool tty = false;
};
std::unique_ptr<TrainHook> make_progress_hook(const ProgressSetup& setup);

// Rank 0, "stop message": says after which iteration a stop signal ended the run and how to continue it.
std::unique_ptr<TrainHook> make_stop_message_hook(const TrainConfig& cfg, int64_t total);

// Rank 0, "summary": --summary-json (with every earlier hook's time), --save-params and the closing line.
struct SummarySetup {
  const TrainConfig* cfg = nullptr;
  const models::Model* model = nullptr;
  const std::vector<float>* params = nullptr;
  int ranks = 1;
  int64_t per_epoch = 1;
  std::string step_mode;
  const RunLog* log = nullptr;  // its io_s() after the telemetry hook flushed it
};
std::unique_ptr<TrainHook> make_summary_hook(const SummarySetup& setup);

}  // namespace lbbsp::runtime
