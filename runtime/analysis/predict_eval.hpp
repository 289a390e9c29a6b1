// predict-eval: replays speed series (raw traces or a training run's telemetry) one step ahead through
// predictors and scores them (RMSE, MAE, MAPE, RMSE relative to EMA), overall and per trace family.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/analysis/traces.hpp"

namespace lbbsp::runtime {

struct EvalSeries {
  std::string family;  // planetlab | bitbrains | alibaba | azure | csv | telemetry
  std::string source;
  int num_exo = 0;
  std::vector<double> speed;     // speed[t] (bad values are kept: predictors must cope, they are not scored)
  std::vector<double> exo;       // exo[t * num_exo + k], measured at step t
  std::vector<double> exo_next;  // values known before step t+1 (same layout), or empty when none are known
};

struct EvalOptions {
  std::vector<std::string> predictors{"narx", "arima", "ema", "last"};
  size_t max_series = 0;  // 0: all
  size_t max_steps = 0;   // per series; 0: all
  uint64_t seed = 1;
};

struct PredictorScore {
  std::string predictor;
  size_t steps = 0;  // scored steps
  double rmse = 0, mae = 0, mape = 0, rmse_vs_ema = 0;
};

struct EvalReport {
  size_t series = 0, steps = 0;
  std::vector<PredictorScore> overall;
  std::map<std::string, std::vector<PredictorScore>> by_family;
  std::map<std::string, size_t> family_series;
};

// Raw traces: speed = capacity; exo = the trace's other columns, lagged (nothing from the predicted step).
std::vector<EvalSeries> series_from_traces(const std::vector<TraceSeries>& traces);

// Which telemetry values were known before an iteration started.
enum class TelemetryExo {
  // What `lbbsp train` records and its balancer uses: row t's cpu_avail, mem_avail, load are measured at the
  // barrier right after iteration t's compute, so they are the newest values known before iteration t+1
  // (the predictor observes them with step t's speed and gets them again as the coming step's inputs).
  kBarrier,
  // Row t's values describe iteration t itself and were known before it started (the coming step's exo =
  // the next row's values). Telemetry written by other tools with that convention; for `lbbsp train` runs
  // it would hand the predictor values measured after the predicted iteration's compute.
  kNextRow,
};

// RUN_DIR/telemetry.h5 (/records/{iteration,rank,actual_speed,cpu_avail,mem_avail,load}): one series per rank
// sorted by iteration; exo = cpu_avail, mem_avail, load; the coming step's exo by `mode`.
std::vector<EvalSeries> series_from_telemetry(const std::string& run_dir,
                                              TelemetryExo mode = TelemetryExo::kBarrier);

// Every series through every predictor (fresh state per series); the default "ema" is always run too as the
// reference for rmse_vs_ema. Throws std::invalid_argument on a bad predictor spec.
EvalReport evaluate(const std::vector<EvalSeries>& series, const EvalOptions& options);

// "narx:dy=4,du=2,arima:2,0,1,ema" -> {"narx:dy=4,du=2", "arima:2,0,1", "ema"}: a comma-separated item
// continues the previous spec (one with ':') when it looks like an argument (a number or key=value).
std::vector<std::string> split_predictor_list(const std::string& list);

// format: md (overall table plus per-family tables), csv, or json.
std::string format_report(const EvalReport& report, const std::string& format);

}  // namespace lbbsp::runtime
