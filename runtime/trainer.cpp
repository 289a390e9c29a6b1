#include "runtime/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "models/model.hpp"
#ifdef LBBSP_WITH_CUDA
#include "models/cuda/cuda_models.hpp"
#endif
#include "models/optimizer.hpp"
#include "runtime/batch_manager.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/dataset.hpp"
#include "runtime/h5.hpp"
#include "runtime/monitor.hpp"
#include "runtime/step_engine.hpp"
#include "runtime/stop_signal.hpp"
#include "runtime/straggler.hpp"
#include "runtime/telemetry.hpp"
#include "runtime/topology.hpp"

namespace lbbsp::runtime {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Per-rank fields riding in the gradient allreduce buffer (rank i writes only its own slot; the sum delivers
// every slot to every rank without an extra message).
enum Slot { kCompute = 0, kCpu, kMem, kLoad, kCapacity, kRealCompute, kStop, kSlotFields };

struct Fault {
  int rank = -1;
  int64_t iteration = -1;
  std::string kind;
};

Fault parse_fault(const std::string& spec, int ranks) {
  Fault f;
  if (spec.empty()) return f;
  auto a = spec.find(':'), b = spec.rfind(':');
  if (a == std::string::npos || a == b) {
    throw std::invalid_argument("--inject-fault '" + spec +
                                "': expected RANK:ITERATION:KIND (KIND = throw, abort, nan, hang)");
  }
  try {
    f.rank = std::stoi(spec.substr(0, a));
    f.iteration = std::stoll(spec.substr(a + 1, b - a - 1));
  } catch (const std::exception&) {
    throw std::invalid_argument("--inject-fault '" + spec + "': RANK and ITERATION must be integers");
  }
  f.kind = spec.substr(b + 1);
  if (f.kind != "throw" && f.kind != "abort" && f.kind != "nan" && f.kind != "hang") {
    throw std::invalid_argument("--inject-fault '" + spec + "': KIND must be throw, abort, nan or hang");
  }
  if (f.rank < 0 || f.rank >= ranks) {
    throw std::invalid_argument("--inject-fault '" + spec + "': rank " + std::to_string(f.rank) +
                                " is not in 0.." + std::to_string(ranks - 1));
  }
  return f;
}

// Ends the job when this rank makes no progress for too long (a hung peer blocks us in the allreduce).
class Watchdog {
 public:
  Watchdog(int rank, double timeout_s) : rank_(rank), timeout_s_(timeout_s) {
    if (timeout_s_ <= 0) return;
    beat(0, "start-up");
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        double idle = std::chrono::duration<double>(Clock::now().time_since_epoch()).count() - last_.load();
        if (idle > timeout_s_ && !stop_.load()) {
          std::fprintf(
              stderr,
              "lbbsp: rank %d: error: no progress for %.0f s in iteration %lld (%s); a rank hung or died "
              "(--iteration-timeout %.0f)\n",
              rank_, idle, static_cast<long long>(iteration_.load()), phase_.load(), timeout_s_);
          std::fflush(stderr);
          _exit(3);  // the launcher sees a rank die and ends the whole job
        }
      }
    });
  }
  ~Watchdog() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void beat(int64_t iteration, const char* phase) {
    iteration_ = iteration;
    phase_ = phase;
    last_ = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  }

 private:
  int rank_;
  double timeout_s_;
  std::atomic<bool> stop_{false};
  std::atomic<double> last_{0};
  std::atomic<int64_t> iteration_{0};
  std::atomic<const char*> phase_{"start-up"};
  std::thread thread_;
};

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// Every rank evaluates a contiguous share of the test set; one allreduce sums loss and correct counts.
EvalResult evaluate(StepEngine& engine, const Dataset& test, int64_t rows, Comm& comm) {
  int64_t lo = rows * comm.rank() / comm.size(), hi = rows * (comm.rank() + 1) / comm.size();
  const int64_t chunk = 512;
  const int dim = test.shape().size();
  std::vector<float> x(chunk * dim);
  std::vector<uint8_t> y(chunk);
  std::vector<int64_t> idx(chunk);
  double sums[2] = {0, 0};
  for (int64_t s = lo; s < hi; s += chunk) {
    int64_t n = std::min(chunk, hi - s);
    std::iota(idx.begin(), idx.begin() + n, s);
    test.gather(idx.data(), n, x.data(), y.data());
    auto st = engine.evaluate(x.data(), y.data(), static_cast<int>(n));
    sums[0] += st.loss_sum;
    sums[1] += static_cast<double>(st.correct);
  }
  comm.allreduce_sum(sums, 2);
  return {rows ? sums[0] / rows : 0.0, rows ? sums[1] / rows : 0.0};
}

void save_params(const std::string& path, const models::Model& model, const std::vector<float>& params,
                 const TrainConfig& cfg, int64_t iterations) {
  auto tmp = path + ".tmp";
  {
    h5::Handle f = h5::create_file(tmp);
    h5::Handle g = h5::ensure_group(f, "/params");
    for (const auto& t : model.tensors()) {
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      h5::write_f32(g, t.name, params.data() + t.offset, dims);
    }
    h5::Handle root(H5Gopen2(f, "/", H5P_DEFAULT));
    h5::write_string_attr(root, "model", model.name());
    h5::write_i64_attr(root, "iterations", iterations);
    h5::write_i64_attr(root, "global_batch", cfg.global_batch);
    h5::write_i64_attr(root, "seed", static_cast<int64_t>(cfg.seed));
  }
  std::filesystem::rename(tmp, path);
}

// mpirun hands ranks a pseudo-terminal even when its own output goes to a file: only a direct run gets the
// live bar.
bool stdout_is_tty() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID"})
    if (std::getenv(v)) return false;
  return isatty(STDOUT_FILENO) == 1;
}

// JSON has no NaN: the checkpointed statistics store it as null.
nlohmann::json num(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}
double num(const nlohmann::json& j) {
  return j.is_null() ? NAN : j.get<double>();
}

std::string format_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  int h = static_cast<int>(s / 3600), m = static_cast<int>(std::fmod(s, 3600) / 60),
      sec = static_cast<int>(std::fmod(s, 60));
  if (h)
    std::snprintf(buf, sizeof buf, "%dh%02dm", h, m);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", m, sec);
  return buf;
}

}  // namespace

int run_training(const TrainConfig& cfg, Comm& comm) {
  const int R = comm.size(), me = comm.rank();
  const bool root = comm.is_root();
  const Fault fault = parse_fault(cfg.inject_fault, R);
  if (cfg.global_batch < 1) throw std::invalid_argument("--global-batch must be >= 1");
  check_float_exact(cfg.global_batch, "--global-batch");  // counts and lag-1 batch sizes ride in float slots
  if (cfg.epochs < 1) throw std::invalid_argument("--epochs must be >= 1");
  if (cfg.threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (cfg.lag != 0 && cfg.lag != 1) throw std::invalid_argument("--lag must be 0 or 1");
  if (!(cfg.lr > 0) || !std::isfinite(cfg.lr)) throw std::invalid_argument("--lr must be a positive number");
  if (cfg.checkpoint_every < 0) throw std::invalid_argument("--checkpoint-every must be >= 1");
  if (cfg.checkpoint_keep < 1) throw std::invalid_argument("--checkpoint-keep must be >= 1");
  const TimelineWindow timeline_window = parse_timeline_window(cfg.timeline_iterations);
  if (!cfg.timeline_iterations.empty() && cfg.timeline.empty())
    throw std::invalid_argument("--timeline-iterations needs --timeline FILE");
  if ((cfg.resume || cfg.checkpoint_every > 0) && cfg.checkpoint_dir.empty())
    throw std::invalid_argument(std::string(cfg.resume ? "--resume" : "--checkpoint-every") +
                                " needs --checkpoint-dir DIR");
  if (root && !cfg.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.checkpoint_dir, ec);
    if (!std::filesystem::is_directory(cfg.checkpoint_dir))
      throw std::invalid_argument("--checkpoint-dir: cannot create folder '" + cfg.checkpoint_dir + "'" +
                                  (ec ? ": " + ec.message() : ""));
  }

  // Output paths are checked before training, not discovered unwritable at the end of a long run. The log
  // folder is made first, so that outputs inside it (--summary-json DIR/summary.json) are fine.
  if (!cfg.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.log_dir, ec);
    if (ec) throw std::invalid_argument("--log-dir: cannot create '" + cfg.log_dir + "': " + ec.message());
    if (root && !cfg.config_toml.empty()) {
      const auto path = std::filesystem::path(cfg.log_dir) / "config.toml";
      std::ofstream out(path);
      out << cfg.config_toml;
      if (!out.flush()) throw std::invalid_argument("--log-dir: cannot write '" + path.string() + "'");
    }
  }
  for (auto [flag, path] : {std::pair{"--summary-json", cfg.summary_json},
                            {"--save-params", cfg.save_params},
                            {"--timeline", cfg.timeline}}) {
    if (path.empty()) continue;
    auto parent = std::filesystem::absolute(path).parent_path();
    if (!std::filesystem::is_directory(parent)) {
      throw std::invalid_argument(std::string(flag) + ": cannot write '" + path + "': folder '" +
                                  parent.string() + "' does not exist");
    }
  }
  if (cfg.bind == Binding::kCore) bind_to_cores(comm.local_rank() * cfg.threads, cfg.threads);
  models::set_num_threads(cfg.threads);

  // Data and model (every rank holds the whole dataset: slices change every iteration).
  Dataset train(cfg.data, "train", cfg.data_memory_mb << 20);
  Dataset test(cfg.data, "test", cfg.data_memory_mb << 20);
  const int64_t n_train = cfg.train_subset > 0 ? std::min(cfg.train_subset, train.size()) : train.size();
  const int64_t n_test = cfg.test_subset > 0 ? std::min(cfg.test_subset, test.size()) : test.size();
  if (cfg.global_batch > n_train) {
    throw std::invalid_argument("--global-batch " + std::to_string(cfg.global_batch) + " exceeds the " +
                                std::to_string(n_train) + " training samples of '" + cfg.data + "'");
  }
  models::ModelConfig mc;
  mc.kind = cfg.model;
  mc.input = train.shape();
  mc.classes = train.classes();
  mc.hidden = cfg.hidden;
  mc.device = cfg.device;
  // Most samples this rank may take: the emulated cap, and on a GPU what fits in 80% of its free memory.
  int64_t my_cap = std::numeric_limits<int64_t>::max();
  if (cfg.device == Device::kCuda) {
#ifdef LBBSP_WITH_CUDA
    models::select_cuda_device(comm.local_rank());
    my_cap = static_cast<int64_t>(models::cuda_free_bytes() * 0.8 / models::per_sample_bytes(mc));
#else
    throw std::invalid_argument(
        "--device cuda: lbbsp was built without CUDA (configure with -DLBBSP_WITH_CUDA=ON "
        "on a machine with nvcc)");
#endif
  }
  auto model = models::make_model(mc);
  const size_t P = model->num_params();
  std::vector<float> params(P);
  model->init_params(params.data(), cfg.seed);
  models::Sgd sgd(P, cfg.momentum, cfg.weight_decay);

  const int64_t X = cfg.global_batch;
  const int64_t per_epoch = n_train / X;  // the last partial batch of an epoch is dropped
  int64_t total = per_epoch * cfg.epochs;
  if (cfg.max_iterations > 0) total = std::min(total, cfg.max_iterations);
  auto schedule = models::parse_lr_schedule(cfg.lr_schedule, cfg.lr, cfg.warmup_iterations, total);

  Straggler straggler(cfg.straggle, R, cfg.seed);
  const std::vector<int64_t> caps = comm.allgather(std::min(my_cap, straggler.mem_cap(me)));
  constexpr int kExo = 3;  // cpu_avail, mem_avail, load

  balancer::BalancerConfig bc;
  bc.name = cfg.balancer;
  bc.predictor = cfg.predictor;
  bc.workers = R;
  bc.global_batch = X;
  bc.min_batch = cfg.min_batch;
  bc.num_exo = kExo;
  bc.capacity_exo = 0;  // cpu_avail: the share of this rank's CPUs left by co-tenants
  if (*std::min_element(caps.begin(), caps.end()) < std::numeric_limits<int64_t>::max()) bc.mem_cap = caps;
  bc.seed = cfg.seed;
  std::unique_ptr<BatchSizeManager> manager;
  std::vector<int64_t> batch(R);
  std::string setup_error;
  if (root) {
    try {
      manager = std::make_unique<BatchSizeManager>(bc, cfg.lag);
      batch = manager->initial();
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
  }
  comm.bcast(&setup_error);
  if (!setup_error.empty()) {
    if (root) throw std::invalid_argument(setup_error);
    comm.barrier();  // rank 0 aborts the job with the message
    return 1;
  }
  comm.bcast(batch.data(), R);

  std::unique_ptr<RunLog> run_log;
  if (root && (!cfg.log_dir.empty() || !cfg.timeline.empty())) {
    RunLogConfig lc;
    lc.log_dir = cfg.log_dir;
    lc.csv = cfg.csv;
    lc.attrs = {{"model", cfg.model},         {"balancer", cfg.balancer},
                {"predictor", cfg.predictor}, {"straggle", cfg.straggle},
                {"ranks", std::to_string(R)}, {"global_batch", std::to_string(X)}};
    lc.timeline = cfg.timeline;
    lc.timeline_window = timeline_window;
    lc.ranks = R;
    run_log = std::make_unique<RunLog>(lc);
  }
  if (root && !cfg.quiet) {
    std::printf(
        "lbbsp: %s on %s (%lld train / %lld test samples, %zu parameters), %d rank(s) x %d thread(s), "
        "global batch %lld, balancer %s%s, straggle %s\n",
        model->name().c_str(), cfg.data.c_str(), static_cast<long long>(n_train),
        static_cast<long long>(n_test), P, R, cfg.threads, static_cast<long long>(X), cfg.balancer.c_str(),
        cfg.balancer == "lbbsp-cpu" ? ("/" + cfg.predictor).c_str() : "", cfg.straggle.c_str());
    std::fflush(stdout);
  }

  // Buffer: [gradient P | loss, correct | R per-rank slots | R batch sizes for lag 1].
  const size_t off_stats = P, off_slots = P + 2, off_next = off_slots + static_cast<size_t>(R) * kSlotFields;
  const size_t buf_len = off_next + static_cast<size_t>(R);
  std::vector<float> buf(buf_len);
  const int dim = train.shape().size();
  std::vector<float> x;
  std::vector<uint8_t> y;
  std::vector<int64_t> perm, rows;
  std::vector<double> predicted(R, 0.0);
  straggler.start_cotenant(me);
  ResourceMonitor monitor;  // after start_cotenant: it measures the CPUs this rank is pinned to
  Watchdog watchdog(me, cfg.iteration_timeout_s);

  // Statistics for progress and the summary.
  double train_time = 0, coord_time = 0, wait_rank_time = 0, last_iter_s = 0;
  double io_before = 0;  // rank 0's logging time before a resume
  double epoch_loss = 0, last_train_loss = NAN;
  int64_t epoch_samples = 0, epoch_correct = 0;
  double last_test_acc = NAN, last_test_loss = NAN, time_to_target = -1;
  nlohmann::json curve = nlohmann::json::array();
  const bool tty = root && stdout_is_tty() && !cfg.quiet;
  const int64_t progress_every =
      cfg.progress_every > 0 ? cfg.progress_every : std::max<int64_t>(1, total / 20);

  // Checkpoints: what must match to resume, and the state to save / restore.
  CheckpointIdentity ckpt_id;
  ckpt_id.model = cfg.model;
  ckpt_id.num_params = static_cast<int64_t>(P);
  ckpt_id.global_batch = X;
  ckpt_id.train_samples = n_train;
  ckpt_id.input_shape = {mc.input.channels, mc.input.height, mc.input.width};
  ckpt_id.classes = mc.classes;
  ckpt_id.seed = cfg.seed;
  auto stats_json = [&] {
    return nlohmann::json{{"train_time", train_time},
                          {"coord_time", coord_time},
                          {"wait_rank_time", wait_rank_time},
                          {"last_iter_s", last_iter_s},
                          {"epoch_loss", num(epoch_loss)},
                          {"last_train_loss", num(last_train_loss)},
                          {"epoch_samples", epoch_samples},
                          {"epoch_correct", epoch_correct},
                          {"last_test_acc", num(last_test_acc)},
                          {"last_test_loss", num(last_test_loss)},
                          {"time_to_target", time_to_target},
                          {"curve", curve},
                          {"predicted", predicted},
                          {"io_time", io_before + (run_log ? run_log->io_s() : 0.0)}};
  };
  int64_t start_it = 0;
  if (cfg.resume) {
    // Rank 0 reads and verifies; everybody gets the parameters, velocity, position and statistics.
    std::string error, used, meta;
    TrainState st;
    if (root) {
      try {
        std::vector<std::string> skipped;
        st = load_newest_checkpoint(cfg.checkpoint_dir, ckpt_id, &used, &skipped);
        for (const auto& sk : skipped)
          std::fprintf(stderr, "lbbsp: warning: skipping %s; using the older '%s'\n", sk.c_str(),
                       used.c_str());
        meta = nlohmann::json{{"iteration", st.iteration}, {"ranks", st.ranks}, {"stats", st.stats}}.dump();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    comm.bcast(&error);
    if (!error.empty()) {
      if (root) throw std::invalid_argument(error);
      comm.barrier();  // rank 0 aborts the job with the message
      return 1;
    }
    if (!root) st.params.resize(P), st.velocity.resize(P);
    comm.bcast(st.params.data(), P);
    comm.bcast(st.velocity.data(), P);
    comm.bcast(&meta);
    params = st.params;
    sgd.velocity() = st.velocity;
    const auto m = nlohmann::json::parse(meta);
    start_it = m.at("iteration").get<int64_t>();
    const auto& j = m.at("stats");
    train_time = j.at("train_time");
    coord_time = j.at("coord_time");
    wait_rank_time = j.at("wait_rank_time");
    last_iter_s = j.at("last_iter_s");
    epoch_loss = num(j.at("epoch_loss"));
    last_train_loss = num(j.at("last_train_loss"));
    epoch_samples = j.at("epoch_samples");
    epoch_correct = j.at("epoch_correct");
    last_test_acc = num(j.at("last_test_acc"));
    last_test_loss = num(j.at("last_test_loss"));
    time_to_target = j.at("time_to_target");
    curve = j.at("curve");
    io_before = j.value("io_time", 0.0);  // absent in checkpoints of older versions
    // The balancer continues where it was when the rank count, balancer and lag are the same; otherwise it
    // starts afresh from its initial batch vector (the parameters and data position still continue).
    const bool same_split = m.at("ranks").get<int>() == R;
    std::string note;
    if (root) {
      if (same_split && st.balancer == cfg.balancer && st.lag == cfg.lag) {
        try {
          manager->balancer().load_state(st.balancer_state);
          batch = st.batch;
          manager->check(batch);
          if (!st.pending.empty()) manager->restore_pending(st.pending);
          auto p = j.at("predicted").get<std::vector<double>>();
          if (static_cast<int>(p.size()) == R) predicted = p;
        } catch (const std::exception& e) {
          throw std::invalid_argument("--resume: checkpoint '" + used + "': balancer state: " + e.what());
        }
      } else {
        note = " (balancer restarted: the checkpoint was written by " + std::to_string(st.ranks) +
               " rank(s), balancer " + st.balancer + ", lag " + std::to_string(st.lag) + ")";
      }
      if (!cfg.quiet)
        std::printf("resumed from %s at iteration %lld%s\n", used.c_str(), static_cast<long long>(start_it),
                    note.c_str());
      std::fflush(stdout);
    }
    comm.bcast(batch.data(), R);
  }
  StepEngineConfig ec;
  ec.device = cfg.device;
  ec.gpu_params = cfg.gpu_params;
  ec.gpu_allreduce = cfg.gpu_allreduce;
  ec.host_allreduce = cfg.allreduce;
  ec.momentum = cfg.momentum;
  ec.weight_decay = cfg.weight_decay;
#ifdef LBBSP_WITH_CUDA
  if (cfg.device == Device::kCuda) ec.resident = models::device_resident(*model);
#endif
  ec.mpi_cuda_aware = comm.cuda_aware();
  ec.mpi_cuda_support = comm.cuda_support();
  StepEngine engine(ec, *model, params, sgd, buf_len - P, comm);
  if (root && !cfg.quiet && cfg.device == Device::kCuda) {
    std::printf("gpu: parameters and gradient reduction %s\n", engine.mode().c_str());
    std::fflush(stdout);
  }
  auto save_checkpoint = [&](int64_t next_it) {
    // Rank 0 only. A failed write (disk full, ...) is reported and training continues: the older checkpoints
    // are untouched, since a new one only appears by rename after it is complete and synced.
    TrainState st;
    st.iteration = next_it;
    st.ranks = R;
    st.lag = cfg.lag;
    st.balancer = cfg.balancer;
    engine.pull_to_host();
    st.params = params;
    st.velocity = sgd.velocity();
    st.batch = batch;
    if (cfg.lag == 1) st.pending = manager->settle();  // the decision in flight belongs to the state
    st.balancer_state = manager->balancer().save_state();
    st.stats = stats_json();
    try {
      write_checkpoint(cfg.checkpoint_dir, ckpt_id, st, cfg.checkpoint_keep);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lbbsp: warning: checkpoint at iteration %lld not written: %s\n",
                   static_cast<long long>(next_it), e.what());
    }
  };

  StopSignals stop_signals;
  // The first stop signal any rank received: the same on every rank (each rank's rides in the allreduce).
  int stop_sig = 0;
  comm.barrier();
  const auto t0 =
      Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(train_time));
  auto last_bar = t0;
  if (run_log) run_log->set_origin(t0);
  int64_t it = start_it;
  for (; it < total; ++it) {
    const int64_t epoch = it / per_epoch, pos = it % per_epoch;
    if (pos == 0 || perm.empty()) perm = epoch_permutation(n_train, cfg.seed, epoch);
    const auto t_iter = Clock::now();
    const double elapsed = seconds_since(t0);
    const double replay_now = straggler.replay_clock(elapsed, it);  // emulation's clock for this iteration
    watchdog.beat(it, "compute");

    // My slice of the global batch: positions [pos*X + b_0 + ... + b_{me-1}, + b_me) of the permutation.
    const int64_t offset = balancer::slice_offset(batch, me);
    const int64_t n = batch[me];
    rows.assign(perm.begin() + pos * X + offset, perm.begin() + pos * X + offset + n);
    x.resize(static_cast<size_t>(n) * dim);
    y.resize(n);
    std::fill(buf.begin(), buf.end(), 0.0f);

    const auto t_compute = Clock::now();
    if (it == fault.iteration && me == fault.rank) {
      if (fault.kind == "throw")
        throw std::runtime_error("injected fault (throw) at iteration " + std::to_string(it));
      if (fault.kind == "abort") std::abort();
      if (fault.kind == "hang") {
        watchdog.beat(it, "injected hang");
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
    train.gather(rows.data(), n, x.data(), y.data());
    auto stats = engine.forward_backward(x.data(), y.data(), static_cast<int>(n), buf.data());
    if (it == fault.iteration && me == fault.rank && fault.kind == "nan") stats.loss_sum = NAN;
    const double real_s = seconds_since(t_compute);
    const double target_s = straggler.emulated_seconds(me, replay_now, n, real_s);
    // A modelled cost curve stands for a dedicated machine, which starts when the step does: when this node's
    // ranks left the last one, not when an OS with more ranks than cores got round to this rank.
    const auto t_start = straggler.gpu_profile() ? engine.released_at().value_or(t_compute) : t_compute;
    Straggler::stretch_to(seconds_since(t_start), target_s);
    const double compute_s = seconds_since(t_start);
    const auto metrics =
        straggler.metrics(me, straggler.replay_clock(seconds_since(t0), it + 1), monitor.sample());

    buf[off_stats] = static_cast<float>(stats.loss_sum);
    buf[off_stats + 1] = static_cast<float>(stats.correct);
    float* slot = buf.data() + off_slots + static_cast<size_t>(me) * kSlotFields;
    slot[kCompute] = static_cast<float>(compute_s);
    slot[kCpu] = static_cast<float>(metrics.cpu_avail);
    slot[kMem] = static_cast<float>(metrics.mem_avail);
    slot[kLoad] = static_cast<float>(metrics.load);
    slot[kCapacity] = static_cast<float>(straggler.capacity(me, replay_now));
    slot[kRealCompute] = static_cast<float>(real_s);
    slot[kStop] = static_cast<float>(stop_signals.received());

    double coord_s = 0;
    if (root && cfg.lag == 1) {
      // The decision for this iteration + 1 ran on a thread while we computed; waiting for it is
      // coordination.
      auto t = Clock::now();
      std::vector<int64_t> next = manager->pending() ? manager->collect() : batch;
      for (int r = 0; r < R; ++r) buf[off_next + r] = static_cast<float>(next[r]);
      coord_s += seconds_since(t);
    }

    watchdog.beat(it, "allreduce");
    const auto t_ar = Clock::now();
    engine.allreduce(buf.data(), buf_len);
    const double ar_s = seconds_since(t_ar);

    const double loss_sum = buf[off_stats], correct = buf[off_stats + 1];
    for (int r = 0; r < R && !stop_sig; ++r)
      stop_sig = static_cast<int>(buf[off_slots + r * kSlotFields + kStop]);
    if (!std::isfinite(loss_sum)) {
      throw std::runtime_error("training loss is " + std::string(std::isnan(loss_sum) ? "NaN" : "Inf") +
                               " at iteration " + std::to_string(it) + " (epoch " + std::to_string(epoch) +
                               "); lower --lr or check the data");
    }
    epoch_loss += loss_sum;
    epoch_correct += static_cast<int64_t>(correct);
    epoch_samples += X;

    // Rank 0: everybody's report -> next batch vector.
    watchdog.beat(it, "balancer");
    const auto t_coord = Clock::now();
    double max_compute = 0;
    for (int r = 0; r < R; ++r)
      max_compute = std::max<double>(max_compute, buf[off_slots + r * kSlotFields + kCompute]);
    std::vector<int64_t> next_batch(R);
    if (root) {
      balancer::IterationReport report;
      report.iteration = it;
      report.workers.resize(R);
      // Lag 0 decides for the next iteration (starts now); lag 1 for the one after (starts one iteration
      // later).
      const double next_start =
          straggler.replay_clock(seconds_since(t0) + (cfg.lag == 1 ? last_iter_s : 0.0), it + 1 + cfg.lag);
      for (int r = 0; r < R; ++r) {
        const float* s = buf.data() + off_slots + r * kSlotFields;
        auto& w = report.workers[r];
        w.batch = batch[r];
        w.compute_s = s[kCompute];
        w.exo = {s[kCpu], s[kMem], s[kLoad]};
        w.exo_next = w.exo;  // measured at the barrier just before the coming iteration
        w.mem_cap = caps[r];
        w.capacity = s[kCapacity];
        w.capacity_next = straggler.capacity(r, next_start);
        w.curve_next = straggler.curve(r, next_start);
      }
      if (cfg.lag == 0) {
        next_batch = manager->decide(report);
      } else {
        for (int r = 0; r < R; ++r) next_batch[r] = static_cast<int64_t>(buf[off_next + r]);
        manager->decide_async(std::move(report));
      }
    } else if (cfg.lag == 1) {
      for (int r = 0; r < R; ++r) next_batch[r] = static_cast<int64_t>(buf[off_next + r]);
    }
    if (cfg.lag == 0) comm.bcast(next_batch.data(), R);
    coord_s += seconds_since(t_coord);
    // Last, so that in host/node-shared mode its barrier is the moment the node's ranks start the next step.
    engine.sgd_step(buf.data(), X, schedule.lr_at(it));
    // The metric slots and lag-1 batch slots ride in the allreduce: charge their share of it as coordination.
    coord_s += ar_s * static_cast<double>(buf_len - P - 2) / static_cast<double>(buf_len);

    const double iter_s = seconds_since(t_iter);
    last_iter_s = iter_s;
    train_time += iter_s;
    coord_time += coord_s;
    double wait_sum = 0;
    for (int r = 0; r < R; ++r) wait_sum += max_compute - buf[off_slots + r * kSlotFields + kCompute];
    wait_rank_time += wait_sum;

    if (root) {
      const double ar_only = std::max(0.0, ar_s - (max_compute - compute_s));
      std::vector<IterationRecord> records(R);
      for (int r = 0; r < R; ++r) {
        const float* s = buf.data() + off_slots + r * kSlotFields;
        IterationRecord& rec = records[r];
        rec.iteration = it;
        rec.rank = r;
        rec.batch = batch[r];
        rec.compute_s = s[kCompute];
        rec.wait_s = max_compute - s[kCompute];
        rec.allreduce_s = ar_only;
        rec.balancer_s = coord_s;
        rec.predicted_speed = predicted[r];
        rec.actual_speed = s[kCompute] > 0 ? batch[r] / s[kCompute] : 0.0;
        rec.cpu_avail = s[kCpu];
        rec.mem_avail = s[kMem];
        rec.load = s[kLoad];
        rec.capacity = s[kCapacity];
      }
      if (run_log) run_log->add_iteration(std::chrono::duration<double>(t_compute - t0).count(), records);
      auto p = manager->predicted_speeds();
      // Predictions made now are for the iteration they decided (next one with lag 0, the one after with lag
      // 1).
      if (!p.empty()) predicted = p;
    }
    batch = next_batch;

    // Evaluation after each epoch (or every eval_every iterations) and at the end.
    const bool epoch_end = pos == per_epoch - 1;
    const bool eval_now =
        (cfg.eval_every > 0 ? (it + 1) % cfg.eval_every == 0 : epoch_end) || it + 1 == total;
    if (epoch_end || it + 1 == total) {
      last_train_loss = epoch_samples ? epoch_loss / epoch_samples : NAN;
    }
    if (eval_now) {
      watchdog.beat(it, "evaluation");
      auto ev = evaluate(engine, test, n_test, comm);
      last_test_acc = ev.accuracy;
      last_test_loss = ev.loss;
      if (cfg.target_accuracy > 0 && time_to_target < 0 && ev.accuracy >= cfg.target_accuracy)
        time_to_target = train_time;
      curve.push_back({{"iteration", it + 1},
                       {"epoch", static_cast<double>(it + 1) / per_epoch},
                       {"train_time_s", train_time},
                       {"test_accuracy", ev.accuracy},
                       {"test_loss", ev.loss}});
      if (root && !cfg.quiet) {
        if (tty) std::printf("\n");
        std::printf("epoch %.2f  iteration %lld/%lld  train loss %.4f  test loss %.4f  test accuracy %.4f\n",
                    static_cast<double>(it + 1) / per_epoch, static_cast<long long>(it + 1),
                    static_cast<long long>(total), epoch_samples ? epoch_loss / epoch_samples : NAN, ev.loss,
                    ev.accuracy);
        std::fflush(stdout);
      }
    }
    if (epoch_end) epoch_loss = 0, epoch_samples = 0, epoch_correct = 0;
    const bool ckpt_due = cfg.checkpoint_every > 0 && (it + 1) % cfg.checkpoint_every == 0;
    const bool stopping = stop_sig != 0 && it + 1 < total;  // on the last iteration the run is simply done
    if (!cfg.checkpoint_dir.empty() && (ckpt_due || it + 1 == total || stopping)) {
      watchdog.beat(it, "checkpoint");
      if (root) save_checkpoint(it + 1);
    }
    const bool bar_due = tty && (seconds_since(last_bar) > 0.2 || it + 1 == total);
    if (root && !cfg.quiet && (bar_due || (!tty && (it + 1) % progress_every == 0))) {
      if (tty) last_bar = Clock::now();
      const double sps = (it + 1) * X / train_time;
      const double wf = wait_rank_time / (R * train_time);
      const double eta = (total - it - 1) * train_time / (it + 1);
      if (tty) {
        int width = 30, done = static_cast<int>(width * (it + 1) / total);
        std::printf("\r[%s%s] %lld/%lld  %.0f samples/s  wait %.1f%%  ETA %s   ",
                    std::string(done, '#').c_str(), std::string(width - done, '.').c_str(),
                    static_cast<long long>(it + 1), static_cast<long long>(total), sps, 100 * wf,
                    format_eta(eta).c_str());
      } else {
        std::printf("iteration %lld/%lld  epoch %lld  %.0f samples/s  wait %.1f%%  ETA %s\n",
                    static_cast<long long>(it + 1), static_cast<long long>(total),
                    static_cast<long long>(epoch), sps, 100 * wf, format_eta(eta).c_str());
      }
      std::fflush(stdout);
    }
    if (stopping) {
      if (root) {
        std::fprintf(stderr, "lbbsp: %s: stopped after iteration %lld of %lld; %s\n", signal_name(stop_sig),
                     static_cast<long long>(it + 1), static_cast<long long>(total),
                     cfg.checkpoint_dir.empty()
                         ? "no --checkpoint-dir, so a new run starts from the beginning"
                         : ("checkpoint in '" + cfg.checkpoint_dir + "': continue with --resume").c_str());
      }
      ++it;
      break;
    }
  }
  watchdog.beat(it, "finish");
  straggler.stop_cotenant();
  if (tty) std::printf("\n");

  // Every rank applied the same reduced updates: check that the parameters really agree.
  engine.pull_to_host();
  double wsum = 0;
  for (size_t i = 0; i < P; ++i) wsum += params[i] * static_cast<double>((i % 97) + 1);
  double mn = wsum, mx = wsum;
  comm.allreduce_min_max(&mn, &mx);
  if (mn != mx)
    throw std::runtime_error("parameters differ across ranks after training (checksums " +
                             std::to_string(mn) + " vs " + std::to_string(mx) + ")");

  // Like a process the signal killed (143 for SIGTERM), so that scripts see that the run did not finish.
  const int exit_status = stop_sig != 0 && it < total ? 128 + stop_sig : 0;
  if (!root) return exit_status;
  if (run_log) run_log->finish();
  const double wall = seconds_since(t0);
  nlohmann::json s;
  s["model"] = model->name();
  s["ranks"] = R;
  s["threads"] = cfg.threads;
  s["global_batch"] = X;
  s["iterations"] = it;
  s["start_iteration"] = start_it;
  s["epochs"] = static_cast<double>(it) / per_epoch;
  s["wall_s"] = wall;
  s["train_time_s"] = train_time;
  s["samples_per_s"] = train_time > 0 ? it * X / train_time : 0.0;
  s["train_loss"] = last_train_loss;
  s["test_loss"] = last_test_loss;
  s["test_accuracy"] = last_test_acc;
  s["balancer"] = cfg.balancer;
  s["predictor"] = cfg.balancer == "lbbsp-cpu" ? cfg.predictor : "";
  s["straggle"] = cfg.straggle;
  s["lag"] = cfg.lag;
  s["device"] = enum_name(cfg.device);
  s["step_mode"] = engine.mode();
  s["mean_iteration_s"] = it ? train_time / it : 0.0;
  s["wait_fraction"] = train_time > 0 ? wait_rank_time / (R * train_time) : 0.0;
  s["balancer_overhead_fraction"] = train_time > 0 ? coord_time / train_time : 0.0;
  // Not in train_time: rank 0 writes between iterations, and the other ranks wait for it at the next
  // allreduce.
  s["io_s"] = io_before + (run_log ? run_log->io_s() : 0.0);
  s["target_accuracy"] = cfg.target_accuracy;
  s["time_to_target_s"] = time_to_target >= 0 ? nlohmann::json(time_to_target) : nlohmann::json(nullptr);
  s["accuracy_curve"] = curve;
  s["params_checksum"] = wsum;
  s["stopped_by"] = exit_status ? nlohmann::json(signal_name(stop_sig)) : nlohmann::json(nullptr);
  if (!cfg.summary_json.empty()) {
    std::ofstream out(cfg.summary_json);
    if (!out) throw std::runtime_error("--summary-json: cannot write '" + cfg.summary_json + "'");
    out << s.dump(2) << "\n";
  }
  if (!cfg.save_params.empty()) save_params(cfg.save_params, *model, params, cfg, it);
  if (!cfg.quiet) {
    // A run stopped by a signal before its first evaluation has no accuracy to show (not "nan").
    char acc[64] = "no test evaluation yet";
    if (!std::isnan(last_test_acc)) std::snprintf(acc, sizeof acc, "test accuracy %.4f", last_test_acc);
    std::printf(
        "%s: %lld iterations in %.2f s (%.0f samples/s), mean iteration %.4f s, wait %.1f%%, "
        "coordination %.2f%%, %s\n",
        exit_status ? "stopped" : "done", static_cast<long long>(it), wall, s["samples_per_s"].get<double>(),
        s["mean_iteration_s"].get<double>(), 100 * s["wait_fraction"].get<double>(),
        100 * s["balancer_overhead_fraction"].get<double>(), acc);
  }
  return exit_status;
}

}  // namespace lbbsp::runtime
