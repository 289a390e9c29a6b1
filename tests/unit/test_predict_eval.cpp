// predict-eval: replay and scoring, telemetry.h5 reading (a file written here with the HDF5 C API), formats.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/analysis/predict_eval.hpp"

namespace fs = std::filesystem;
using namespace lbbsp::runtime;

namespace {

EvalSeries constant_then_step(const std::string& family, double a, double b, int n) {
  EvalSeries s;
  s.family = family;
  s.source = family + "-test";
  for (int t = 0; t < n; ++t) s.speed.push_back(t < n / 2 ? a : b);
  return s;
}

void write_column(hid_t group, const char* name, hid_t type, const void* data, hsize_t n) {
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t ds = H5Dcreate2(group, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  ASSERT_GE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  H5Dclose(ds);
  H5Sclose(space);
}

// Two ranks, rows interleaved and out of order; rank 1's speed follows its load known for the coming step.
fs::path write_telemetry(const std::string& name, bool drop_load = false) {
  fs::path dir = fs::temp_directory_path() / ("lbbsp_pe_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<int64_t> iteration, batch;
  std::vector<int32_t> rank;
  std::vector<double> actual, cpu, mem, load, zeros;
  const int n = 200;
  for (int it = n - 1; it >= 0; --it) {
    for (int r = 0; r < 2; ++r) {
      const double l = r == 1 ? (it % 7 == 0 ? 1.0 : 0.0) : 0.0;
      iteration.push_back(it);
      rank.push_back(r);
      batch.push_back(32);
      actual.push_back(r == 0 ? 100.0 : 100.0 - 50.0 * l);
      cpu.push_back(1.0 - 0.5 * l);
      mem.push_back(0.8);
      load.push_back(l);
      zeros.push_back(0.0);
    }
  }
  hid_t f = H5Fcreate((dir / "telemetry.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t g = H5Gcreate2(f, "records", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t rows = iteration.size();
  write_column(g, "iteration", H5T_NATIVE_INT64, iteration.data(), rows);
  write_column(g, "rank", H5T_NATIVE_INT32, rank.data(), rows);
  write_column(g, "batch", H5T_NATIVE_INT64, batch.data(), rows);
  for (const char* col : {"compute_s", "wait_s", "allreduce_s", "balancer_s", "predicted_speed", "capacity"})
    write_column(g, col, H5T_NATIVE_DOUBLE, zeros.data(), rows);
  write_column(g, "actual_speed", H5T_NATIVE_DOUBLE, actual.data(), rows);
  write_column(g, "cpu_avail", H5T_NATIVE_DOUBLE, cpu.data(), rows);
  write_column(g, "mem_avail", H5T_NATIVE_DOUBLE, mem.data(), rows);
  if (!drop_load) write_column(g, "load", H5T_NATIVE_DOUBLE, load.data(), rows);
  H5Gclose(g);
  H5Fclose(f);
  return dir;
}

}  // namespace

TEST(PredictEval, ScoresOneStepAheadAndRelativeToEma) {
  // 10 then 20: "last" errs once (10), ema:0.3 errs on several steps, the oracle never.
  std::vector<EvalSeries> series = {constant_then_step("csv", 10, 20, 20)};
  EvalOptions options;
  options.predictors = {"last", "oracle", "ema"};
  EvalReport r = evaluate(series, options);
  EXPECT_EQ(r.series, 1u);
  EXPECT_EQ(r.steps, 19u);  // step 0 has no forecast
  ASSERT_EQ(r.overall.size(), 3u);
  const PredictorScore& last = r.overall[0];
  EXPECT_EQ(last.predictor, "last");
  EXPECT_NEAR(last.rmse, std::sqrt(100.0 / 19), 1e-12);
  EXPECT_NEAR(last.mae, 10.0 / 19, 1e-12);
  EXPECT_NEAR(last.mape, 100.0 * 0.5 / 19, 1e-12);
  EXPECT_EQ(r.overall[1].rmse, 0.0);
  EXPECT_DOUBLE_EQ(r.overall[2].rmse_vs_ema, 1.0);
  EXPECT_NEAR(last.rmse_vs_ema, last.rmse / r.overall[2].rmse, 1e-12);
  EXPECT_LT(last.rmse_vs_ema, 1.0);
  ASSERT_TRUE(r.by_family.count("csv"));
}

TEST(PredictEval, BadTruthIsNotScoredAndFamiliesAreSeparate) {
  auto a = constant_then_step("planetlab", 1, 1, 10);
  a.speed[4] = std::nan("");
  a.speed[5] = -1;
  auto b = constant_then_step("azure", 2, 4, 10);
  EvalOptions options;
  options.predictors = {"narx", "arima", "last"};
  EvalReport r = evaluate({a, b}, options);
  EXPECT_EQ(r.by_family.at("planetlab")[0].steps, 7u);
  EXPECT_EQ(r.by_family.at("azure")[0].steps, 9u);
  EXPECT_EQ(r.overall[0].steps, 16u);
  EXPECT_EQ(r.family_series.at("azure"), 1u);
  options.max_series = 1;
  options.max_steps = 5;
  r = evaluate({a, b}, options);
  EXPECT_EQ(r.series, 1u);
  EXPECT_EQ(r.steps, 3u);  // steps 1..4 of series a, minus the NaN at 4
}

TEST(PredictEval, TracesBecomeLaggedSeries) {
  TraceSeries t;
  t.family = "bitbrains";
  t.source = "x";
  t.time_s = {0, 300, 600};
  t.capacity = {0.5, 0.6, 0.7};
  t.exo_names = {"mem", "net"};
  t.exo = {{1, 2, 3}, {4, 5, 6}};
  auto s = series_from_traces({t});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].num_exo, 2);
  EXPECT_EQ(s[0].exo, (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(s[0].exo_next.empty());  // nothing of the predicted step is known
}

TEST(PredictEval, ReadsTelemetryPerRankWithBarrierValuesAsKnownExoByDefault) {
  fs::path dir = write_telemetry("barrier");
  auto series = series_from_telemetry(dir.string());  // what `lbbsp train` records: the barrier convention
  ASSERT_EQ(series.size(), 2u);
  const EvalSeries& r1 = series[1];
  EXPECT_NE(r1.source.find("#rank1"), std::string::npos);
  ASSERT_EQ(r1.speed.size(), 200u);
  ASSERT_EQ(r1.exo_next.size(), r1.exo.size());
  EXPECT_EQ(r1.speed[7], 50.0);
  EXPECT_EQ(r1.exo[7 * 3 + 2], 1.0);
  // Row t's values, measured at the barrier after iteration t, are the newest known before iteration t+1:
  // the load of iteration 7 is not known before it, only after.
  EXPECT_EQ(r1.exo_next, r1.exo);
  EXPECT_EQ(r1.exo_next[6 * 3 + 2], 0.0);
  EXPECT_EQ(r1.exo_next[7 * 3 + 2], 1.0);
  EXPECT_FALSE(std::isnan(r1.exo_next[199 * 3]));
  // The explicit barrier mode is the same.
  auto explicit_barrier = series_from_telemetry(dir.string(), TelemetryExo::kBarrier);
  EXPECT_EQ(explicit_barrier[1].exo_next, r1.exo_next);
  fs::remove_all(dir);
}

TEST(PredictEval, ReadsTelemetryPerRankWithNextRowAsKnownExo) {
  fs::path dir = write_telemetry("ok");
  auto series = series_from_telemetry(dir.string(), TelemetryExo::kNextRow);
  ASSERT_EQ(series.size(), 2u);
  const EvalSeries& r1 = series[1];
  EXPECT_EQ(r1.family, "telemetry");
  EXPECT_NE(r1.source.find("#rank1"), std::string::npos);
  ASSERT_EQ(r1.speed.size(), 200u);
  EXPECT_EQ(r1.num_exo, 3);
  EXPECT_EQ(r1.speed[7], 50.0);  // sorted by iteration: iteration 7 is loaded
  EXPECT_EQ(r1.exo[7 * 3 + 2], 1.0);
  EXPECT_EQ(r1.exo_next[6 * 3 + 2], 1.0);  // known before iteration 7
  EXPECT_TRUE(std::isnan(r1.exo_next[199 * 3]));
  // Knowing the coming load, NARX beats EMA and last on rank 1.
  EvalOptions options;
  options.predictors = {"narx", "ema", "last"};
  EvalReport r = evaluate({series[1]}, options);
  EXPECT_LT(r.overall[0].rmse, 0.5 * r.overall[1].rmse);
  EXPECT_LT(r.overall[0].rmse, 0.5 * r.overall[2].rmse);
  fs::remove_all(dir);
}

TEST(PredictEval, TelemetryErrorsNameTheFile) {
  fs::path dir = write_telemetry("noload", true);
  try {
    series_from_telemetry(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("telemetry.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("load"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
  EXPECT_THROW(series_from_telemetry("/nonexistent/run"), std::runtime_error);
}

TEST(PredictEval, FormatsAndSpecLists) {
  EvalOptions options;
  options.predictors = {"last", "ema"};
  EvalReport r = evaluate({constant_then_step("alibaba", 1, 2, 10)}, options);
  auto j = nlohmann::json::parse(format_report(r, "json"));
  EXPECT_EQ(j["series"], 1);
  EXPECT_EQ(j["steps"], 9);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["predictor"], "last");
  for (const char* key : {"rmse", "mae", "mape", "rmse_vs_ema"})
    EXPECT_TRUE(j["results"][0].contains(key)) << key;
  std::string md = format_report(r, "md");
  EXPECT_NE(md.find("| last |"), std::string::npos);
  EXPECT_NE(md.find("## alibaba"), std::string::npos);
  std::string csv = format_report(r, "csv");
  EXPECT_EQ(csv.rfind("family,predictor,steps,rmse,mae,mape,rmse_vs_ema\nall,last,9,", 0), 0u) << csv;
  EXPECT_THROW(format_report(r, "xml"), std::invalid_argument);
  EXPECT_EQ(split_predictor_list("narx:dy=4,du=2,arima:2,0,1,ema,last"),
            (std::vector<std::string>{"narx:dy=4,du=2", "arima:2,0,1", "ema", "last"}));
  EXPECT_EQ(split_predictor_list("narx:epochs=1,narx:batch=4,hidden=8"),
            (std::vector<std::string>{"narx:epochs=1", "narx:batch=4,hidden=8"}));
  EXPECT_EQ(split_predictor_list("narx,lstm,ema:0.3"), (std::vector<std::string>{"narx", "lstm", "ema:0.3"}));
  options.predictors = {"lstm"};
  EXPECT_THROW(evaluate({constant_then_step("csv", 1, 2, 10)}, options), std::invalid_argument);
}
