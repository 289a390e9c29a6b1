// `lbbsp train`: one rank or many under mpirun/srun. Any error on any rank ends the whole job.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cli/checks.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/train/trainer.hpp"

namespace lbbsp::cli {
namespace {

// What trains well on Fashion-MNIST when only --model and --epochs are given (docs/results/defaults.md: the
// README's accuracy on 1 and 4 ranks). Rank count does not enter: the trajectory is the same on any number of
// ranks for one global batch.
struct ModelDefaults {
  double lr;
  const char* lr_schedule;
  int64_t global_batch;
};

ModelDefaults model_defaults(const std::string& model) {
  if (model == "logreg") return {0.1, "cosine", 256};
  return {0.05, "cosine", 64};  // mlp, cnn
}

// An enum-valued flag: CLI11 checks and keeps the spelling (so config.toml repeats it as written), the config
// gets the enum (runtime/train/run_options.hpp).
template <class E>
CLI::Option* add_enum_option(CLI::App* t, const std::string& flag, E& target, const std::string& help) {
  std::vector<std::string> names;
  for (const auto& entry : runtime::EnumNames<E>::table) names.emplace_back(entry.second);
  auto set = [flag, &target](const std::string& text) { target = runtime::parse_enum<E>(flag, text); };
  return t->add_option_function<std::string>(flag, set, help)
      ->check(CLI::IsMember(names))
      ->default_str(runtime::enum_name(target));
}

// --lr, --lr-schedule and --global-batch the user did not give (on the command line or in --config) take the
// model's defaults; they become the options' default strings, so that config.toml records them.
void apply_model_defaults(CLI::App* t, runtime::TrainConfig& c) {
  const ModelDefaults d = model_defaults(c.model);
  if (auto* o = t->get_option("--lr"); o->count() == 0) {
    c.optimizer.lr = d.lr;
    o->default_str(CLI::detail::to_string(d.lr));
  }
  if (auto* o = t->get_option("--lr-schedule"); o->count() == 0) {
    c.optimizer.lr_schedule = d.lr_schedule;
    o->default_str(d.lr_schedule);
  }
  if (auto* o = t->get_option("--global-batch"); o->count() == 0) {
    c.global_batch = d.global_batch;
    o->default_str(std::to_string(d.global_batch));
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  static runtime::TrainConfig c;
  auto* t = app.add_subcommand("train", "Train a model with synchronous data parallelism and load balancing");
  t->add_option("--data", c.data.path, "HDF5 dataset (lbbsp data ...)")->required()->check(CLI::ExistingFile);
  t->add_option("--model", c.model, "logreg | mlp | cnn")
      ->check(CLI::IsMember({"logreg", "mlp", "cnn"}))
      ->capture_default_str();
  add_enum_option(t, "--device", c.device, "cpu | cuda (one GPU per rank, chosen from the node-local rank)");
  add_enum_option(
      t, "--gpu-params", c.gpu_params,
      "cuda: device (parameters, optimizer and gradient stay on the GPU) | host (copied every step)");
  add_enum_option(
      t, "--gpu-allreduce", c.gpu_allreduce,
      "cuda with --gpu-params device: auto (cuda-aware when MPI supports it) | staged (through host "
      "memory) | cuda-aware");
  add_enum_option(
      t, "--allreduce", c.allreduce,
      "gradient reduction with parameters in host memory: node (the ranks of a node sum in shared "
      "memory and keep one copy of the parameters; MPI between nodes) | mpi (MPI_Allreduce) | auto "
      "(node for --device cpu when a node runs several ranks)");
  t->add_option("--hidden", c.hidden, "MLP hidden widths, e.g. 256,128")
      ->delimiter(',')
      ->capture_default_str();
  t->add_option("--epochs", c.epochs, "Epochs")->check(kPositive)->capture_default_str();
  t->add_option("--global-batch", c.global_batch,
                "Global batch X (sum of all ranks' batches) [default per model: logreg 256, mlp and cnn 64]")
      ->check(kPositive);
  t->add_option("--lr", c.optimizer.lr, "Learning rate [default per model: logreg 0.1, mlp and cnn 0.05]")
      ->check(kPositive);
  t->add_option("--momentum", c.optimizer.momentum, "SGD momentum")
      ->check(CLI::Range(0.0, 0.9999))
      ->capture_default_str();
  t->add_option("--weight-decay", c.optimizer.weight_decay, "Weight decay")
      ->check(kNonNegative)
      ->capture_default_str();
  t->add_option("--lr-schedule", c.optimizer.lr_schedule,
                "constant | step:EVERY:GAMMA | cosine [default: cosine]");
  t->add_option("--warmup-iterations", c.optimizer.warmup_iterations, "Linear learning-rate warm-up")
      ->check(kNonNegative)
      ->capture_default_str();
  t->add_option("--seed", c.seed, "Seed (initialisation, data order, emulation)")
      ->check(kNonNegative)  // an unsigned option would silently wrap "-1"
      ->capture_default_str();
  t->add_option("--threads", c.threads,
                "Kernel threads per rank (OpenMP; the BLAS runs one per call: docs/threads.md)")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--max-iterations", c.max_iterations, "Stop after K iterations (0: no limit)")
      ->check(kNonNegative);
  t->add_option("--train-subset", c.data.train_subset, "Use only the first N training samples")
      ->check(kNonNegative);
  t->add_option("--test-subset", c.data.test_subset, "Evaluate on the first N test samples")
      ->check(kNonNegative);
  t->add_option("--data-memory-mb", c.data.memory_mb,
                "Load a split into memory when it fits in this many MiB")
      ->capture_default_str();
  t->add_option("--balancer", c.balancing.balancer,
                "bsp | static[:K] | random:SEED | lbbsp-cpu[;band=F][;track=F][;follow=0|1] | lbbsp-gpu | "
                "lbbsp-gpu-model | oracle")
      ->capture_default_str();
  t->add_option("--predictor", c.balancing.predictor,
                "Speed predictor for lbbsp-cpu: narx | arima | ema | last | oracle")
      ->capture_default_str();
  t->add_option("--min-batch", c.balancing.min_batch, "Smallest batch any rank gets")->check(kNonNegative);
  t->add_option("--lag", c.balancing.lag,
                "Iterations a decision runs ahead: 0 decides the next iteration's batch sizes after each "
                "allreduce; L >= 1 decides the one L after it on a helper thread, overlapped with compute")
      ->check(kNonNegative)
      ->capture_default_str();
  t->add_option("--straggle", c.emulation.straggle, "Straggler emulation spec (see README)")
      ->capture_default_str();
  t->add_option("--log-dir", c.logging.log_dir, "Write per-iteration telemetry (telemetry.h5) here");
  t->add_flag("--csv", c.logging.csv, "Also write telemetry.csv in --log-dir");
  t->add_option("--timeline", c.logging.timeline, "Write a Chrome-trace/Perfetto JSON timeline");
  t->add_option("--timeline-iterations", c.logging.timeline_iterations,
                "FIRST:END: the timeline records only iterations FIRST .. END-1 (docs/telemetry.md)");
  t->add_option("--summary-json", c.logging.summary_json, "Write the run's summary as JSON");
  t->add_option("--save-params", c.logging.save_params,
                "Write the final parameters (HDF5, one dataset per tensor)");
  add_enum_option(t, "--bind", c.bind,
                  "core: bind each rank to its cores with hwloc; none: leave it to the launcher");
  t->add_option("--inject-fault", c.emulation.inject_fault,
                "RANK:ITERATION:KIND (throw|abort|nan|hang), for tests");
  t->add_option("--iteration-timeout", c.iteration_timeout_s,
                "End the job when a rank makes no progress this long (s)")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--eval-every", c.evaluation.every, "Evaluate every N iterations (0: after each epoch)")
      ->check(kNonNegative);
  t->add_option("--target-accuracy", c.evaluation.target_accuracy,
                "Report the training time to reach this test accuracy")
      ->check(CLI::Range(0.0, 1.0));
  t->add_option("--progress-every", c.logging.progress_every, "Progress line every N iterations")
      ->check(kNonNegative);
  t->add_flag("--quiet", c.logging.quiet, "Print nothing but errors");
  t->add_option(
      "--checkpoint-dir", c.checkpoint.dir,
      "Write checkpoints (ckpt-<iteration>.h5) here, and at the end of the run; --resume reads them");
  t->add_option("--checkpoint-every", c.checkpoint.every, "Checkpoint every N iterations")->check(kPositive);
  t->add_option("--checkpoint-keep", c.checkpoint.keep, "Keep the newest K checkpoints")
      ->check(kPositive)
      ->capture_default_str();
  t->add_flag(
      "--resume", c.checkpoint.resume,
      "Continue from the newest valid checkpoint in --checkpoint-dir (same model, global batch, data, seed; "
      "same --lr, --lr-schedule and its horizon, --warmup-iterations, --momentum, --weight-decay)");
  t->add_flag(
      "--allow-optimizer-change", c.checkpoint.allow_optimizer_change,
      "With --resume: continue although the learning rate, its schedule (a cosine's horizon follows "
      "--epochs and --max-iterations), warm-up, momentum or weight decay differ from the checkpoint's; "
      "each difference is printed");

  read_config_section(t);
  t->footer(
      "--config FILE: read flags from a TOML file, section [train], keys the long flag names "
      "(global-batch = 512); flags on the command line win. --log-dir DIR writes DIR/config.toml, which "
      "repeats the run. SIGTERM, SIGUSR1 or SIGINT stop every rank after the same iteration, with a "
      "checkpoint when --checkpoint-dir is given; exit status 128 + the signal.");
  t->callback([t] {
    apply_model_defaults(t, c);
    // Every flag's value as a --config file, for --log-dir: re-running with it reproduces the run.
    // Lines `key=""` are options left unset without a default (or set to ""): reading them back would fail.
    c.logging.config_toml =
        "# lbbsp " LBBSP_VERSION
        ": `lbbsp train --config THIS_FILE` repeats the run; flags given on the command line "
        "win\n[train]\n";
    std::istringstream lines(t->config_to_str(true, false));
    for (std::string line; std::getline(lines, line);)
      if (!line.ends_with("=\"\"")) c.logging.config_toml += line + "\n";
    int status = 0;
    {
      int argc = 0;
      char** argv = nullptr;
      runtime::Comm comm(&argc, &argv);
      try {
        status = runtime::run_training(c, comm);
      } catch (const std::invalid_argument& e) {
        // Bad configuration is the same on every rank: let rank 0 say it once; the others follow its abort.
        if (!comm.is_root()) std::this_thread::sleep_for(std::chrono::seconds(3));
        comm.abort(e.what(), 2);
      } catch (const std::exception& e) {
        comm.abort(e.what(), 1);
      }
    }                                    // MPI is finalised here
    if (status != 0) std::exit(status);  // stopped by a signal: the run did not finish
  });
}

}  // namespace lbbsp::cli
