#include "runtime/train/fault_injection.hpp"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/spec.hpp"
#include "models/model.hpp"
#include "runtime/train/watchdog.hpp"

namespace lbbsp::runtime {

namespace {

FaultKind kind_of(const std::string& name) {
  if (name == "throw") return FaultKind::kThrow;
  if (name == "abort") return FaultKind::kAbort;
  if (name == "nan") return FaultKind::kNan;
  if (name == "hang") return FaultKind::kHang;
  return FaultKind::kNone;
}

class FaultHook : public TrainHook {
 public:
  const char* name() const override { return "fault injection"; }
  FaultHook(const Fault& fault, Watchdog& watchdog) : fault_(fault), watchdog_(watchdog) {}
  void on_compute_begin(int64_t it) override {
    if (it != fault_.iteration) return;
    if (fault_.kind == FaultKind::kThrow)
      throw std::runtime_error("injected fault (throw) at iteration " + std::to_string(it));
    if (fault_.kind == FaultKind::kAbort) std::abort();
    if (fault_.kind == FaultKind::kHang) {
      watchdog_.beat(it, "injected hang");
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  void on_compute_end(int64_t it, models::StepStats& stats) override {
    if (it == fault_.iteration && fault_.kind == FaultKind::kNan) stats.loss_sum = NAN;
  }

 private:
  Fault fault_;
  Watchdog& watchdog_;
};

}  // namespace

Fault parse_fault(const std::string& text, int ranks) {
  Fault f;
  if (text.empty()) return f;
  // RANK is the spec's KIND field and ITERATION:KIND its ARGS.
  const spec::Spec s(text, "--inject-fault", "valid: RANK:ITERATION:KIND, KIND = throw, abort, nan or hang");
  const std::vector<std::string> args = s.args_list(':');
  if (args.size() != 2 || !s.options().empty()) s.fail("expected RANK:ITERATION:KIND");
  int64_t rank = 0;
  if (!spec::parse_number(s.kind(), rank) || !spec::parse_number(args[0], f.iteration))
    s.fail("RANK and ITERATION must be integers");
  f.kind = kind_of(args[1]);
  if (f.kind == FaultKind::kNone) s.fail("KIND must be throw, abort, nan or hang");
  if (rank < 0 || rank >= ranks)
    s.fail("rank " + std::to_string(rank) + " is not in 0.." + std::to_string(ranks - 1));
  f.rank = static_cast<int>(rank);
  return f;
}

std::unique_ptr<TrainHook> make_fault_hook(const Fault& fault, int rank, Watchdog& watchdog) {
  if (fault.kind == FaultKind::kNone || fault.rank != rank) return nullptr;
  return std::make_unique<FaultHook>(fault, watchdog);
}

}  // namespace lbbsp::runtime
