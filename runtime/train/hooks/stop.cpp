// The stop message hook (rank 0): when a SIGTERM, SIGINT or SIGUSR1 ends the run early
// (runtime/train/stop_signal.hpp; the signal reaches every rank in the reduction buffer), says after which
// iteration and how to go on.
#include <cstdio>
#include <string>

#include "runtime/train/hooks.hpp"
#include "runtime/train/stop_signal.hpp"
#include "runtime/train/trainer.hpp"

namespace lbbsp::runtime {

namespace {

class StopMessageHook : public TrainHook {
 public:
  const char* name() const override { return "stop message"; }
  StopMessageHook(const TrainConfig& cfg, int64_t total) : cfg_(cfg), total_(total) {}
  void on_iteration_end(const IterationContext& c) override {
    if (!c.stopping) return;
    std::fprintf(stderr, "lbbsp: %s: stopped after iteration %lld of %lld; %s\n", signal_name(c.stop_signal),
                 static_cast<long long>(c.iteration + 1), static_cast<long long>(total_),
                 cfg_.checkpoint.dir.empty()
                     ? "no --checkpoint-dir, so a new run starts from the beginning"
                     : ("checkpoint in '" + cfg_.checkpoint.dir + "': continue with --resume").c_str());
  }

 private:
  const TrainConfig& cfg_;
  int64_t total_;
};

}  // namespace

std::unique_ptr<TrainHook> make_stop_message_hook(const TrainConfig& cfg, int64_t total) {
  return std::make_unique<StopMessageHook>(cfg, total);
}

}  // namespace lbbsp::runtime
