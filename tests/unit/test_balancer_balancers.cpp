// Balancers driven by a small synthetic cluster: validity under any input, convergence, checkpoint round
// trips.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "balancer/assign.hpp"
#include "balancer/balancer.hpp"
#include "balancer/curve_fit.hpp"
#include "balancer_cluster.hpp"

using namespace lbbsp::balancer;
using namespace lbbsp::balancer::test_cluster;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void expect_valid(const std::vector<int64_t>& b, int64_t X, const std::vector<int64_t>& caps, size_t n) {
  BatchBounds bounds;
  bounds.max = caps;
  ASSERT_NO_THROW(check_batch(b, X, bounds, n));
}

const std::vector<std::string> kAll = {
    "bsp",       "static",      "static:2",        "random:3", "lbbsp-cpu:last",        "lbbsp-cpu:ema",
    "lbbsp-gpu", "lbbsp-gpu:1", "lbbsp-gpu-model", "oracle",   "lbbsp-cpu:ema;follow=1"};

}  // namespace

TEST(Balancers, FactoryRejectsBadConfigs) {
  for (const char* bad :
       {"nope", "static:0", "static:x", "bsp:1", "lbbsp-gpu:0", "oracle:2", "lbbsp-cpu:bogus", "bsp;band=1",
        "lbbsp-cpu;band=-1", "lbbsp-cpu;band=x", "lbbsp-cpu;band=", "lbbsp-cpu;band=inf", "lbbsp-cpu;width=1",
        "lbbsp-cpu;track=-0.5", "lbbsp-cpu;track=0.5x", "lbbsp-cpu;follow=2", "lbbsp-cpu;follow="}) {
    auto cfg = config(bad, 4, 16);
    EXPECT_THROW(make_balancer(cfg), std::invalid_argument) << bad;
  }
  auto cfg = config("bsp", 4, 16);
  cfg.min_batch = 5;
  EXPECT_THROW(make_balancer(cfg), std::invalid_argument);
  cfg = config("bsp", 4, 16);
  cfg.mem_cap = {1, 2};
  EXPECT_THROW(make_balancer(cfg), std::invalid_argument);
  try {
    make_balancer(config("nope", 4, 16));
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
  }
}

// The spec errors in the shared style (common/spec.hpp): WHAT: WHY (in 'SPEC'; valid: ...).
TEST(Balancers, FactoryErrorsNameTheSpecAndTheValidForms) {
  const auto message = [](const char* name) -> std::string {
    try {
      make_balancer(config(name, 4, 16));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  const std::string valid =
      "valid: bsp, static[:K], random[:SEED], lbbsp-cpu[:PREDICTOR][;band=F][;track=F][;follow=0|1], "
      "lbbsp-gpu[:W], lbbsp-gpu-model, oracle)";
  EXPECT_EQ(message("nope"), "balancer: unknown balancer 'nope' (in 'nope'; " + valid);
  EXPECT_EQ(message("bsp:1"), "balancer: 'bsp' takes no arguments (in 'bsp:1'; " + valid);
  EXPECT_EQ(message("static:x"), "balancer: bad static measuring iterations 'x' (in 'static:x'; " + valid);
  EXPECT_EQ(
      message("lbbsp-gpu;window=2"),
      "balancer: 'lbbsp-gpu' takes no ;KEY=VALUE options, got 'window' (in 'lbbsp-gpu;window=2'; " + valid);
  EXPECT_EQ(message("lbbsp-cpu:lstm").rfind("predictor: unknown predictor 'lstm' (in 'lstm'; valid: ", 0), 0u)
      << message("lbbsp-cpu:lstm");
  // KIND:ARGS keeps the inner colons for the predictor spec.
  EXPECT_EQ(make_balancer(config("lbbsp-cpu:narx:hidden=4", 4, 16))->name(), "lbbsp-cpu:narx:hidden=4");
}

TEST(Balancers, BspIsAnEqualSplitWithRemainderFirst) {
  auto b = make_balancer(config("bsp", 4, 10));
  EXPECT_EQ(b->initial(), (std::vector<int64_t>{3, 3, 2, 2}));
  const Cluster c = static_cpu_cluster(4, 2);
  EXPECT_EQ(b->next(c.report(0, {3, 3, 2, 2})), (std::vector<int64_t>{3, 3, 2, 2}));
}

TEST(Balancers, EveryBalancerReturnsValidVectorsOnACluster) {
  const size_t n = 8, T = 40;
  for (bool gpu : {false, true}) {
    Cluster c = gpu ? gpu_cluster(n, T, 1) : static_cpu_cluster(n, T);
    std::mt19937_64 rng(5);
    for (auto& row : c.capacity)
      for (double& x : row) x = 0.2 + 0.8 * std::uniform_real_distribution<double>(0, 1)(rng);
    const int64_t X = gpu ? 400 : 256;
    for (const auto& name : kAll) {
      auto cfg = config(name, n, X);
      cfg.mem_cap = c.mem_cap;
      auto bal = make_balancer(cfg);
      auto batch = bal->initial();
      expect_valid(batch, X, c.mem_cap, n);
      for (size_t t = 0; t < T; ++t) {
        batch = bal->next(c.report(t, batch));
        expect_valid(batch, X, c.mem_cap, n);
        for (double s : bal->predicted_speeds()) EXPECT_FALSE(std::isinf(s)) << name;
      }
    }
  }
}

TEST(Balancers, GarbageReportsStillGiveValidVectors) {
  const size_t n = 6;
  const int64_t X = 60;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  const double garbage[] = {kNaN, kInf, -kInf, -1.0, 0.0, 1e-300, 1e300};
  for (const auto& name : kAll) {
    auto bal = make_balancer(config(name, n, X));
    auto batch = bal->initial();
    for (int t = 0; t < 60; ++t) {
      IterationReport r;
      r.workers.resize(n);
      for (size_t i = 0; i < n; ++i) {
        WorkerReport& w = r.workers[i];
        w.batch = u(rng) < 0.1 ? static_cast<int64_t>(rng() % 1000) - 500 : batch[i];  // lies about its batch
        w.compute_s = u(rng) < 0.3 ? garbage[rng() % 7] : 0.01 + u(rng);
        if (i == 2 && u(rng) < 0.5)
          w.compute_s = 1e-3 * (w.batch > 0 ? static_cast<double>(w.batch) : 1.0) / 1000;  // 1000x
        w.exo.assign(rng() % 3, u(rng) < 0.2 ? kNaN : u(rng));  // wrong lengths too
        w.exo_next.assign(rng() % 2, u(rng) < 0.2 ? kInf : u(rng));
        w.truth.capacity = u(rng) < 0.3 ? garbage[rng() % 7] : u(rng);
        w.truth.capacity_next = u(rng) < 0.3 ? garbage[rng() % 7] : u(rng);
        if (u(rng) < 0.2) w.truth.curve_next = TimeCurve{garbage[rng() % 7], garbage[rng() % 7], u(rng)};
      }
      batch = bal->next(r);
      expect_valid(batch, X, {}, n);
    }
  }
}

TEST(Balancers, CheckpointRestoreContinuesIdentically) {
  const size_t n = 6, T = 30;
  for (bool gpu : {false, true}) {
    Cluster c = gpu ? gpu_cluster(n, T, 2) : static_cpu_cluster(n, T);
    std::mt19937_64 rng(6);
    for (auto& row : c.capacity)
      for (double& x : row) x = 0.3 + 0.7 * std::uniform_real_distribution<double>(0, 1)(rng);
    for (const auto& name : kAll) {
      auto cfg = config(name, n, 120);
      cfg.mem_cap = c.mem_cap;
      auto a = make_balancer(cfg);
      auto batch = a->initial();
      for (size_t t = 0; t < 10; ++t) batch = a->next(c.report(t, batch));
      auto b = make_balancer(cfg);
      b->load_state(a->save_state());
      for (size_t t = 10; t < T; ++t) {
        const auto next_a = a->next(c.report(t, batch));
        const auto next_b = b->next(c.report(t, batch));
        ASSERT_EQ(next_a, next_b) << name << " diverged at iteration " << t;
        const auto sa = a->predicted_speeds(), sb = b->predicted_speeds();
        ASSERT_EQ(sa.size(), sb.size());
        for (size_t i = 0; i < sa.size(); ++i) {
          if (!(std::isnan(sa[i]) && std::isnan(sb[i]))) {
            EXPECT_EQ(sa[i], sb[i]) << name;
          }
        }
        batch = next_a;
      }
      EXPECT_THROW(b->load_state("garbage"), std::invalid_argument) << name;
    }
  }
}

TEST(Balancers, StaticMeasuresThenFixesAProportionalSplit) {
  const Cluster c = static_cpu_cluster(4, 10);  // speeds 100, 200, 300, 400
  auto bal = make_balancer(config("static:3", 4, 100));
  auto batch = bal->initial();
  for (size_t t = 0; t < 2; ++t) {
    batch = bal->next(c.report(t, batch));
    EXPECT_EQ(batch, (std::vector<int64_t>{25, 25, 25, 25}));
  }
  batch = bal->next(c.report(2, batch));
  EXPECT_EQ(batch, (std::vector<int64_t>{10, 20, 30, 40}));
}

TEST(Balancers, LbbspCpuLastConvergesToTheOracleOnStaticHeterogeneity) {
  const size_t n = 16, T = 6;
  const Cluster c = static_cpu_cluster(n, T);
  const int64_t X = 1000;
  auto bsp = make_balancer(config("bsp", n, X));
  auto lb = make_balancer(config("lbbsp-cpu:last", n, X));
  auto oracle = make_balancer(config("oracle", n, X));
  auto b_bsp = bsp->initial(), b_lb = lb->initial(), b_or = oracle->initial();
  for (size_t t = 0; t < T - 1; ++t) {
    b_bsp = bsp->next(c.report(t, b_bsp));
    b_lb = lb->next(c.report(t, b_lb));
    b_or = oracle->next(c.report(t, b_or));
  }
  const double t_bsp = c.iteration_s(T - 1, b_bsp), t_lb = c.iteration_s(T - 1, b_lb),
               t_or = c.iteration_s(T - 1, b_or);
  EXPECT_NEAR(t_lb, t_or, 1e-12 + 0.01 * t_or);
  EXPECT_GT(t_bsp, 1.5 * t_or);  // speeds differ 4x: BSP waits for the slowest
  const auto speeds = lb->predicted_speeds();
  ASSERT_EQ(speeds.size(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(speeds[i], c.base_speed[i], 1e-9 * c.base_speed[i]);
}

TEST(Balancers, LbbspCpuKeepsMeasuringVerySlowWorkersUnlessTracked) {
  for (int signal : {-1, 0}) {
    Cluster c = static_cpu_cluster(4, 12);
    c.base_speed = {100, 200, 300, 40};
    for (size_t t = 0; t < 4; ++t) c.capacity[t][3] = 0.01;  // then back to 1
    auto cfg = config("lbbsp-cpu:last", 4, 100);
    cfg.capacity_exo = signal;
    auto bal = make_balancer(cfg);
    auto batch = bal->initial();
    for (size_t t = 0; t < 4; ++t) {
      batch = bal->next(c.report(t, batch));
      EXPECT_EQ(batch[3], signal < 0 ? 1 : 0) << t;  // untracked workers must stay measured
    }
    size_t t = 4;  // back at full capacity: 100 * 40 / 640 = 6.25 samples
    while (batch[3] < 5 && t < 12) batch = bal->next(c.report(t++, batch));
    EXPECT_LE(t, 8u) << signal;  // used again by iteration 8 (its recovery's misses widen the band)
  }
}

TEST(Balancers, OracleUsesTheComingCapacity) {
  Cluster c = static_cpu_cluster(2, 2);
  c.base_speed = {100, 100};
  c.capacity = {{1.0, 1.0}, {0.25, 1.0}, {1.0, 1.0}};
  auto bal = make_balancer(config("oracle", 2, 100));
  EXPECT_EQ(bal->next(c.report(0, bal->initial())), (std::vector<int64_t>{20, 80}));
}

TEST(Balancers, GpuBalancersApproachTheOracleAndRespectMemory) {
  const size_t n = 8, T = 200;
  const Cluster c = gpu_cluster(n, T, 3);
  const int64_t X = 480;
  auto run = [&](const std::string& name, size_t iterations) {
    auto cfg = config(name, n, X);
    cfg.mem_cap = c.mem_cap;
    auto bal = make_balancer(cfg);
    auto batch = bal->initial();
    for (size_t t = 0; t < iterations; ++t) {
      batch = bal->next(c.report(t, batch));
      for (size_t i = 0; i < n; ++i) EXPECT_LE(batch[i], c.mem_cap[i]) << name;
    }
    return c.iteration_s(iterations, batch);
  };
  const double oracle = run("oracle", 3), bsp = run("bsp", 3);
  EXPECT_GT(bsp, 1.2 * oracle);
  EXPECT_LT(run("lbbsp-gpu-model", 8), 1.05 * oracle);  // a few iterations suffice
  const double paper = run("lbbsp-gpu", T - 1);
  EXPECT_LT(paper, bsp);
  EXPECT_LT(paper, 1.15 * oracle);
}

TEST(CurveFit, RecoversAHingeAndFallsBackSafely) {
  const TimeCurve truth{0.2, 32, 0.01};
  std::vector<BatchTimePoint> pts;
  for (double b : {8.0, 16.0, 40.0, 64.0, 100.0}) pts.push_back({b, truth.time(b)});
  const TimeCurve fit = fit_time_curve(pts);
  EXPECT_NEAR(fit.floor_s, 0.2, 1e-9);
  EXPECT_NEAR(fit.slope_s_per_sample, 0.01, 1e-9);
  for (double b : {1.0, 20.0, 50.0, 200.0}) EXPECT_NEAR(fit.time(b), truth.time(b), 1e-9) << b;
  // One distinct batch: a line through the origin.
  const TimeCurve one = fit_time_curve({{10, 1.0}, {10, 3.0}});
  EXPECT_NEAR(one.time(20), 4.0, 1e-12);
  // All flat: extended beyond the data with slope floor / b_max.
  const TimeCurve flat = fit_time_curve({{4, 1.0}, {8, 1.0}});
  EXPECT_NEAR(flat.time(8), 1.0, 1e-12);
  EXPECT_NEAR(flat.time(16), 2.0, 1e-12);
  // Garbage points are ignored.
  EXPECT_EQ(fit_time_curve({{kNaN, 1}, {-1, 1}, {3, kInf}}).slope_s_per_sample, 0.0);
}

// A worker idled because of a fixed cost its capacity signal does not show (even one sample took longer than
// the others' whole batch) is probed with one sample now and then, so it is used again once that cost has
// gone; while the cost lasts the probes are rare (one iteration in 64).
TEST(Balancers, IdleWorkersAreProbedAndComeBackWhenTheirFixedCostGoes) {
  for (const std::string name : {"lbbsp-cpu:last", "lbbsp-gpu-model"}) {
    const size_t n = 4, T = 300, cured = 120;
    auto cfg = config(name, n, 512);
    auto bal = make_balancer(cfg);
    auto batch = bal->initial();
    int idle_probes = 0;
    int64_t first_idle = -1, back = -1;
    for (size_t t = 0; t < T; ++t) {
      IterationReport r;
      r.iteration = static_cast<int64_t>(t);
      r.workers.resize(n);
      for (size_t i = 0; i < n; ++i) {
        // 1e5 samples/s each; worker 3 also pays 10 ms per iteration with samples until `cured`.
        const double fixed = i == 3 && t < cured && batch[i] > 0 ? 0.010 : 0.0;
        r.workers[i].batch = batch[i];
        r.workers[i].compute_s = fixed + static_cast<double>(batch[i]) / 1e5;
        r.workers[i].exo = {1.0};  // the capacity signal never shows the fixed cost
      }
      batch = bal->next(r);
      if (batch[3] == 0 && first_idle < 0) first_idle = static_cast<int64_t>(t);
      if (t >= 40 && t < cured && batch[3] > 0) ++idle_probes;
      if (t >= cured && back < 0 && batch[3] >= 100) back = static_cast<int64_t>(t);
    }
    EXPECT_GE(first_idle, 0) << name << ": the hopeless worker was never idled";
    EXPECT_LT(first_idle, 40) << name;
    EXPECT_LE(idle_probes, 2) << name << ": probed too often while hopeless";
    EXPECT_GE(back, 0) << name << ": never used again after its fixed cost went";
    EXPECT_LE(back, static_cast<int64_t>(cured) + 64 + 4) << name;
    EXPECT_GE(batch[3], 100) << name;  // equal speeds again: about 128 each
  }
}

TEST(Balancers, GpuModelDropsFloorBoundStragglersOnlyWhenItCanTrackThem) {
  const size_t n = 4, T = 12;
  Cluster c = gpu_cluster(n, T, 9);
  for (auto& row : c.capacity) row[3] = 0.05;  // worker 3: even one sample costs 20x the floor
  for (int signal : {0, -1}) {
    auto cfg = config("lbbsp-gpu-model", n, 160);
    cfg.capacity_exo = signal;
    cfg.mem_cap = c.mem_cap;
    auto bal = make_balancer(cfg);
    auto batch = bal->initial();
    for (size_t t = 0; t < T; ++t) batch = bal->next(c.report(t, batch));
    if (signal == 0) {
      EXPECT_EQ(batch[3], 0);  // tracked through exo while idle, like the oracle
    } else {
      EXPECT_EQ(batch[3], 1);  // must keep measuring it
    }
  }
  auto cfg = config("lbbsp-gpu-model", n, 160);
  cfg.capacity_exo = 1;  // not an exo index
  EXPECT_THROW(make_balancer(cfg), std::invalid_argument);
}

// lbbsp-cpu's formats before lbbsp-cpu/5 ("lbbsp-cpu", "lbbsp-cpu/2" to "lbbsp-cpu/4") were never released: a
// state of one (here today's fields under the old tag) is refused naming both formats and the way out, and
// the balancer goes on from where it was.
TEST(Balancers, LbbspCpuRefusesAnUnreleasedEarlierFormat) {
  const size_t n = 4;
  const Cluster c = static_cpu_cluster(n, 12);
  auto a = make_balancer(config("lbbsp-cpu:ema", n, 400));
  auto batch = a->initial();
  for (size_t t = 0; t < 6; ++t) batch = a->next(c.report(t, batch));
  const std::string saved = a->save_state();
  const std::string header = "lbbsp-balancer-state lbbsp-cpu/5\n";
  ASSERT_EQ(saved.rfind(header, 0), 0u) << saved.substr(0, 40);
  for (const std::string old : {"lbbsp-cpu", "lbbsp-cpu/2", "lbbsp-cpu/3", "lbbsp-cpu/4"}) {
    const std::string old_state = "lbbsp-balancer-state " + old + "\n" + saved.substr(header.size());
    try {
      a->load_state(old_state);
      ADD_FAILURE() << old << " was loaded";
    } catch (const std::invalid_argument& e) {
      const std::string want = "balancer state has format '" + old + "', this lbbsp reads 'lbbsp-cpu/5' only";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("start afresh"), std::string::npos) << e.what();
    }
    EXPECT_EQ(a->save_state(), saved) << old;
  }
}
