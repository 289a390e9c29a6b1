// The training loop (Trainer::run) and its blocks; the set-up is in runtime/train/trainer_setup.cpp, the side
// concerns in the hooks (runtime/train/hooks.hpp).
#include "runtime/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "balancer/sampling.hpp"
#include "models/model.hpp"
#include "models/optimizer.hpp"
#include "runtime/io/dataset.hpp"
#include "runtime/io/telemetry.hpp"
#include "runtime/train/batch_manager.hpp"
#include "runtime/train/batch_pipeline.hpp"
#include "runtime/train/rank_conditions.hpp"
#include "runtime/train/step_engine.hpp"
#include "runtime/train/stop_signal.hpp"
#include "runtime/train/watchdog.hpp"

namespace lbbsp::runtime {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int run_training(const TrainConfig& cfg, Comm& comm) {
  Trainer trainer(cfg, comm);
  return trainer.run();
}

Trainer::Trainer(const TrainConfig& cfg, Comm& comm)
    : cfg_(cfg), comm_(comm), R_(comm.size()), me_(comm.rank()), root_(comm.is_root()) {}

Trainer::~Trainer() = default;

int Trainer::run() {
  if (!set_up()) return 1;  // a rank other than 0 after a set-up error, which rank 0 reports
  stop_signals_ = std::make_unique<StopSignals>();
  comm_.barrier();
  // The training clock; a resumed run's starts as long ago as the runs before it trained.
  t0_ = Clock::now() -
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stats_.train_time));
  hooks_.on_train_begin({t0_, start_it_});

  int64_t it = start_it_;
  for (; it < total_; ++it) {
    Step s = begin_iteration(it);  // the epoch's permutation, the clocks
    // -- slice: this rank's rows of the global batch
    slice(s);
    // -- forward_backward: gradient sums of those rows into the buffer, and the compute time to report
    models::StepStats stats;
    forward_backward(s, stats);
    // -- fill slots: loss, correct, this rank's slot (and the next batch vector when rank 0 decided it ahead)
    fill_slots(s, stats);
    // -- allreduce: one sum of the whole buffer over all ranks
    allreduce(s);
    // -- decide: rank 0 turns every rank's slot into a coming batch vector; every rank learns the next one
    decide(s);
    // -- SGD step: the same update on every rank
    sgd_step(s);
    // -- hooks: statistics, then telemetry, evaluation, checkpoint, progress, stop message
    const IterationContext ctx = end_iteration(s);
    hooks_.on_iteration_end(ctx);
    if (ctx.stopping) {
      ++it;
      break;
    }
  }
  return finish(it);
}

Trainer::Step Trainer::begin_iteration(int64_t it) {
  Step s;
  s.it = it;
  s.epoch = it / per_epoch_;
  s.pos = it % per_epoch_;
  if (s.pos == 0 || perm_.empty()) perm_ = balancer::epoch_permutation(n_train_, cfg_.seed, s.epoch);
  s.t_iter = Clock::now();
  conditions_->begin_iteration(it, seconds_since(t0_));
  watchdog_->beat(it, "compute");
  return s;
}

void Trainer::slice(Step& s) {
  // Positions [pos*X + b_0 + ... + b_{me-1}, + b_me) of the epoch's permutation.
  const int64_t first = s.pos * X_ + balancer::slice_offset(batch_, me_);
  s.n = batch_[me_];
  rows_.assign(perm_.begin() + first, perm_.begin() + first + s.n);
  const int dim = train_->shape().size();
  x_.resize(static_cast<size_t>(s.n) * dim);
  y_.resize(s.n);
  buf_->clear();
}

void Trainer::forward_backward(Step& s, models::StepStats& stats) {
  s.t_compute = Clock::now();
  hooks_.on_compute_begin(s.it);
  train_->gather(rows_.data(), s.n, x_.data(), y_.data());
  stats = engine_->forward_backward(x_.data(), y_.data(), static_cast<int>(s.n), buf_->data());
  hooks_.on_compute_end(s.it, stats);
  s.real_s = seconds_since(s.t_compute);
  // The real time, or under --straggle the emulated one (waited out here).
  s.compute_s = conditions_->compute_seconds(s.n, s.t_compute, engine_->released_at(), s.real_s);
}

void Trainer::fill_slots(Step& s, const models::StepStats& stats) {
  const auto metrics = conditions_->metrics(s.it, seconds_since(t0_));
  buf_->set_totals(stats.loss_sum, stats.correct);
  float* slot = buf_->slot(me_);
  slot[kCompute] = static_cast<float>(s.compute_s);
  slot[kCpu] = static_cast<float>(metrics.cpu_avail);
  slot[kMem] = static_cast<float>(metrics.mem_avail);
  slot[kLoad] = static_cast<float>(metrics.load);
  slot[kCapacity] = static_cast<float>(metrics.capacity);
  slot[kRealCompute] = static_cast<float>(s.real_s);
  slot[kStop] = static_cast<float>(stop_signals_->received());
  // A decision made ahead ran on a thread while we computed; waiting for it is coordination.
  const auto t = Clock::now();
  pipeline_->before_allreduce(*buf_);
  s.coord_s += seconds_since(t);
}

void Trainer::allreduce(Step& s) {
  watchdog_->beat(s.it, "allreduce");
  const auto t = Clock::now();
  engine_->allreduce(buf_->data(), buf_->size());
  s.allreduce_s = seconds_since(t);
  if (!stop_sig_) stop_sig_ = buf_->stop_signal();
  const double loss_sum = buf_->loss_sum();
  if (!std::isfinite(loss_sum)) {
    throw std::runtime_error("training loss is " + std::string(std::isnan(loss_sum) ? "NaN" : "Inf") +
                             " at iteration " + std::to_string(s.it) + " (epoch " + std::to_string(s.epoch) +
                             "); lower --lr or check the data");
  }
  stats_.epoch_loss += loss_sum;
  stats_.epoch_correct += static_cast<int64_t>(buf_->correct());
  stats_.epoch_samples += X_;
}

void Trainer::decide(Step& s) {
  watchdog_->beat(s.it, "balancer");
  const auto t = Clock::now();
  s.max_compute = buf_->max_compute();
  s.next_batch = pipeline_->after_allreduce(*buf_, comm_, [&] { return report(s); });
  s.coord_s += seconds_since(t);
}

// Rank 0: everybody's slot, and what an emulation knows of the iteration decided for (oracle only).
balancer::IterationReport Trainer::report(const Step& s) const {
  balancer::IterationReport report;
  report.iteration = s.it;
  report.workers.resize(R_);
  // The iteration decided for starts now with lag 0, L iterations later (of about the last one's length) with
  // L.
  const int64_t ahead = pipeline_->decided_for(s.it) - (s.it + 1);
  const double next_start_s = seconds_since(t0_) + static_cast<double>(ahead) * stats_.last_iter_s;
  for (int r = 0; r < R_; ++r) {
    const float* slot = buf_->slot(r);
    auto& w = report.workers[r];
    w.batch = batch_[r];
    w.compute_s = slot[kCompute];
    w.exo = {slot[kCpu], slot[kMem], slot[kLoad]};
    w.exo_next = w.exo;  // measured at the barrier just before the coming iteration
    w.mem_cap = caps_[r];
    w.truth = conditions_->truth(r, pipeline_->decided_for(s.it), next_start_s);
    w.truth.capacity = slot[kCapacity];
  }
  return report;
}

void Trainer::sgd_step(Step& s) {
  // Last in the iteration, so that in host/node-shared mode its barrier is the moment the node's ranks start
  // the next step.
  engine_->sgd_step(buf_->data(), X_, schedule_->lr_at(s.it));
  // The metric slots and batch slots ride in the allreduce: charge their share of it as coordination.
  s.coord_s +=
      s.allreduce_s * static_cast<double>(buf_->coordination_floats()) / static_cast<double>(buf_->size());
}

// The run statistics of the iteration that ended, and what the hooks see of it.
IterationContext Trainer::end_iteration(Step& s) {
  const double iter_s = seconds_since(s.t_iter);
  stats_.last_iter_s = iter_s;
  stats_.train_time += iter_s;
  stats_.coord_time += s.coord_s;
  stats_.wait_rank_time += buf_->wait_sum(s.max_compute);
  IterationContext c;
  c.iteration = s.it;
  c.epoch = s.epoch;
  c.epoch_end = s.pos == per_epoch_ - 1;
  c.last = s.it + 1 == total_;
  c.stop_signal = stop_sig_;
  c.stopping = stop_sig_ != 0 && !c.last;  // on the last iteration the run is simply done
  c.start_s = std::chrono::duration<double>(s.t_compute - t0_).count();
  c.buffer = buf_.get();
  c.max_compute = s.max_compute;
  c.compute_s = s.compute_s;
  c.allreduce_s = s.allreduce_s;
  c.coord_s = s.coord_s;
  if (root_) {
    c.predicted = stats_.predicted;
    // The predictions of the decision that made the next iteration's vector.
    auto p = manager_->predicted_speeds();
    if (!p.empty()) stats_.predicted = std::move(p);
  }
  c.batch = std::exchange(batch_, std::move(s.next_batch));
  const double epoch_mean = stats_.epoch_samples ? stats_.epoch_loss / stats_.epoch_samples : NAN;
  if (c.epoch_end || c.last) stats_.last_train_loss = epoch_mean;
  c.epoch_train_loss = epoch_mean;
  if (c.epoch_end) stats_.epoch_loss = 0, stats_.epoch_samples = 0, stats_.epoch_correct = 0;
  c.stats = &stats_;
  return c;
}

int Trainer::finish(int64_t it) {
  watchdog_->beat(it, "finish");
  conditions_->stop();
  if (tty_) std::printf("\n");  // ends the progress bar's line
  TrainEndContext c;
  c.params_checksum = params_checksum();
  c.iterations = it;
  c.start_iteration = start_it_;
  c.stop_signal = stop_sig_;
  // Like a process the signal killed (143 for SIGTERM), so that scripts see that the run did not finish.
  c.exit_status = stop_sig_ != 0 && it < total_ ? 128 + stop_sig_ : 0;
  c.t0 = t0_;
  c.stats = &stats_;
  hooks_.on_train_end(c);
  return c.exit_status;
}

// Every rank applied the same reduced updates: check that the parameters really agree.
double Trainer::params_checksum() {
  engine_->pull_to_host();
  double wsum = 0;
  for (size_t i = 0; i < params_.size(); ++i) wsum += params_[i] * static_cast<double>((i % 97) + 1);
  double mn = wsum, mx = wsum;
  comm_.allreduce_min_max(&mn, &mx);
  if (mn != mx)
    throw std::runtime_error("parameters differ across ranks after training (checksums " +
                             std::to_string(mn) + " vs " + std::to_string(mx) + ")");
  return wsum;
}

// Rank 0: the state a checkpoint of this moment holds (next_iteration: the one a resume starts with).
TrainState Trainer::snapshot(int64_t next_iteration) {
  TrainState st;
  st.iteration = next_iteration;
  st.ranks = R_;
  st.lag = cfg_.balancing.lag;
  st.balancer = cfg_.balancing.balancer;
  engine_->pull_to_host();
  st.params = params_;
  st.velocity = sgd_->velocity();
  st.batch = batch_;
  st.pending = manager_->settle();  // the decisions made ahead belong to the state
  st.balancer_state = manager_->balancer().save_state();
  st.stats = stats_.to_json(run_log_ ? run_log_->io_s() : 0.0);
  st.optimizer = optimizer_;
  return st;
}

}  // namespace lbbsp::runtime
