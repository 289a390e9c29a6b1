// lbbsp.torch's per-step path on the CPU in C++ (the Python path in ddp.py, clock.py and exchange.py is its
// reference and the fall-back): the DDP communication hook that SUMS each gradient bucket (with
// loss_reduction weighted first by the rank's share of the global batch) and, at the last bucket of a step,
// measures the rank's window, reads the /proc monitor, writes the report into the block that rides in that
// bucket's allreduce and opens the next window when the allreduce completes, without Python or the GIL. In
// Python those were ~15 calls of 5-80 us a step on the rank's own core (docs/results/torch.md). Built on
// first use against the installed torch by lbbsp/torch/native.py (torch.utils.cpp_extension), which says what
// it mirrors. For FSDP2 (a 1-D mesh) the same in its reduce-scatter, called from Python (fsdp.py's
// _StepTiming is the reference): the weight, and the report beside each rank's chunk of the step's last one.
#include <pybind11/numpy.h>
#include <time.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;
// lbbsp._lbbsp's monitor as a C function: fills [cpu_avail, mem_avail, load], 0 on success.
using SampleFn = int (*)(void*, double*);
// lbbsp._lbbsp's decision from the world's report rows as a C function (Balancer.c_decider()): 1 decided, 0 a
// row not the usual, -1 failed (the error's text written).
using DecideFn = int (*)(void*, int64_t, const double*, int64_t, int64_t, const int64_t*, int64_t*, double*,
                         char*, size_t);

using Exo = std::array<double, 3>;  // cpu_avail, mem_avail, load (RANK_EXO)

// CLOCK_MONOTONIC: Python's time.perf_counter on Linux, so windows opened here close in Python and back.
double now_s() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The report row's columns (lbbsp._lbbsp.REPORT_LAYOUT; the checksum last, sent as two 16-bit halves).
struct Layout {
  int64_t width, batch, compute, exo, cap, measured, status, checksum;
};

struct Flight {
  c10::intrusive_ptr<c10d::Work> work;
  FuturePtr done;  // completes when the reports are in the block (and the next window is open)
  at::Tensor block;
};

// What the hook and Python share, under one lock: the step clock (HostClock's), the armed step, the flights.
class StepState {
 public:
  StepState(int64_t rank, int64_t world, Layout layout, uintptr_t sample_fn, uintptr_t monitor,
            double min_interval_s, int64_t piggyback_max_bytes)
      : rank_(rank),
        world_(world),
        layout_(layout),
        sample_(reinterpret_cast<SampleFn>(sample_fn)),
        monitor_(reinterpret_cast<void*>(monitor)),
        min_interval_s_(min_interval_s),
        piggyback_max_bytes_(piggyback_max_bytes) {
    TORCH_CHECK(layout.checksum == layout.width - 1,
                "native_step: the checksum must be the report's last column");
    restart(now_s());
  }

  // ---- the window: HostClock's, for the hook's thread and Python's ----
  void restart(double now) {
    std::lock_guard<std::mutex> g(mu_);
    restart_locked(now);
  }
  void reset(double now) {
    std::lock_guard<std::mutex> g(mu_);
    after_step_ = -1;
    restart_locked(now);
  }
  void record(double s) {
    std::lock_guard<std::mutex> g(mu_);
    recorded_ = recorded_.value_or(0.0) + s;
  }
  std::optional<double> recorded() {
    std::lock_guard<std::mutex> g(mu_);
    return recorded_;
  }
  void add_wait(double s) {
    std::lock_guard<std::mutex> g(mu_);
    wait_s_ += s;
  }
  void add_untimed(double s) {
    std::lock_guard<std::mutex> g(mu_);
    untimed_s_ += s;
  }
  double window_s(double now) {
    std::lock_guard<std::mutex> g(mu_);
    return window_locked(now);
  }
  void note_after_barrier(int64_t step, double now, int64_t batch) {
    std::lock_guard<std::mutex> g(mu_);
    after_step_ = step, after_s_ = window_locked(now), after_batch_ = batch;
  }
  double measure(int64_t step, int64_t batch, double now) {
    std::lock_guard<std::mutex> g(mu_);
    return on_this_batch(step, batch, window_locked(now));
  }

  // ---- the step the next last bucket reports ----
  // `vectors`: the decided batch vectors of steps step, step+1, ... (at least the step's own; with lag L the
  // L after it where decided), `checksums` theirs; `decide_fn`, `balancer`: the balancer's C entry
  // (Balancer.c_decider()) that decide_step decides through; timeout_ms: how long it waits for the reports.
  void arm(int64_t step, const std::vector<std::vector<int64_t>>& vectors,
           const std::vector<double>& checksums, int64_t lag, uintptr_t decide_fn, uintptr_t balancer,
           int64_t timeout_ms) {
    TORCH_CHECK(!vectors.empty() && vectors.size() == checksums.size(),
                "native_step: arm: a vector, a checksum");
    std::lock_guard<std::mutex> g(mu_);
    decided_.clear();
    for (size_t i = 0; i < vectors.size(); ++i) {
      TORCH_CHECK(static_cast<int64_t>(vectors[i].size()) == world_, "native_step: arm: one size per rank");
      decided_[step + static_cast<int64_t>(i)] = {vectors[i], checksums[i]};
    }
    arm_locked(step);
    lag_ = lag, decide_ = reinterpret_cast<DecideFn>(decide_fn),
    balancer_ = reinterpret_cast<void*>(balancer);
    timeout_ms_ = timeout_ms;
  }
  // Called with the GIL held, which guards py_monitor_.
  void detach() {
    py_monitor_ = nullptr;
    std::lock_guard<std::mutex> g(mu_);
    detached_ = true;
  }
  std::string orphan_warning_;      // the warning once the LoadBalancer is gone
  PyObject* py_monitor_ = nullptr;  // borrowed from the Handle, which outlives its use (detach() clears it)

  // ---- the flights, read by Python ----
  bool launched(int64_t step) {
    std::lock_guard<std::mutex> g(mu_);
    return flights_.count(step) > 0 || taken_.count(step) > 0;
  }
  bool arrived(int64_t step) {
    std::lock_guard<std::mutex> g(mu_);
    if (taken_.count(step) > 0) return true;
    auto it = flights_.find(step);
    return it != flights_.end() && it->second.done->completed();
  }
  std::vector<int64_t> in_flight() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<int64_t> steps;
    for (const auto& [step, _] : flights_) steps.push_back(step);
    for (const auto& [step, _] : taken_) steps.push_back(step);
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  // Every rank's report of `step` (world x width, float64), read from its summed block (as read_report_block
  // in python/torch_reports.cpp: the checksum's halves joined), waiting at most timeout_ms for it (the GIL
  // released). Raises RuntimeError with the collective's error.
  pybind11::array_t<double> take(int64_t step, int64_t timeout_ms) {
    const std::vector<double> rows = take_rows(step, timeout_ms);
    pybind11::array_t<double> out({world_, layout_.width});
    std::copy(rows.begin(), rows.end(), out.mutable_data());
    return out;
  }

  // step() of step k on its usual course, in one call: the work since the barrier noted, step k's rows taken
  // and decided from through the armed balancer's C entry (the sizes of step k+lag+1), step k+1 armed.
  // (those sizes, whether backward reached the hook in step k, the seconds this rank reported, the seconds
  // waited for the rows); a str: the decision failed (its error); None: not the usual course (step k not
  // armed with this lag, its report not sent from here or failed, with lag >= 1 not arrived yet, or a row not
  // the usual one): nothing decided, the rows kept for take().
  pybind11::object decide_step(int64_t k, double now, int64_t iteration, int64_t lag) {
    std::vector<int64_t> expected;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto flight = flights_.find(k);
      const bool next_known = lag == 0 || decided_.count(k + 1) > 0;
      if (k != step_ || lag != lag_ || decide_ == nullptr || flight == flights_.end() ||
          errors_.count(k) > 0 || !next_known ||
          (lag > 0 && !flight->second.done->completed()))  // with a lag step() takes what is here
        return pybind11::none();
      expected = decided_.at(k).first;
    }
    note_after_barrier(k, now, expected[rank_]);
    const double t0 = now_s();
    std::vector<double> rows = take_rows(k, timeout_ms_);
    const double waited = now_s() - t0;
    pybind11::array_t<int64_t> sizes(world_);
    double checksum = 0;
    std::array<char, 512> error{};
    const int got = decide_(balancer_, iteration, rows.data(), world_, layout_.width, expected.data(),
                            sizes.mutable_data(), &checksum, error.data(), error.size());
    std::lock_guard<std::mutex> g(mu_);
    wait_s_ += waited;
    if (got == 0) {
      taken_[k] = std::move(rows);
      return pybind11::none();
    }
    if (got != 1) return pybind11::str(error.data());
    decided_[k + lag + 1] = {std::vector<int64_t>(sizes.data(), sizes.data() + world_), checksum};
    decided_.erase(k);
    arm_locked(k + 1);
    ++one_call_steps_;
    return pybind11::make_tuple(sizes, backward_step_.load() == k, measured_s_.load(), waited);
  }

  // step() of step k whose report left from the hook: the work since the barrier noted (note_after_barrier),
  // and (whether backward reached the hook in step k, the seconds the report carried, its error or None).
  std::tuple<bool, double, std::optional<std::string>> closed(int64_t k, double now, int64_t batch) {
    note_after_barrier(k, now, batch);
    return {backward_step_.load() == k, measured_s_.load(), pop_error(k)};
  }
  // At exit (Python's atexit, before the interpreter goes): waits, the GIL released, until every held
  // collective is done, at most timeout_ms in all; whether all are.
  bool wait_held(int64_t timeout_ms) {
    std::deque<c10::intrusive_ptr<c10d::Work>> held;
    {
      std::lock_guard<std::mutex> g(mu_);
      held = held_;
    }
    pybind11::gil_scoped_release nogil;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (auto& work : held) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      try {
        work->wait(left);
      } catch (const std::exception&) {  // timed out or failed: nothing more will come of it
        return false;
      }
    }
    return true;
  }
  std::optional<std::string> pop_error(int64_t step) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = errors_.find(step);
    if (it == errors_.end()) return std::nullopt;
    auto message = std::move(it->second);
    errors_.erase(it);
    return message;
  }

  // ---- the hook ----
  FuturePtr run(const Group& group, c10d::GradBucket& bucket) {
    at::Tensor& tensor = bucket.getBufferRef();
    weigh(tensor);
    const double ready_s = now_s();
    std::unique_lock<std::mutex> g(mu_);
    backward_step_ = step_;
    if (detached_ && !orphan_warned_) {  // ddp.py's hook warns alike (once)
      orphan_warned_ = true;
      g.unlock();
      pybind11::gil_scoped_acquire gil;
      if (PyErr_WarnEx(PyExc_UserWarning, orphan_warning_.c_str(), 1) != 0) PyErr_Clear();
      g.lock();
    }
    if (!bucket.isLast() || detached_) {
      g.unlock();
      return allreduce(group, tensor)->getFuture();
    }
    // a second backward in one step: its wait in the allreduce is not this rank's work
    if (sent_step_ == step_) {
      g.unlock();
      return then_left_barrier(allreduce(group, tensor), false, ready_s);
    }
    const int64_t k = step_;
    sent_step_ = k;
    g.unlock();
    // a Python monitor takes the GIL: not under the lock
    const std::optional<Exo> exo = read_exo(k, ready_s);
    return send(group, tensor, k, ready_s, exo);
  }

  // loss_reduction: the hook weights the rank's gradients (LossScale.hook_weight, .orphan_weight); "auto"
  // weights a mean loss but for the steps whose loss scale() weighted (note_scaled)
  enum class Weighting { kNone, kMean, kSum };
  void set_weighting(const std::string& reduction, int64_t global_batch) {
    TORCH_CHECK(reduction.empty() || global_batch > 0, "native_step: weighting needs the global batch");
    std::lock_guard<std::mutex> g(mu_);
    weighting_ = reduction == "mean" || reduction == "auto" ? Weighting::kMean
                 : reduction == "sum"                       ? Weighting::kSum
                                                            : Weighting::kNone;
    unless_scaled_ = reduction == "auto";
    global_batch_ = global_batch;
  }
  void note_scaled(int64_t step) { scaled_step_ = step; }

  // ---- FSDP2's reduce-scatter (fsdp.py's _StepTiming: weigh, rides_here, ride) ----
  // `n`: the reduce-scatters of a step (one per FSDP parameter group); the report rides in the n-th.
  void set_scatters_a_step(int64_t n) {
    std::lock_guard<std::mutex> g(mu_);
    scatters_a_step_ = n;
  }
  // This rank's unsharded gradients `input` weighted, then reduced (SUM) and scattered into its shard
  // `output`, blocking: the time in it is this rank's waiting. The step's last one carries the report.
  void scatter(const Group& group, at::Tensor& output, at::Tensor& input) {
    weigh(input);
    std::unique_lock<std::mutex> g(mu_);
    const int64_t k = step_;
    backward_step_ = k;
    scattered_ = scattered_step_ == k ? scattered_ + 1 : 1;
    scattered_step_ = k;
    const bool rides = !detached_ && scattered_ == scatters_a_step_ && sent_step_ != k && small(input);
    if (rides) sent_step_ = k;
    g.unlock();
    const double ready_s = now_s();
    if (rides) {
      ride(group, output, input, k, ready_s);
      return;
    }
    reduce_scatter(group, output, input);
    add_wait(now_s() - ready_s);
  }

  const int64_t rank_, world_;
  // read by Python between steps while gloo's and autograd's threads may still write: atomics
  std::atomic<int64_t> rides_{0}, separate_{0}, blocks_made_{0};
  int64_t one_call_steps_ = 0;              // steps decide_step decided (Python's thread only)
  std::atomic<int64_t> backward_step_{-1};  // the step of the last backward that reached the hook
  std::atomic<double> measured_s_{std::numeric_limits<double>::quiet_NaN()};  // the last report's seconds

 private:
  // A bucket of the armed step times this rank's weight before the SUM: n_r / X of a mean loss (0 where it
  // has no samples: a mean of nothing is NaN), 1 / X of a sum; once detached DDP's average of a mean.
  void weigh(at::Tensor& tensor) {
    double w = 1.0;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (weighting_ == Weighting::kNone) return;
      if (unless_scaled_ && !detached_ && scaled_step_ == step_) return;  // scale() weighted the loss
      const double x = static_cast<double>(global_batch_);
      if (weighting_ == Weighting::kSum) {
        w = 1.0 / x;
      } else {
        w = detached_ ? 1.0 / static_cast<double>(world_) : static_cast<double>(batch_) / x;
      }
    }
    if (w == 0.0) {
      tensor.zero_();
    } else {
      tensor.mul_(w);
    }
  }

  // The step the hook reports next, from its decided vector.
  void arm_locked(int64_t step) {
    const auto& [sizes, checksum] = decided_.at(step);
    step_ = step, batch_ = sizes[rank_], checksum_ = checksum;
  }

  // take()'s rows as a flat vector: kept ones (decide_step left them) or read from the flight's block.
  std::vector<double> take_rows(int64_t step, int64_t timeout_ms) {
    Flight f;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (auto kept = taken_.find(step); kept != taken_.end()) {
        std::vector<double> rows = std::move(kept->second);
        taken_.erase(kept);
        return rows;
      }
      auto it = flights_.find(step);
      TORCH_CHECK(it != flights_.end(), "native_step: no report of step ", step, " in flight");
      f = std::move(it->second);
      flights_.erase(it);
    }
    if (!f.done->completed()) {  // with DDP it has completed: backward() waited for it
      pybind11::gil_scoped_release nogil;
      try {
        f.work->wait(std::chrono::milliseconds(timeout_ms));
        f.done->wait();
      } catch (const std::exception& e) {
        throw std::runtime_error(e.what());
      }
    }
    if (f.done->hasError()) throw std::runtime_error(f.done->tryRetrieveErrorMessage());
    std::vector<double> rows(world_ * layout_.width);
    AT_DISPATCH_FLOATING_TYPES(f.block.scalar_type(), "read_block", [&] {
      const scalar_t* in = f.block.data_ptr<scalar_t>();
      double* out = rows.data();
      for (int64_t i = 0; i < world_; ++i, in += layout_.width + 1, out += layout_.width) {
        for (int64_t c = 0; c < layout_.checksum; ++c) out[c] = static_cast<double>(in[c]);
        out[layout_.checksum] =
            static_cast<double>(in[layout_.checksum]) * 65536.0 + in[layout_.checksum + 1];
      }
    });
    std::lock_guard<std::mutex> g(mu_);
    spare_.push_back(f.block);
    return rows;
  }

  // Step k's report into a block, and the block reduced (SUM) with the bucket: in one coalesced allreduce
  // where the bucket is float32/64 and small enough, else in an allreduce of its own after the bucket's.
  FuturePtr send(const Group& group, at::Tensor& tensor, int64_t k, double ready_s,
                 const std::optional<Exo>& exo) {
    std::unique_lock<std::mutex> g(mu_);
    const std::vector<double> row = report_locked(k, ready_s, exo);
    const bool rides = piggybacks_ && small(tensor);
    at::Tensor block = spare_block(rides ? tensor.scalar_type() : at::kDouble);
    write_block(block, row);
    g.unlock();
    c10::intrusive_ptr<c10d::Work> work = rides ? allreduce_both(group, tensor, block) : nullptr;
    const bool rode = static_cast<bool>(work);
    FuturePtr done;
    if (rode) {
      done = then_left_barrier(work, true, ready_s);
    } else {
      if (block.scalar_type() != at::kDouble) {
        block = at::empty({world_, layout_.width + 1}, at::TensorOptions().dtype(at::kDouble));
        write_block(block, row);
      }
      done = then_left_barrier(allreduce(group, tensor), true, ready_s);
      work = allreduce(group, block);
    }
    g.lock();
    (rode ? rides_ : separate_) += 1;
    flights_[k] = Flight{work, rode ? done : work->getFuture(), block};
    return done;
  }

  bool small(const at::Tensor& tensor) const {
    return (tensor.scalar_type() == at::kFloat || tensor.scalar_type() == at::kDouble) &&
           static_cast<int64_t>(tensor.numel() * tensor.element_size()) <= piggyback_max_bytes_;
  }

  // Step k's report as a block beside each rank's chunk of the reduce-scatter's input (this rank's row, zeros
  // elsewhere): the SUM hands every rank its shard and every rank's report, in one collective. The next
  // window opens as it returns, as DDP's does when the last bucket's allreduce completes.
  void ride(const Group& group, at::Tensor& output, const at::Tensor& input, int64_t k, double ready_s) {
    const std::optional<Exo> exo = read_exo(k, ready_s);
    const int64_t shard = output.numel(), extra = world_ * (layout_.width + 1);
    at::Tensor wide_in = at::empty({world_, shard + extra}, input.options());
    wide_in.narrow(1, 0, shard).copy_(input.view({world_, shard}));
    {
      std::lock_guard<std::mutex> g(mu_);
      at::Tensor block = spare_block(input.scalar_type());  // take() gives the last one back
      write_block(block, report_locked(k, ready_s, exo));
      wide_in.narrow(1, shard, extra).copy_(block.view({1, extra}));
    }
    at::Tensor wide_out = at::empty({shard + extra}, input.options());
    at::Tensor wide_view = wide_in.view({-1});
    c10::intrusive_ptr<c10d::Work> work = reduce_scatter(group, wide_out, wide_view);
    const double left_s = now_s();
    output.copy_(wide_out.narrow(0, 0, shard));
    std::lock_guard<std::mutex> g(mu_);
    restart_locked(left_s);
    ++rides_;
    auto done = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());  // gloo's has no future
    done->markCompleted(c10::IValue());
    flights_[k] = Flight{work, done, wide_out.narrow(0, shard, extra).view({world_, -1})};
  }

  // The reduce-scatter, done when it returns. The GIL released (FSDP2 calls it from Python) for the launch
  // too, as torch's Python bindings do: gloo's threads finishing a collective in flight (an all-gather FSDP2
  // prefetched) may need it.
  static c10::intrusive_ptr<c10d::Work> reduce_scatter(const Group& group, at::Tensor& output,
                                                       at::Tensor& input) {
    pybind11::gil_scoped_release nogil;
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.asyncOp = false;  // as dist.reduce_scatter_single(async_op=False), which FSDP2 calls
    // _reduce_scatter_base is deprecated for its new name (reduce_scatter_single) from torch 2.15 on
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    c10::intrusive_ptr<c10d::Work> work = group->_reduce_scatter_base(output, input, opts);
#pragma GCC diagnostic pop
    work->wait();
    return work;
  }

  // The coalesced allreduce of the bucket and the block, or null where the backend refuses it (before
  // anything is sent), which is not tried again.
  c10::intrusive_ptr<c10d::Work> allreduce_both(const Group& group, at::Tensor& tensor, at::Tensor& block) {
    try {
      std::vector<at::Tensor> both{tensor, block};
      c10d::AllreduceCoalescedOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      return hold(group->allreduce_coalesced(both, opts));
    } catch (const std::exception&) {
      std::lock_guard<std::mutex> g(mu_);
      piggybacks_ = false;
      return nullptr;
    }
  }

  void restart_locked(double now) {
    recorded_.reset();
    wait_s_ = untimed_s_ = 0.0;
    started_s_ = now;
  }
  double window_locked(double now) const {
    return std::max(0.0, now - started_s_ - wait_s_ - untimed_s_);
  }

  // HostClock._on_this_batch: the part of the window after the last barrier (step k-1's work after backward)
  // scaled to step k's batch, the ratio bounded to [1/4, 4].
  double on_this_batch(int64_t k, int64_t n, double window) const {
    if (after_step_ != k - 1 || after_batch_ <= 0 || n <= 0 || after_batch_ == n) return window;
    const double ratio =
        std::min(4.0, std::max(0.25, static_cast<double>(n) / static_cast<double>(after_batch_)));
    return std::max(0.0, window + std::min(after_s_, window) * (ratio - 1.0));
  }

  // The monitor's figures for step k's report (None: it failed, and says why in errors_ or in Python): the
  // C++ monitor at most every min_interval_s (ResourceMonitor.sample), or a Python monitor, called with the
  // GIL.
  std::optional<Exo> read_exo(int64_t k, double now) {
    if (py_monitor_ != nullptr) return read_python_exo(k);
    if (exo_valid_ && now - exo_read_s_ < min_interval_s_) return exo_;
    Exo exo{};
    if (sample_(monitor_, exo.data()) != 0) {
      std::lock_guard<std::mutex> g(mu_);
      errors_[k] = "the resource monitor failed to read /proc";
      return std::nullopt;
    }
    exo_ = exo, exo_read_s_ = now, exo_valid_ = true;
    return exo;
  }

  // py_monitor_(k) returns the figures, or None where the monitor raised (Python keeps the error for step k).
  std::optional<Exo> read_python_exo(int64_t k) {
    pybind11::gil_scoped_acquire gil;
    if (py_monitor_ == nullptr) return std::nullopt;  // the LoadBalancer went meanwhile
    try {
      pybind11::object got = pybind11::reinterpret_borrow<pybind11::object>(py_monitor_)(k);
      if (got.is_none()) return std::nullopt;
      const auto values = got.cast<std::vector<double>>();
      if (values.size() != 3) return std::nullopt;
      return Exo{values[0], values[1], values[2]};
    } catch (const pybind11::error_already_set&) {
      return std::nullopt;
    }
  }

  // LoadBalancer.report: batch, seconds, exo, no memory cap, measured batch, status, checksum.
  std::vector<double> report_locked(int64_t k, double now, const std::optional<Exo>& exo) {
    std::vector<double> row(layout_.width, 0.0);
    const bool failed = !exo.has_value();
    const double compute = recorded_ ? *recorded_ : on_this_batch(k, batch_, window_locked(now));
    row[layout_.batch] = static_cast<double>(batch_);
    row[layout_.compute] = failed ? 0.0 : compute;
    for (int e = 0; e < 3; ++e) row[layout_.exo + e] = failed ? 0.0 : (*exo)[e];
    row[layout_.measured] = failed ? 0.0 : static_cast<double>(batch_);
    row[layout_.status] = failed ? 1.0 : 0.0;
    row[layout_.checksum] = checksum_;
    if (!failed) measured_s_ = compute;
    return row;
  }

  at::Tensor spare_block(at::ScalarType dtype) {
    if (!spare_.empty() && spare_.back().scalar_type() != dtype) spare_.clear();
    if (spare_.empty()) {
      ++blocks_made_;
      return at::empty({world_, layout_.width + 1}, at::TensorOptions().dtype(dtype));
    }
    at::Tensor block = spare_.back();
    spare_.pop_back();
    return block;
  }

  // write_report_block (python/torch_reports.cpp): zeros, the row in this rank's row, the checksum as halves.
  void write_block(at::Tensor& block, const std::vector<double>& row) const {
    AT_DISPATCH_FLOATING_TYPES(block.scalar_type(), "write_block", [&] {
      scalar_t* data = block.data_ptr<scalar_t>();
      std::fill(data, data + block.numel(), scalar_t(0));
      scalar_t* out = data + rank_ * (layout_.width + 1);
      for (int64_t c = 0; c < layout_.checksum; ++c) out[c] = static_cast<scalar_t>(row[c]);
      const auto sum = static_cast<uint32_t>(row[layout_.checksum]);
      out[layout_.checksum] = static_cast<scalar_t>(sum >> 16);
      out[layout_.checksum + 1] = static_cast<scalar_t>(sum & 0xFFFFu);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(const Group& group, at::Tensor& tensor) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    return hold(group->allreduce(tensors, opts));
  }

  // Every collective launched here stays referenced for the last kHeld launches (as exchange.py's _retired):
  // gloo's thread may still be finishing one after its future completed, and must not drop the last reference
  // to it (at interpreter exit that ended the thread inside a destructor: "terminate called ...").
  static constexpr size_t kHeld = 64;
  c10::intrusive_ptr<c10d::Work> hold(c10::intrusive_ptr<c10d::Work> work) {
    std::lock_guard<std::mutex> g(mu_);
    held_.push_back(work);
    if (held_.size() > kHeld) held_.pop_front();
    return work;
  }

  // The allreduce's future, with the barrier left noted when it completes (in gloo's thread): the next window
  // opens (sends), or a second backward's wait is added.
  // The callback holds no reference: the state is never destroyed (kept()), so no thread of gloo's ever drops
  // the last reference to it and runs its destructor (and its held collectives') while the interpreter exits.
  FuturePtr then_left_barrier(const c10::intrusive_ptr<c10d::Work>& work, bool sends, double ready_s) {
    StepState* state = this;
    FuturePtr future = work->getFuture();
    return future->then(
        [state, sends, ready_s](c10::ivalue::Future& f) -> c10::IValue {
          std::lock_guard<std::mutex> g(state->mu_);
          if (sends) {
            state->restart_locked(now_s());
          } else {
            state->wait_s_ += now_s() - ready_s;
          }
          return f.value();  // the reducer takes the first tensor: the bucket
        },
        future->elementType());
  }

  std::mutex mu_;
  Layout layout_;
  SampleFn sample_;
  void* monitor_;
  double min_interval_s_;
  int64_t piggyback_max_bytes_;
  bool piggybacks_ = true, detached_ = false, orphan_warned_ = false;
  bool unless_scaled_ = false;            // loss_reduction "auto"
  std::atomic<int64_t> scaled_step_{-1};  // the last step whose loss scale() weighted
  Weighting weighting_ = Weighting::kNone;
  int64_t global_batch_ = 0;
  // the window
  std::optional<double> recorded_;
  double started_s_ = 0, wait_s_ = 0, untimed_s_ = 0;
  int64_t after_step_ = -1, after_batch_ = 0;
  double after_s_ = 0;
  // the armed step, and the last one whose report left from here
  int64_t step_ = -1, batch_ = 0, sent_step_ = -1;
  // FSDP2: the reduce-scatters of a step, and of the step so far
  int64_t scatters_a_step_ = 0, scattered_step_ = -1, scattered_ = 0;
  double checksum_ = 0;
  // the decided batch vectors (and checksums) of the armed step and the lag steps after it
  std::map<int64_t, std::pair<std::vector<int64_t>, double>> decided_;
  int64_t lag_ = 0;
  DecideFn decide_ = nullptr;  // the balancer's C entry, and the balancer (held alive by Python)
  void* balancer_ = nullptr;
  int64_t timeout_ms_ = 0;
  // the monitor: the C++ one's last figures (the hook's thread only), or a Python callable (read with the
  // GIL)
  Exo exo_{1.0, 1.0, 0.0};
  double exo_read_s_ = 0;
  bool exo_valid_ = false;
  std::map<int64_t, Flight> flights_;
  std::map<int64_t, std::vector<double>> taken_;  // rows decide_step read and left for take()
  std::map<int64_t, std::string> errors_;
  std::vector<at::Tensor> spare_;
  std::deque<c10::intrusive_ptr<c10d::Work>> held_;
};

// Every state made, never destroyed (a leak of one small object per LoadBalancer, its last 64 collectives
// included): the hook's callbacks run on gloo's threads up to the interpreter's exit and point at it.
std::shared_ptr<StepState> kept(std::shared_ptr<StepState> state) {
  static std::mutex mu;
  static auto* states = new std::vector<std::shared_ptr<StepState>>();
  std::lock_guard<std::mutex> g(mu);
  states->push_back(state);
  return state;
}

class Hook : public c10d::CppCommHookInterface<Group> {
 public:
  Hook(Group group, std::shared_ptr<StepState> state)
      : c10d::CppCommHookInterface<Group>(std::move(group)), state_(std::move(state)) {}
  FuturePtr runHook(c10d::GradBucket& bucket) override {
    return state_->run(c10d::CppCommHookInterface<Group>::state_, bucket);
  }

 private:
  std::shared_ptr<StepState> state_;
};

// StepState::decide_step as a plain CPython function (METH_FASTCALL) bound to its state (a capsule):
// decide(k, now, iteration, lag). pybind11's dispatch of the same call cost ~30 us a step, its caches cold.
PyObject* decide_step_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "decide(k, now, iteration, lag) takes 4 arguments");
    return nullptr;
  }
  auto* state = static_cast<std::shared_ptr<StepState>*>(PyCapsule_GetPointer(self, "lbbsp.StepState"));
  const int64_t k = PyLong_AsLongLong(args[0]), iteration = PyLong_AsLongLong(args[2]),
                lag = PyLong_AsLongLong(args[3]);
  const double now = PyFloat_AsDouble(args[1]);
  if (state == nullptr || PyErr_Occurred()) return nullptr;
  try {
    return (*state)->decide_step(k, now, iteration, lag).release().ptr();
  } catch (pybind11::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef decide_step_def{
    "decide", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(decide_step_call)), METH_FASTCALL,
    "step() of a step on its usual course: decide(k, now, iteration, lag)"};

pybind11::object bound_decide_step(const std::shared_ptr<StepState>& state) {
  pybind11::capsule held(new std::shared_ptr<StepState>(state), "lbbsp.StepState", [](PyObject* capsule) {
    delete static_cast<std::shared_ptr<StepState>*>(PyCapsule_GetPointer(capsule, "lbbsp.StepState"));
  });
  return pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&decide_step_def, held.ptr()));
}

// What Python holds: dropped with the LoadBalancer, it detaches the hook, which then only sums.
struct Handle {
  std::shared_ptr<StepState> state;
  pybind11::object monitor;  // a Python monitor (monitor(step) -> figures or None), or None
  ~Handle() { state->detach(); }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  py::class_<Handle>(m, "NativeStep", py::dynamic_attr())
      .def(py::init([](int64_t rank, int64_t world, const std::vector<int64_t>& layout, uintptr_t sample_fn,
                       uintptr_t monitor, double min_interval_s, int64_t piggyback_max_bytes,
                       py::object py_monitor) {
             TORCH_CHECK(layout.size() == 8, "native_step: the layout has 8 columns");
             Layout l{layout[0], layout[1], layout[2], layout[3], layout[4], layout[5], layout[6], layout[7]};
             auto state = kept(std::make_shared<StepState>(rank, world, l, sample_fn, monitor, min_interval_s,
                                                           piggyback_max_bytes));
             if (!py_monitor.is_none()) state->py_monitor_ = py_monitor.ptr();
             return std::unique_ptr<Handle>(new Handle{state, py_monitor});
           }),
           py::arg("rank"), py::arg("world"), py::arg("layout"), py::arg("sample_fn"), py::arg("monitor"),
           py::arg("min_interval_s"), py::arg("piggyback_max_bytes"), py::arg("py_monitor") = py::none())
      .def(
          "register",
          [](Handle& h, py::object reducer, py::object group, std::string orphan_warning,
             std::string reduction, int64_t global_batch) {
            h.state->orphan_warning_ = std::move(orphan_warning);
            h.state->set_weighting(reduction, global_batch);
            reducer.cast<c10d::Reducer*>()->register_comm_hook(
                std::make_unique<Hook>(group.cast<Group>(), h.state));
          },
          py::arg("reducer"), py::arg("group"), py::arg("orphan_warning"), py::arg("reduction") = "",
          py::arg("global_batch") = 0)
      .def(
          "register_fsdp",
          [](Handle& h, int64_t scatters_a_step, std::string reduction, int64_t global_batch) {
            h.state->set_weighting(reduction, global_batch);
            h.state->set_scatters_a_step(scatters_a_step);
          },
          py::arg("scatters_a_step"), py::arg("reduction") = "", py::arg("global_batch") = 0)
      .def("scatter", [](Handle& h, py::object group, at::Tensor output,
                         at::Tensor input) { h.state->scatter(group.cast<Group>(), output, input); })
      .def("note_scaled", [](Handle& h, int64_t step) { h.state->note_scaled(step); })
      .def("restart", [](Handle& h, double now) { h.state->restart(now); })
      .def("reset", [](Handle& h, double now) { h.state->reset(now); })
      .def("record", [](Handle& h, double s) { h.state->record(s); })
      .def_property_readonly("recorded_s", [](Handle& h) { return h.state->recorded(); })
      .def("add_wait", [](Handle& h, double s) { h.state->add_wait(s); })
      .def("add_untimed", [](Handle& h, double s) { h.state->add_untimed(s); })
      .def("window_s", [](Handle& h, double now) { return h.state->window_s(now); })
      .def("note_after_barrier", [](Handle& h, int64_t step, double now,
                                    int64_t batch) { h.state->note_after_barrier(step, now, batch); })
      .def("measure", [](Handle& h, int64_t step, int64_t batch,
                         double now) { return h.state->measure(step, batch, now); })
      .def("arm",
           [](Handle& h, int64_t step, const std::vector<std::vector<int64_t>>& vectors,
              const std::vector<double>& checksums, int64_t lag, uintptr_t decide_fn, uintptr_t balancer,
              int64_t timeout_ms) {
             h.state->arm(step, vectors, checksums, lag, decide_fn, balancer, timeout_ms);
           })
      .def("decide_function", [](Handle& h) { return bound_decide_step(h.state); })
      .def("launched", [](Handle& h, int64_t step) { return h.state->launched(step); })
      .def("arrived", [](Handle& h, int64_t step) { return h.state->arrived(step); })
      .def("in_flight", [](Handle& h) { return h.state->in_flight(); })
      .def("wait_held", [](Handle& h, int64_t timeout_ms) { return h.state->wait_held(timeout_ms); })
      .def("take",
           [](Handle& h, int64_t step, int64_t timeout_ms) { return h.state->take(step, timeout_ms); })
      .def("closed", [](Handle& h, int64_t step, double now,
                        int64_t batch) { return h.state->closed(step, now, batch); })
      .def_property_readonly("rides", [](Handle& h) { return h.state->rides_.load(); })
      .def_property_readonly("separate", [](Handle& h) { return h.state->separate_.load(); })
      .def_property_readonly("one_call_steps", [](Handle& h) { return h.state->one_call_steps_; })
      .def_property_readonly("blocks_made", [](Handle& h) { return h.state->blocks_made_.load(); });
}
