// Trainer::set_up: everything before the first iteration, in the order its side effects happen (checks,
// output folders, data and model, balancer, logs, banner, resume, step engine, hooks).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/model.hpp"
#ifdef LBBSP_WITH_CUDA
#include "models/cuda/cuda_models.hpp"
#endif
#include "models/optimizer.hpp"
#include "runtime/io/dataset.hpp"
#include "runtime/io/telemetry.hpp"
#include "runtime/platform/topology.hpp"
#include "runtime/train/batch_manager.hpp"
#include "runtime/train/batch_pipeline.hpp"
#include "runtime/train/rank_conditions.hpp"
#include "runtime/train/step_engine.hpp"
#include "runtime/train/stop_signal.hpp"
#include "runtime/train/trainer.hpp"
#include "runtime/train/watchdog.hpp"

namespace lbbsp::runtime {

namespace {
// mpirun hands ranks a pseudo-terminal even when its own output goes to a file: only a direct run gets the
// live bar.
bool stdout_is_tty() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID"})
    if (std::getenv(v)) return false;
  return isatty(STDOUT_FILENO) == 1;
}

// The schedule as a checkpoint records it: the horizon only where the schedule depends on it (cosine).
OptimizerRecord optimizer_record(const models::LrSchedule& s, double momentum, double weight_decay) {
  using Kind = models::LrSchedule::Kind;
  OptimizerRecord r;
  r.schedule = s.kind == Kind::kCosine ? "cosine" : s.kind == Kind::kStep ? "step" : "constant";
  r.lr = s.base_lr;
  r.warmup = s.warmup_iterations;
  r.horizon = s.kind == Kind::kCosine ? s.total_iterations : 0;
  r.step_every = s.kind == Kind::kStep ? s.step_every : 0;
  r.step_gamma = s.kind == Kind::kStep ? s.step_gamma : 0.0;
  r.momentum = momentum;
  r.weight_decay = weight_decay;
  return r;
}
}  // namespace

bool Trainer::set_up() {
  fault_ = parse_fault(cfg_.emulation.inject_fault, R_);
  check_config();
  prepare_outputs();
  if (cfg_.bind == Binding::kCore) bind_to_cores(comm_.local_rank() * cfg_.threads, cfg_.threads);
  models::set_num_threads(cfg_.threads);
  load_data_and_model();
  if (!make_balancer()) return false;
  make_run_log();
  print_banner();
  allocate();
  if (cfg_.checkpoint.resume && !resume()) return false;
  make_engine();
  make_hooks();
  return true;
}

void Trainer::check_config() const {
  const TrainConfig& cfg = cfg_;
  if (cfg.global_batch < 1) throw std::invalid_argument("--global-batch must be >= 1");
  check_float_exact(cfg.global_batch, "--global-batch");  // counts and batch sizes ride in float slots
  if (cfg.epochs < 1) throw std::invalid_argument("--epochs must be >= 1");
  if (cfg.threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (cfg.balancing.lag < 0) throw std::invalid_argument("--lag must be >= 0");
  if (!(cfg.optimizer.lr > 0) || !std::isfinite(cfg.optimizer.lr))
    throw std::invalid_argument("--lr must be a positive number");
  if (cfg.checkpoint.every < 0) throw std::invalid_argument("--checkpoint-every must be >= 1");
  if (cfg.checkpoint.keep < 1) throw std::invalid_argument("--checkpoint-keep must be >= 1");
  parse_timeline_window(cfg.logging.timeline_iterations);  // throws on a bad window
  if (!cfg.logging.timeline_iterations.empty() && cfg.logging.timeline.empty())
    throw std::invalid_argument("--timeline-iterations needs --timeline FILE");
  if ((cfg.checkpoint.resume || cfg.checkpoint.every > 0) && cfg.checkpoint.dir.empty())
    throw std::invalid_argument(std::string(cfg.checkpoint.resume ? "--resume" : "--checkpoint-every") +
                                " needs --checkpoint-dir DIR");
  if (cfg.checkpoint.allow_optimizer_change && !cfg.checkpoint.resume)
    throw std::invalid_argument("--allow-optimizer-change applies to --resume only: add --resume or drop it");
}

// Output paths are checked before training, not discovered unwritable at the end of a long run. The log
// folder is made first, so that outputs inside it (--summary-json DIR/summary.json) are fine.
void Trainer::prepare_outputs() const {
  const TrainConfig& cfg = cfg_;
  if (root_ && !cfg.checkpoint.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.checkpoint.dir, ec);
    if (!std::filesystem::is_directory(cfg.checkpoint.dir))
      throw std::invalid_argument("--checkpoint-dir: cannot create folder '" + cfg.checkpoint.dir + "'" +
                                  (ec ? ": " + ec.message() : ""));
  }
  if (!cfg.logging.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.logging.log_dir, ec);
    if (ec)
      throw std::invalid_argument("--log-dir: cannot create '" + cfg.logging.log_dir + "': " + ec.message());
    if (root_ && !cfg.logging.config_toml.empty()) {
      const auto path = std::filesystem::path(cfg.logging.log_dir) / "config.toml";
      std::ofstream out(path);
      out << cfg.logging.config_toml;
      if (!out.flush()) throw std::invalid_argument("--log-dir: cannot write '" + path.string() + "'");
    }
  }
  for (auto [flag, path] : {std::pair{"--summary-json", cfg.logging.summary_json},
                            {"--save-params", cfg.logging.save_params},
                            {"--timeline", cfg.logging.timeline}}) {
    if (path.empty()) continue;
    auto parent = std::filesystem::absolute(path).parent_path();
    if (!std::filesystem::is_directory(parent)) {
      throw std::invalid_argument(std::string(flag) + ": cannot write '" + path + "': folder '" +
                                  parent.string() + "' does not exist");
    }
  }
}

// Every rank holds the whole dataset: slices change every iteration.
void Trainer::load_data_and_model() {
  train_ = std::make_unique<Dataset>(cfg_.data.path, "train", cfg_.data.memory_mb << 20);
  test_ = std::make_unique<Dataset>(cfg_.data.path, "test", cfg_.data.memory_mb << 20);
  n_train_ = cfg_.data.train_subset > 0 ? std::min(cfg_.data.train_subset, train_->size()) : train_->size();
  n_test_ = cfg_.data.test_subset > 0 ? std::min(cfg_.data.test_subset, test_->size()) : test_->size();
  if (cfg_.global_batch > n_train_) {
    throw std::invalid_argument("--global-batch " + std::to_string(cfg_.global_batch) + " exceeds the " +
                                std::to_string(n_train_) + " training samples of '" + cfg_.data.path + "'");
  }
  models::ModelConfig mc;
  mc.kind = cfg_.model;
  mc.input = train_->shape();
  mc.classes = train_->classes();
  mc.hidden = cfg_.hidden;
  mc.device = cfg_.device;
  // Most samples this rank may take: the emulated cap, and on a GPU what fits in 80% of its free memory.
  my_cap_ = std::numeric_limits<int64_t>::max();
  if (cfg_.device == Device::kCuda) {
#ifdef LBBSP_WITH_CUDA
    models::select_cuda_device(comm_.local_rank());
    my_cap_ = static_cast<int64_t>(models::cuda_free_bytes() * 0.8 / models::per_sample_bytes(mc));
#else
    throw std::invalid_argument(
        "--device cuda: lbbsp was built without CUDA (configure with -DLBBSP_WITH_CUDA=ON "
        "on a machine with nvcc)");
#endif
  }
  model_ = models::make_model(mc);
  params_.resize(model_->num_params());
  model_->init_params(params_.data(), cfg_.seed);
  sgd_ = std::make_unique<models::Sgd>(params_.size(), cfg_.optimizer.momentum, cfg_.optimizer.weight_decay);

  X_ = cfg_.global_batch;
  per_epoch_ = n_train_ / X_;  // the last partial batch of an epoch is dropped
  total_ = per_epoch_ * cfg_.epochs;
  if (cfg_.max_iterations > 0) total_ = std::min(total_, cfg_.max_iterations);
  schedule_ = std::make_unique<models::LrSchedule>(models::parse_lr_schedule(
      cfg_.optimizer.lr_schedule, cfg_.optimizer.lr, cfg_.optimizer.warmup_iterations, total_));
  optimizer_ = optimizer_record(*schedule_, cfg_.optimizer.momentum, cfg_.optimizer.weight_decay);
  // What a checkpoint must match to be resumed.
  ckpt_id_ = {cfg_.model,
              static_cast<int64_t>(params_.size()),
              X_,
              n_train_,
              {mc.input.channels, mc.input.height, mc.input.width},
              mc.classes,
              cfg_.seed};
}

// Rank 0's balancer behind the BatchSizeManager, and the first batch vector on every rank.
bool Trainer::make_balancer() {
  conditions_ = std::make_unique<RankConditions>(cfg_.emulation.straggle, R_, me_, cfg_.seed);
  caps_ = comm_.allgather(std::min(my_cap_, conditions_->mem_cap()));
  balancer::BalancerConfig bc;
  bc.name = cfg_.balancing.balancer;
  bc.predictor = cfg_.balancing.predictor;
  bc.workers = R_;
  bc.global_batch = X_;
  bc.min_batch = cfg_.balancing.min_batch;
  bc.num_exo = static_cast<int>(balancer::kRankExo.size());  // cpu_avail, mem_avail, load (the slot's order)
  bc.capacity_exo =
      balancer::kRankCapacityExo;  // cpu_avail: the share of this rank's CPUs left by co-tenants
  if (*std::min_element(caps_.begin(), caps_.end()) < std::numeric_limits<int64_t>::max()) bc.mem_cap = caps_;
  bc.seed = cfg_.seed;
  batch_.assign(R_, 0);
  std::string setup_error;
  if (root_) {
    try {
      manager_ = std::make_unique<BatchSizeManager>(bc, cfg_.balancing.lag);
      batch_ = manager_->initial();
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
  }
  comm_.bcast(&setup_error);
  if (!setup_error.empty()) {
    if (root_) throw std::invalid_argument(setup_error);
    comm_.barrier();  // rank 0 aborts the job with the message
    return false;
  }
  comm_.bcast(batch_.data(), R_);
  pipeline_ = std::make_unique<BatchPipeline>(cfg_.balancing.lag, manager_.get());
  return true;
}

void Trainer::make_run_log() {
  if (!root_ || (cfg_.logging.log_dir.empty() && cfg_.logging.timeline.empty())) return;
  RunLogConfig lc;
  lc.log_dir = cfg_.logging.log_dir;
  lc.csv = cfg_.logging.csv;
  lc.attrs = {{"model", cfg_.model},
              {"balancer", cfg_.balancing.balancer},
              {"predictor", cfg_.balancing.predictor},
              {"straggle", cfg_.emulation.straggle},
              {"ranks", std::to_string(R_)},
              {"global_batch", std::to_string(X_)}};
  lc.timeline = cfg_.logging.timeline;
  lc.timeline_window = parse_timeline_window(cfg_.logging.timeline_iterations);
  lc.ranks = R_;
  run_log_ = std::make_unique<RunLog>(lc);
}

void Trainer::print_banner() const {
  if (!root_ || cfg_.logging.quiet) return;
  std::printf(
      "lbbsp: %s on %s (%lld train / %lld test samples, %zu parameters), %d rank(s) x %d thread(s), "
      "global batch %lld, balancer %s%s, straggle %s\n",
      model_->name().c_str(), cfg_.data.path.c_str(), static_cast<long long>(n_train_),
      static_cast<long long>(n_test_), params_.size(), R_, cfg_.threads, static_cast<long long>(X_),
      cfg_.balancing.balancer.c_str(),
      cfg_.balancing.balancer == "lbbsp-cpu" ? ("/" + cfg_.balancing.predictor).c_str() : "",
      cfg_.emulation.straggle.c_str());
  std::fflush(stdout);
}

void Trainer::allocate() {
  buf_ = std::make_unique<ReductionBuffer>(params_.size(), R_);
  stats_.predicted.assign(R_, 0.0);
  conditions_->start();
  watchdog_ = std::make_unique<Watchdog>(me_, cfg_.iteration_timeout_s);
  tty_ = root_ && stdout_is_tty() && !cfg_.logging.quiet;
}

// Rank 0 reads and verifies; everybody gets the parameters, velocity, position and statistics.
bool Trainer::resume() {
  TrainState st;
  std::string used, meta;
  if (!load_checkpoint(&st, &used, &meta)) return false;
  const size_t P = params_.size();
  if (!root_) st.params.resize(P), st.velocity.resize(P);
  comm_.bcast(st.params.data(), P);
  comm_.bcast(st.velocity.data(), P);
  comm_.bcast(&meta);
  params_ = st.params;
  sgd_->velocity() = st.velocity;
  const auto m = nlohmann::json::parse(meta);
  start_it_ = m.at("iteration").get<int64_t>();
  stats_ = RunStats::from_json(m.at("stats"));
  const std::vector<double> predicted = std::move(stats_.predicted);
  stats_.predicted.assign(R_, 0.0);  // kept only with the balancer state (restore_balancer)
  if (root_) restore_balancer(st, used, m.at("ranks").get<int>() == R_, predicted);
  comm_.bcast(batch_.data(), R_);
  return true;
}

bool Trainer::load_checkpoint(TrainState* st, std::string* used, std::string* meta) {
  std::string error;
  if (root_) {
    try {
      std::vector<std::string> skipped;
      *st = load_newest_checkpoint(cfg_.checkpoint.dir, ckpt_id_, used, &skipped);
      for (const auto& sk : skipped)
        std::fprintf(stderr, "lbbsp: warning: skipping %s; using the older '%s'\n", sk.c_str(),
                     used->c_str());
      check_optimizer(*st, *used);
      *meta = nlohmann::json{{"iteration", st->iteration}, {"ranks", st->ranks}, {"stats", st->stats}}.dump();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm_.bcast(&error);
  if (error.empty()) return true;
  if (root_) throw std::invalid_argument(error);
  comm_.barrier();  // rank 0 aborts the job with the message
  return false;
}

// Rank 0: a checkpoint whose optimiser differs from this run's is refused (the run would continue on another
// learning-rate curve without a word), or with --allow-optimizer-change each difference is printed.
void Trainer::check_optimizer(const TrainState& st, const std::string& used) const {
  const auto changes = optimizer_changes(st.optimizer, optimizer_);
  if (changes.empty()) return;
  std::string list;
  for (const auto& c : changes) list += (list.empty() ? "" : "; ") + c;
  if (!cfg_.checkpoint.allow_optimizer_change)
    throw std::invalid_argument(
        "--resume: checkpoint '" + used + "' was written with another optimiser: " + list +
        ". Resume with the flags it was written with, or pass --allow-optimizer-change "
        "to continue on this run's settings");
  for (const auto& c : changes)
    std::fprintf(stderr, "lbbsp: warning: --allow-optimizer-change: %s\n", c.c_str());
}

// The balancer continues where it was when the rank count, balancer and lag are the same; otherwise it
// starts afresh from its initial batch vector (the parameters and data position still continue).
void Trainer::restore_balancer(const TrainState& st, const std::string& used, bool same_split,
                               const std::vector<double>& predicted) {
  std::string note;
  if (same_split && st.balancer == cfg_.balancing.balancer && st.lag == cfg_.balancing.lag) {
    try {
      manager_->balancer().load_state(st.balancer_state);
      batch_ = st.batch;
      manager_->check(batch_);
      manager_->restore_pending(st.pending);  // the lag's decisions made ahead
      if (static_cast<int>(predicted.size()) == R_) stats_.predicted = predicted;
    } catch (const std::exception& e) {
      throw std::invalid_argument("--resume: checkpoint '" + used + "': balancer state: " + e.what());
    }
  } else {
    note = " (balancer restarted: the checkpoint was written by " + std::to_string(st.ranks) +
           " rank(s), balancer " + st.balancer + ", lag " + std::to_string(st.lag) + ")";
  }
  if (!cfg_.logging.quiet)
    std::printf("resumed from %s at iteration %lld%s\n", used.c_str(), static_cast<long long>(start_it_),
                note.c_str());
  std::fflush(stdout);
}

void Trainer::make_engine() {
  StepEngineConfig ec;
  ec.device = cfg_.device;
  ec.gpu_params = cfg_.gpu_params;
  ec.gpu_allreduce = cfg_.gpu_allreduce;
  ec.host_allreduce = cfg_.allreduce;
  ec.momentum = cfg_.optimizer.momentum;
  ec.weight_decay = cfg_.optimizer.weight_decay;
#ifdef LBBSP_WITH_CUDA
  if (cfg_.device == Device::kCuda) ec.resident = models::device_resident(*model_);
#endif
  ec.mpi_cuda_aware = comm_.cuda_aware();
  ec.mpi_cuda_support = comm_.cuda_support();
  engine_ = std::make_unique<StepEngine>(ec, *model_, params_, *sgd_, buf_->extra(), comm_);
  if (root_ && !cfg_.logging.quiet && cfg_.device == Device::kCuda) {
    std::printf("gpu: parameters and gradient reduction %s\n", engine_->mode().c_str());
    std::fflush(stdout);
  }
}

// The hooks in the order of their side effects at the end of an iteration: telemetry rows and timeline,
// evaluation (and its line), checkpoint, progress line, stop message; at the end the logs' flush, then the
// summary. The `after` lists are the orders that matter.
void Trainer::make_hooks() {
  hooks_ = Hooks(watchdog_.get());
  hooks_.add(make_fault_hook(fault_, me_, *watchdog_));
  if (run_log_) hooks_.add(make_telemetry_hook(*run_log_, R_));
  hooks_.add(make_evaluation_hook({.cfg = &cfg_,
                                   .engine = engine_.get(),
                                   .test = test_.get(),
                                   .test_rows = n_test_,
                                   .comm = &comm_,
                                   .watchdog = watchdog_.get(),
                                   .stats = &stats_,
                                   .per_epoch = per_epoch_,
                                   .total = total_,
                                   .tty = tty_}));
  if (!cfg_.checkpoint.dir.empty())  // after the evaluation: the statistics it saves hold this one's accuracy
    hooks_.add(make_checkpoint_hook(cfg_, *watchdog_, root_, ckpt_id_,
                                    [this](int64_t next) { return snapshot(next); }),
               {"evaluation"});
  if (!root_) return;
  if (!cfg_.logging.quiet)
    hooks_.add(make_progress_hook({.cfg = &cfg_, .ranks = R_, .total = total_, .tty = tty_}));
  hooks_.add(make_stop_message_hook(cfg_, total_), {"checkpoint"});  // it names the checkpoint written
  // After the telemetry's flush (the run log's I/O time) and the final evaluation (the test accuracy).
  hooks_.add(make_summary_hook({.cfg = &cfg_,
                                .model = model_.get(),
                                .params = &params_,
                                .ranks = R_,
                                .per_epoch = per_epoch_,
                                .step_mode = engine_->mode(),
                                .log = run_log_.get()}),
             {"telemetry", "evaluation"});
}

}  // namespace lbbsp::runtime
