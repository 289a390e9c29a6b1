// The trace-driven simulator on self-made traces (no ../shared needed).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "runtime/analysis/simulator.hpp"
#include "runtime/analysis/traces.hpp"

using namespace lbbsp::runtime;

namespace {

// Random-walk capacity series in [0.2, 1] (autocorrelated, like real co-tenant load).
std::vector<TraceSeries> walk_traces(size_t count, size_t length, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> step(0.0, 0.08);
  std::vector<TraceSeries> out(count);
  for (size_t k = 0; k < count; ++k) {
    out[k].source = "walk" + std::to_string(k);
    out[k].family = "csv";
    double c = 0.6;
    for (size_t t = 0; t < length; ++t) {
      c = std::clamp(c + step(rng), 0.2, 1.0);
      out[k].time_s.push_back(static_cast<double>(t));
      out[k].capacity.push_back(c);
    }
  }
  return out;
}

std::vector<TraceSeries> constant_traces() {
  TraceSeries s;
  s.source = "constant";
  s.family = "csv";
  s.time_s = {0, 1};
  s.capacity = {1.0, 1.0};
  return {s};
}

const BalancerResult& find(const SimulationResult& r, const std::string& name) {
  for (const auto& x : r.results)
    if (x.balancer == name) return x;
  throw std::runtime_error("no result for " + name);
}

}  // namespace

TEST(Simulator, RingAllreduceCost) {
  EXPECT_EQ(ring_allreduce_s(1, 1e6, 1e9, 1e-5), 0.0);
  EXPECT_NEAR(ring_allreduce_s(4, 1e6, 1e9, 1e-5), 2.0 * 3 / 4 * 1e-3 + 6e-5, 1e-15);
}

TEST(Simulator, SplitsBalancerListsKeepingPredictorSpecsWhole) {
  const auto v =
      split_balancer_list("bsp,lbbsp-cpu:narx:hidden=8,window=32,oracle,lbbsp-cpu:arima:1,0,1,static:3");
  EXPECT_EQ(v, (std::vector<std::string>{"bsp", "lbbsp-cpu:narx:hidden=8,window=32", "oracle",
                                         "lbbsp-cpu:arima:1,0,1", "static:3"}));
  EXPECT_THROW(split_balancer_list("bsp,,oracle"), std::invalid_argument);
}

TEST(Simulator, OracleBoundsEveryBalancerOnBothProfiles) {
  const auto traces = walk_traces(5, 300, 1);
  for (const char* profile : {"cpu", "gpu"}) {
    SimulatorConfig cfg;
    cfg.workers = 12;
    cfg.iterations = 80;
    cfg.profile = profile;
    cfg.balancers = {
        "bsp",       "static",          "random:3", "lbbsp-cpu:last",     "lbbsp-cpu:ema",
        "lbbsp-gpu", "lbbsp-gpu-model", "oracle",   "lbbsp-cpu;follow=1", "lbbsp-cpu:ema;band=2"};
    const SimulationResult r = simulate(cfg, traces);
    ASSERT_EQ(r.results.size(), cfg.balancers.size());
    for (const auto& x : r.results) {
      EXPECT_LE(x.efficiency_vs_oracle, 1.0 + 1e-9) << profile << " " << x.balancer;
      EXPECT_GT(x.efficiency_vs_oracle, 0.0);
      EXPECT_GE(x.wait_fraction, 0.0);
      EXPECT_LT(x.wait_fraction, 1.0);
      EXPECT_GE(x.decision_ms_per_iteration, 0.0);
    }
    EXPECT_LT(find(r, "bsp").efficiency_vs_oracle, 0.95) << profile;  // heterogeneity + changing capacity
    EXPECT_NEAR(find(r, "bsp").speedup_vs_bsp, 1.0, 1e-12);
    EXPECT_NEAR(find(r, "oracle").efficiency_vs_oracle, 1.0, 1e-12);
    // The linear (CPU) model misreads flat GPU curves, so each profile is checked with its own balancer.
    const bool gpu = std::string(profile) == "gpu";
    EXPECT_GT(find(r, gpu ? "lbbsp-gpu-model" : "lbbsp-cpu:last").speedup_vs_bsp, 1.05) << profile;
    EXPECT_EQ(find(r, "lbbsp-cpu:ema").predictor, "ema");
    EXPECT_EQ(find(r, "lbbsp-cpu:ema;band=2").predictor, "ema");
    EXPECT_EQ(find(r, "lbbsp-cpu;follow=1").predictor, cfg.predictor);
    EXPECT_EQ(find(r, "bsp").predictor, "");
  }
}

TEST(Simulator, LbbspCpuConvergesNearTheOracleOnStaticHeterogeneity) {
  SimulatorConfig cfg;
  cfg.workers = 16;
  cfg.iterations = 50;
  cfg.heterogeneity = 4.0;
  cfg.balancers = {"bsp", "lbbsp-cpu:last", "oracle"};
  const SimulationResult r = simulate(cfg, constant_traces());
  EXPECT_GT(find(r, "lbbsp-cpu:last").efficiency_vs_oracle, 0.97);
  EXPECT_LT(find(r, "bsp").efficiency_vs_oracle, 0.85);
  EXPECT_GT(find(r, "bsp").wait_fraction, find(r, "lbbsp-cpu:last").wait_fraction);
}

TEST(Simulator, GpuModelConvergesFasterThanThePaperAlgorithm) {
  SimulatorConfig cfg;
  cfg.workers = 16;
  cfg.iterations = 30;
  cfg.profile = "gpu";
  cfg.heterogeneity = 3.0;
  cfg.global_batch = 16 * 64;
  cfg.balancers = {"bsp", "lbbsp-gpu", "lbbsp-gpu-model", "oracle"};
  const SimulationResult r = simulate(cfg, constant_traces());
  EXPECT_GT(find(r, "lbbsp-gpu-model").efficiency_vs_oracle, 0.9);
  EXPECT_GE(find(r, "lbbsp-gpu-model").efficiency_vs_oracle, find(r, "lbbsp-gpu").efficiency_vs_oracle);
}

TEST(Simulator, JsonSchemaAndDeterminism) {
  const auto traces = walk_traces(3, 100, 2);
  SimulatorConfig cfg;
  cfg.workers = 5;
  cfg.iterations = 20;
  cfg.balancers = {"static:2", "lbbsp-cpu:ema"};
  const auto j = to_json(simulate(cfg, traces));
  EXPECT_EQ(j.at("workers").get<int>(), 5);
  EXPECT_EQ(j.at("iterations").get<int>(), 20);
  ASSERT_TRUE(j.at("results").is_array());
  ASSERT_EQ(j["results"].size(), 4u);  // bsp and oracle appended
  for (const auto& r : j["results"]) {
    for (const char* key : {"mean_iteration_s", "efficiency_vs_oracle", "speedup_vs_bsp", "wait_fraction",
                            "decision_ms_per_iteration"})
      EXPECT_TRUE(r.at(key).is_number()) << key;
    EXPECT_TRUE(r.at("balancer").is_string());
    EXPECT_TRUE(r.at("predictor").is_string() || r.at("predictor").is_null());
  }
  const auto again = to_json(simulate(cfg, traces));
  for (size_t k = 0; k < 4; ++k)
    EXPECT_EQ(j["results"][k]["mean_iteration_s"], again["results"][k]["mean_iteration_s"]);
  EXPECT_NE(to_markdown(simulate(cfg, traces)).find("| lbbsp-cpu:ema | ema |"), std::string::npos);
}

TEST(Simulator, TimeScaleModeAndTraceOutput) {
  const auto dir = std::filesystem::temp_directory_path() / ("lbbsp_sim_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "a.csv");
    f << "time_s,capacity\n";
    for (int t = 0; t < 50; ++t) f << t * 10 << ',' << (t % 7 == 0 ? 0.3 : 0.9) << '\n';
  }
  const auto traces = load_traces(dir.string());
  SimulatorConfig cfg;
  cfg.workers = 4;
  cfg.iterations = 12;
  cfg.time_scale_s = 0.05;
  cfg.balancers = {"lbbsp-cpu:last"};
  cfg.trace_out = (dir / "batches.csv").string();
  const auto r = simulate(cfg, traces);
  for (const auto& x : r.results) EXPECT_TRUE(std::isfinite(x.mean_iteration_s));
  std::ifstream in(cfg.trace_out);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header, "balancer,iteration,iteration_s,compute_s,b0,b1,b2,b3");
  int rows = 0;
  while (std::getline(in, line)) ++rows;
  EXPECT_EQ(rows, 3 * 12);
  std::filesystem::remove_all(dir);
}

TEST(Simulator, ClearErrors) {
  SimulatorConfig cfg;
  cfg.balancers = {"bogus"};
  EXPECT_THROW(simulate(cfg, walk_traces(1, 10, 3)), std::invalid_argument);
  cfg.balancers = {"bsp"};
  EXPECT_THROW(simulate(cfg, {}), std::runtime_error);
  cfg.profile = "tpu";
  EXPECT_THROW(simulate(cfg, walk_traces(1, 10, 3)), std::invalid_argument);
  cfg.profile = "gpu";
  cfg.mem_factor = 0.5;  // caps cannot hold X
  EXPECT_THROW(simulate(cfg, walk_traces(1, 10, 3)), std::invalid_argument);
}

TEST(Simulator, TenThousandWorkersSmoke) {
  SimulatorConfig cfg;
  cfg.workers = 10000;
  cfg.iterations = 3;
  cfg.balancers = {"lbbsp-cpu:ema"};
  const auto r = simulate(cfg, walk_traces(7, 50, 4));
  ASSERT_EQ(r.results.size(), 3u);
  for (const auto& x : r.results) EXPECT_LE(x.efficiency_vs_oracle, 1.0 + 1e-9);
}
