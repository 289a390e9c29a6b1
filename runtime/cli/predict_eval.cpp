// `lbbsp predict-eval`: one-step-ahead evaluation of speed predictors on traces or a run's telemetry.
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "runtime/analysis/predict_eval.hpp"
#include "runtime/analysis/traces.hpp"
#include "runtime/cli/commands.hpp"

namespace lbbsp::cli {

void add_predict_eval_command(CLI::App& app) {
  struct Args {
    std::string traces, telemetry, predictors = "narx,arima,ema,last", format = "md",
                                   telemetry_exo = "barrier";
    size_t max_series = 0, max_steps = 0;
    uint64_t seed = 1;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("predict-eval",
                                 "Replay speed series one step ahead through predictors; print RMSE, MAE, "
                                 "MAPE and RMSE relative to EMA");
  read_config_section(cmd);
  auto* traces =
      cmd->add_option("--traces", args->traces,
                      "Trace file or directory (searched recursively; planetlab, bitbrains, alibaba, "
                      "azure, or 'time_s,capacity[,exo...]' csv; gzip or plain)");
  auto* telemetry =
      cmd->add_option("--telemetry", args->telemetry, "Training run directory holding telemetry.h5");
  traces->excludes(telemetry);
  telemetry->excludes(traces);
  cmd->add_option("--predictors", args->predictors,
                  "Comma-separated predictor specs; ',' inside a spec's arguments is allowed after ':' "
                  "(e.g. narx,arima:2,0,1,ema:0.3,last)")
      ->capture_default_str();
  cmd->add_option("--format", args->format, "Output format")
      ->check(CLI::IsMember({"md", "csv", "json"}))
      ->capture_default_str();
  cmd->add_option("--telemetry-exo", args->telemetry_exo,
                  "With --telemetry: 'barrier' (as `lbbsp train` records them: a row's cpu_avail, mem_avail, "
                  "load were measured after its iteration's compute, the newest values known before the next "
                  "iteration, which is what the balancer's predictor gets) or 'next-row' (a row's values "
                  "describe its own iteration and were known before it)")
      ->check(CLI::IsMember({"barrier", "next-row"}))
      ->capture_default_str();
  cmd->add_option("--max-series", args->max_series, "Evaluate at most N series (0: all)");
  cmd->add_option("--max-steps", args->max_steps, "Replay at most N steps of each series (0: all)");
  cmd->add_option("--seed", args->seed, "Seed of the predictors")->capture_default_str();
  cmd->callback([args] {
    if (args->traces.empty() && args->telemetry.empty())
      throw std::runtime_error("predict-eval needs --traces DIR or --telemetry RUN_DIR");
    runtime::EvalOptions options;
    options.predictors = runtime::split_predictor_list(args->predictors);
    options.max_series = args->max_series;
    options.max_steps = args->max_steps;
    options.seed = args->seed;
    const auto exo_mode =
        args->telemetry_exo == "barrier" ? runtime::TelemetryExo::kBarrier : runtime::TelemetryExo::kNextRow;
    auto series = args->traces.empty() ? runtime::series_from_telemetry(args->telemetry, exo_mode)
                                       : runtime::series_from_traces(runtime::load_traces(args->traces));
    auto report = runtime::evaluate(series, options);
    std::fputs(runtime::format_report(report, args->format).c_str(), stdout);
  });
}

}  // namespace lbbsp::cli
