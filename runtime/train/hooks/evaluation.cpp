// The evaluation hook: the test-set loss and accuracy after each epoch (or every --eval-every iterations) and
// at the end, on every rank (one allreduce), recorded in the run statistics; rank 0 prints the line.
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "runtime/io/dataset.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/train/hooks.hpp"
#include "runtime/train/step_engine.hpp"
#include "runtime/train/trainer.hpp"
#include "runtime/train/watchdog.hpp"

namespace lbbsp::runtime {

namespace {

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

class EvaluationHook : public TrainHook {
 public:
  const char* name() const override { return "evaluation"; }
  explicit EvaluationHook(const EvaluationSetup& s) : s_(s) {}

  void on_iteration_end(const IterationContext& c) override {
    const TrainConfig& cfg = *s_.cfg;
    const int64_t done = c.iteration + 1;
    if (!((cfg.evaluation.every > 0 ? done % cfg.evaluation.every == 0 : c.epoch_end) || c.last)) return;
    s_.watchdog->beat(c.iteration, "evaluation");
    const EvalResult ev = evaluate(*s_.engine, *s_.test, s_.test_rows, *s_.comm);
    RunStats& st = *s_.stats;
    st.last_test_acc = ev.accuracy;
    st.last_test_loss = ev.loss;
    if (cfg.evaluation.target_accuracy > 0 && st.time_to_target < 0 &&
        ev.accuracy >= cfg.evaluation.target_accuracy)
      st.time_to_target = st.train_time;
    st.curve.push_back({{"iteration", done},
                        {"epoch", static_cast<double>(done) / s_.per_epoch},
                        {"train_time_s", st.train_time},
                        {"test_accuracy", ev.accuracy},
                        {"test_loss", ev.loss}});
    if (!s_.comm->is_root() || cfg.logging.quiet) return;
    if (s_.tty) std::printf("\n");
    std::printf("epoch %.2f  iteration %lld/%lld  train loss %.4f  test loss %.4f  test accuracy %.4f\n",
                static_cast<double>(done) / s_.per_epoch, static_cast<long long>(done),
                static_cast<long long>(s_.total), c.epoch_train_loss, ev.loss, ev.accuracy);
    std::fflush(stdout);
  }

 private:
  EvaluationSetup s_;
};

}  // namespace

std::unique_ptr<TrainHook> make_evaluation_hook(const EvaluationSetup& setup) {
  return std::make_unique<EvaluationHook>(setup);
}

}  // namespace lbbsp::runtime
