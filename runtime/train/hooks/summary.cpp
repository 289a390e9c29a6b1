// The summary hook (rank 0): at the end of the run, --summary-json, --save-params and the closing line.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "models/model.hpp"
#include "runtime/io/h5.hpp"
#include "runtime/io/telemetry.hpp"
#include "runtime/train/hooks.hpp"
#include "runtime/train/stop_signal.hpp"
#include "runtime/train/trainer.hpp"

namespace lbbsp::runtime {

namespace {

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

class SummaryHook : public TrainHook {
 public:
  const char* name() const override { return "summary"; }
  explicit SummaryHook(const SummarySetup& s) : s_(s) {}

  void on_train_end(const TrainEndContext& c) override {
    const TrainConfig& cfg = *s_.cfg;
    const nlohmann::json s = summary(c);
    if (!cfg.logging.summary_json.empty()) {
      std::ofstream out(cfg.logging.summary_json);
      if (!out) throw std::runtime_error("--summary-json: cannot write '" + cfg.logging.summary_json + "'");
      out << s.dump(2) << "\n";
    }
    if (!cfg.logging.save_params.empty())
      save_params(cfg.logging.save_params, *s_.model, *s_.params, cfg, c.iterations);
    if (cfg.logging.quiet) return;
    // A run stopped by a signal before its first evaluation has no accuracy to show (not "nan").
    char acc[64] = "no test evaluation yet";
    if (!std::isnan(c.stats->last_test_acc))
      std::snprintf(acc, sizeof acc, "test accuracy %.4f", c.stats->last_test_acc);
    std::printf(
        "%s: %lld iterations in %.2f s (%.0f samples/s), mean iteration %.4f s, wait %.1f%%, "
        "coordination %.2f%%, %s\n",
        c.exit_status ? "stopped" : "done", static_cast<long long>(c.iterations), s["wall_s"].get<double>(),
        s["samples_per_s"].get<double>(), s["mean_iteration_s"].get<double>(),
        100 * s["wait_fraction"].get<double>(), 100 * s["balancer_overhead_fraction"].get<double>(), acc);
  }

 private:
  nlohmann::json summary(const TrainEndContext& c) const {
    const TrainConfig& cfg = *s_.cfg;
    const RunStats& st = *c.stats;
    const int64_t it = c.iterations, X = cfg.global_batch;
    const int R = s_.ranks;
    const double train_time = st.train_time;
    nlohmann::json s;
    s["model"] = s_.model->name();
    s["ranks"] = R;
    s["threads"] = cfg.threads;
    s["global_batch"] = X;
    s["iterations"] = it;
    s["start_iteration"] = c.start_iteration;
    s["epochs"] = static_cast<double>(it) / s_.per_epoch;
    s["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.t0).count();
    s["train_time_s"] = train_time;
    s["samples_per_s"] = train_time > 0 ? it * X / train_time : 0.0;
    s["train_loss"] = st.last_train_loss;
    s["test_loss"] = st.last_test_loss;
    s["test_accuracy"] = st.last_test_acc;
    s["balancer"] = cfg.balancing.balancer;
    s["predictor"] = cfg.balancing.balancer == "lbbsp-cpu" ? cfg.balancing.predictor : "";
    s["straggle"] = cfg.emulation.straggle;
    s["lag"] = cfg.balancing.lag;
    s["device"] = enum_name(cfg.device);
    s["step_mode"] = s_.step_mode;
    s["mean_iteration_s"] = it ? train_time / it : 0.0;
    s["wait_fraction"] = train_time > 0 ? st.wait_rank_time / (R * train_time) : 0.0;
    s["balancer_overhead_fraction"] = train_time > 0 ? st.coord_time / train_time : 0.0;
    // Not in train_time: rank 0 writes between iterations, and the other ranks wait for it at the next
    // allreduce.
    s["io_s"] = st.io_before + (s_.log ? s_.log->io_s() : 0.0);
    s["target_accuracy"] = cfg.evaluation.target_accuracy;
    s["time_to_target_s"] =
        st.time_to_target >= 0 ? nlohmann::json(st.time_to_target) : nlohmann::json(nullptr);
    s["accuracy_curve"] = st.curve;
    s["params_checksum"] = c.params_checksum;
    s["stopped_by"] = c.exit_status ? nlohmann::json(signal_name(c.stop_signal)) : nlohmann::json(nullptr);
    // Each hook's time in the whole run (this summary's own excluded).
    s["hook_s"] = nlohmann::json::object();
    for (const auto& [name, seconds] : c.hook_seconds)
      if (name != std::string(this->name())) s["hook_s"][name] = seconds;
    return s;
  }

  SummarySetup s_;
};

}  // namespace

std::unique_ptr<TrainHook> make_summary_hook(const SummarySetup& setup) {
  return std::make_unique<SummaryHook>(setup);
}

}  // namespace lbbsp::runtime
