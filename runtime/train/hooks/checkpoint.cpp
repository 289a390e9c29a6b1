// The checkpoint hook: when to write a checkpoint (every --checkpoint-every iterations, after the last one,
// and when a stop signal ends the run) and what a failed write means. What a checkpoint holds is the
// trainer's (Trainer::snapshot); the file format is runtime/io/checkpoint.hpp's.
#include <cstdio>

#include "runtime/train/hooks.hpp"
#include "runtime/train/trainer.hpp"
#include "runtime/train/watchdog.hpp"

namespace lbbsp::runtime {

namespace {

class CheckpointHook : public TrainHook {
 public:
  const char* name() const override { return "checkpoint"; }
  CheckpointHook(const TrainConfig& cfg, Watchdog& watchdog, bool root, CheckpointIdentity id,
                 std::function<TrainState(int64_t)> snapshot)
      : cfg_(cfg), watchdog_(watchdog), root_(root), id_(std::move(id)), snapshot_(std::move(snapshot)) {}

  void on_iteration_end(const IterationContext& c) override {
    const bool due = cfg_.checkpoint.every > 0 && (c.iteration + 1) % cfg_.checkpoint.every == 0;
    if (!(due || c.last || c.stopping)) return;
    watchdog_.beat(c.iteration, "checkpoint");
    if (root_) save(c.iteration + 1);
  }

 private:
  // Rank 0 only. A failed write (disk full, ...) is reported and training continues: the older checkpoints
  // are untouched, since a new one only appears by rename after it is complete and synced.
  void save(int64_t next_iteration) {
    const TrainState st = snapshot_(next_iteration);
    try {
      write_checkpoint(cfg_.checkpoint.dir, id_, st, cfg_.checkpoint.keep);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lbbsp: warning: checkpoint at iteration %lld not written: %s\n",
                   static_cast<long long>(next_iteration), e.what());
    }
  }

  const TrainConfig& cfg_;
  Watchdog& watchdog_;
  bool root_;
  CheckpointIdentity id_;
  std::function<TrainState(int64_t)> snapshot_;
};

}  // namespace

std::unique_ptr<TrainHook> make_checkpoint_hook(const TrainConfig& cfg, Watchdog& watchdog, bool root,
                                                CheckpointIdentity id,
                                                std::function<TrainState(int64_t)> snapshot) {
  return std::make_unique<CheckpointHook>(cfg, watchdog, root, std::move(id), std::move(snapshot));
}

}  // namespace lbbsp::runtime
