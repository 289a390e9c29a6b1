// The progress hook (rank 0 unless --quiet): a live bar on a terminal, else a plain line every
// --progress-every iterations (about 20 per run by default).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/train/hooks.hpp"
#include "runtime/train/trainer.hpp"

namespace lbbsp::runtime {

namespace {

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

class ProgressHook : public TrainHook {
 public:
  const char* name() const override { return "progress"; }
  explicit ProgressHook(const ProgressSetup& s)
      : ranks_(s.ranks),
        global_batch_(s.cfg->global_batch),
        total_(s.total),
        every_(s.cfg->logging.progress_every > 0 ? s.cfg->logging.progress_every
                                                 : std::max<int64_t>(1, s.total / 20)),
        tty_(s.tty) {}

  void on_train_begin(const TrainContext& c) override { last_bar_ = c.t0; }

  void on_iteration_end(const IterationContext& c) override {
    using Clock = std::chrono::steady_clock;
    const int64_t done = c.iteration + 1;
    const bool bar_due =
        tty_ && (std::chrono::duration<double>(Clock::now() - last_bar_).count() > 0.2 || done == total_);
    if (!(bar_due || (!tty_ && done % every_ == 0))) return;
    if (tty_) last_bar_ = Clock::now();
    const RunStats& st = *c.stats;
    const double sps = done * global_batch_ / st.train_time;
    const double wf = st.wait_rank_time / (ranks_ * st.train_time);
    const double eta = (total_ - done) * st.train_time / done;
    if (tty_) {
      int width = 30, bar = static_cast<int>(width * done / total_);
      std::printf("\r[%s%s] %lld/%lld  %.0f samples/s  wait %.1f%%  ETA %s   ", std::string(bar, '#').c_str(),
                  std::string(width - bar, '.').c_str(), static_cast<long long>(done),
                  static_cast<long long>(total_), sps, 100 * wf, format_eta(eta).c_str());
    } else {
      std::printf("iteration %lld/%lld  epoch %lld  %.0f samples/s  wait %.1f%%  ETA %s\n",
                  static_cast<long long>(done), static_cast<long long>(total_),
                  static_cast<long long>(c.epoch), sps, 100 * wf, format_eta(eta).c_str());
    }
    std::fflush(stdout);
  }

 private:
  int ranks_;
  int64_t global_batch_, total_, every_;
  bool tty_;
  std::chrono::steady_clock::time_point last_bar_;
};

}  // namespace

std::unique_ptr<TrainHook> make_progress_hook(const ProgressSetup& setup) {
  return std::make_unique<ProgressHook>(setup);
}

}  // namespace lbbsp::runtime
