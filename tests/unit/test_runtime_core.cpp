// Runtime pieces that need no MPI: the dataset reader (in memory and out of core),
// straggler specs and emulation, the timeline's always-valid JSON, and the kernels' environment.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "runtime/io/dataset.hpp"
#include "runtime/io/telemetry.hpp"
#include "runtime/platform/kernel_env.hpp"
#include "runtime/straggle/straggler.hpp"
#include "runtime/train/trainer.hpp"
#include "scratch_dir.hpp"

namespace fs = std::filesystem;
using namespace lbbsp::runtime;

namespace {
std::string scratch(const std::string& name) {
  static const lbbsp::testing::ScratchDir dir("lbbsp_test_runtime_");
  return dir.file(name);
}
}  // namespace

TEST(Dataset, OutOfCoreReadsEqualInMemoryReads) {
  const std::string path = scratch("synth.h5");
  write_synthetic(300, 49, 4, 7, path, 50);  // 49 features: stored as 7x7 images
  Dataset in_memory(path, "train");
  Dataset on_demand(path, "train", /*memory_limit_bytes=*/0);
  ASSERT_TRUE(in_memory.in_memory());
  ASSERT_FALSE(on_demand.in_memory());
  EXPECT_EQ(in_memory.size(), 300);
  EXPECT_EQ(in_memory.classes(), 4);
  EXPECT_EQ(in_memory.shape().height, 7);
  EXPECT_EQ(in_memory.shape().size(), 49);
  // Unsorted rows with duplicates, as a slice of a permutation never has but a caller may ask for.
  std::vector<int64_t> rows = {299, 0, 17, 17, 150, 3, 298, 42};
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> xa(n * 49), xb(n * 49, -1.0f);
  std::vector<uint8_t> ya(n), yb(n, 255);
  in_memory.gather(rows.data(), n, xa.data(), ya.data());
  on_demand.gather(rows.data(), n, xb.data(), yb.data());
  EXPECT_EQ(xa, xb);
  EXPECT_EQ(ya, yb);
  EXPECT_EQ(std::vector<float>(xa.begin() + 2 * 49, xa.begin() + 3 * 49),
            std::vector<float>(xa.begin() + 3 * 49, xa.begin() + 4 * 49));  // the duplicated row
  EXPECT_GE(*std::min_element(xa.begin(), xa.end()), 0.0f);
  EXPECT_LE(*std::max_element(xa.begin(), xa.end()), 1.0f);
  int64_t bad = 300;
  EXPECT_THROW(in_memory.gather(&bad, 1, xa.data(), ya.data()), std::out_of_range);
  Dataset test(path, "test");
  EXPECT_EQ(test.size(), 50);
}

TEST(Dataset, MissingFileIsNamed) {
  try {
    Dataset d("/nonexistent/x.h5", "train");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.h5"), std::string::npos) << e.what();
  }
}

TEST(Straggler, StaticFactorsCycleAndStretchCompute) {
  Straggler s("static:1,0.5", 3, 1);
  EXPECT_TRUE(s.replay());
  EXPECT_DOUBLE_EQ(s.capacity(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(s.capacity(1, 10), 0.5);
  EXPECT_DOUBLE_EQ(s.capacity(2, 0), 1.0);  // cycled
  EXPECT_DOUBLE_EQ(s.emulated_seconds(1, 0, 10, 0.2), 0.4);
  ResourceMetrics measured;
  measured.cpu_avail = 0.9;
  EXPECT_DOUBLE_EQ(s.metrics(1, 0, measured).cpu_avail, 0.5);  // replay reports the trace's co-tenant load
}

TEST(Straggler, StretchNeverEndsBeforeTheTarget) {
  // Sleep-then-yield: both the part under the final millisecond and the part beyond it must reach the target.
  for (double target : {0.0004, 0.0025, 0.012}) {
    const auto start = std::chrono::steady_clock::now();
    Straggler::stretch_to(0.0, target);
    EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), target)
        << target;
  }
}

TEST(Straggler, TraceReplayFollowsTheSeriesWithScaleAndOffset) {
  const std::string path = scratch("trace.csv");
  std::ofstream(path) << "time_s,capacity\n0,1.0\n1,0.5\n2,0.25\n3,0.8\n";
  Straggler s("trace:" + path + ";scale=2;offset=1", 1, 1);
  EXPECT_DOUBLE_EQ(s.capacity(0, 0.0), 0.5);  // offset 1
  EXPECT_DOUBLE_EQ(s.capacity(0, 1.9), 0.5);  // same trace step for 2 s
  EXPECT_DOUBLE_EQ(s.capacity(0, 2.0), 0.25);
  EXPECT_DOUBLE_EQ(s.capacity(0, 6.0), 1.0);  // wraps around
}

// tick=S: the replay clock is the iteration count times S, whatever the wall clock says.
TEST(Straggler, TickReplaysByIterationNotWallClock) {
  const std::string path = scratch("tick.csv");
  std::ofstream(path) << "time_s,capacity\n0,1.0\n1,0.5\n2,0.25\n3,0.8\n";
  Straggler s("trace:" + path + ";scale=2;offset=0;tick=0.5", 1, 1);
  EXPECT_DOUBLE_EQ(s.replay_clock(123.0, 0), 0.0);
  EXPECT_DOUBLE_EQ(s.replay_clock(0.001, 6), 3.0);
  EXPECT_DOUBLE_EQ(s.capacity(0, s.replay_clock(99.0, 3)), 1.0);  // 1.5 s: still the first 2 s step
  EXPECT_DOUBLE_EQ(s.capacity(0, s.replay_clock(0.0, 4)), 0.5);   // 2.0 s: the second step
  Straggler wall("trace:" + path + ";scale=2;offset=0", 1, 1);
  EXPECT_DOUBLE_EQ(wall.replay_clock(2.5, 1000), 2.5);  // without tick= the wall clock
}

TEST(Straggler, TraceRateReplaysByTheTracesOwnTimestamps) {
  const std::string path = scratch("irregular.csv");
  std::ofstream(path) << "time_s,capacity\n0,1.0\n10,0.5\n12,0.25\n40,0.8\n";
  Straggler s("trace:" + path + ";rate=10;offset=0", 1, 1);  // 10 trace seconds per second of training
  EXPECT_DOUBLE_EQ(s.capacity(0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(s.capacity(0, 0.99), 1.0);  // held until the next sample's time
  EXPECT_DOUBLE_EQ(s.capacity(0, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(s.capacity(0, 1.25), 0.25);  // a 2 s gap lasts 0.2 s, a 28 s gap 2.8 s
  EXPECT_DOUBLE_EQ(s.capacity(0, 3.9), 0.25);
  EXPECT_DOUBLE_EQ(s.capacity(0, 4.05), 0.8);  // the last sample lasts one mean gap (40 / 3 s of trace)
  EXPECT_DOUBLE_EQ(s.capacity(0, 5.4), 1.0);   // then the replay wraps around
  Straggler o("trace:" + path + ";rate=10;offset=2", 1, 1);  // offset is still a sample index
  EXPECT_DOUBLE_EQ(o.capacity(0, 0.0), 0.25);
  EXPECT_DOUBLE_EQ(o.capacity(0, 2.8), 0.8);
}

TEST(Straggler, AlignTimeReplaysCoLocatedSeriesAtOneMoment) {
  // Two machines of one cluster whose samples start at different times of the same clock.
  const std::string a = scratch("machine_a.csv"), b = scratch("machine_b.csv");
  std::ofstream(a) << "time_s,capacity\n100,0.1\n150,0.2\n200,0.3\n260,0.4\n400,0.5\n";
  std::ofstream(b) << "time_s,capacity\n150,0.9\n175,0.8\n300,0.7\n400,0.6\n";
  auto value_at = [](const std::vector<std::pair<double, double>>& rows, double t) {
    double v = rows.front().second;
    for (auto& [time, c] : rows)
      if (time <= t) v = c;
    return v;
  };
  const std::vector<std::pair<double, double>> rows_a = {
      {100, 0.1}, {150, 0.2}, {200, 0.3}, {260, 0.4}, {400, 0.5}};
  const std::vector<std::pair<double, double>> rows_b = {{150, 0.9}, {175, 0.8}, {300, 0.7}, {400, 0.6}};
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Straggler s("trace:" + a + "," + b + ";rate=10;align=time;seed=" + std::to_string(seed), 2, 1);
    const double start = std::max(s.trace_time(0, 0.0), s.trace_time(1, 0.0));
    ASSERT_NE(s.source_of(0), s.source_of(1)) << "co-located ranks replay distinct machines";
    EXPECT_GE(start, 150.0);  // a moment both machines cover
    EXPECT_LE(start, 400.0);
    for (double e : {0.0, 0.5, 1.7, 3.0}) {
      if (s.trace_time(0, e) < s.trace_time(0, 0) || s.trace_time(1, e) < s.trace_time(1, 0))
        continue;  // one of them wrapped around (near the end)
      // Both ranks see their machine's latest sample at or before one common time.
      double common = std::max(s.trace_time(0, e), s.trace_time(1, e));
      for (int r = 0; r < 2; ++r) {
        const auto& rows = s.source_of(r).find("machine_a") != std::string::npos ? rows_a : rows_b;
        EXPECT_DOUBLE_EQ(s.capacity(r, e), value_at(rows, common)) << "seed " << seed << " elapsed " << e;
      }
    }
  }
}

TEST(Straggler, StressPinModelsTheShareOfTheCoTenantsCpu) {
  Straggler s("stress:2=100,3=100;pin=0,0,1,1", 4, 1);
  EXPECT_FALSE(s.replay());
  EXPECT_DOUBLE_EQ(s.stress_share(0), 1.0);
  EXPECT_DOUBLE_EQ(s.stress_share(1), 1.0);
  EXPECT_DOUBLE_EQ(s.stress_share(2), 0.5);   // 2 ranks + 2 co-tenants on CPU 1
  EXPECT_DOUBLE_EQ(s.capacity(3, 5.0), 0.5);  // no period: always on
  EXPECT_DOUBLE_EQ(s.capacity(0, 5.0), 1.0);
  EXPECT_DOUBLE_EQ(s.emulated_seconds(2, 0, 10, 0.2), 0.2);  // real interference is never stretched
  Straggler one("stress:1=50;pin=0,1;period=1", 2, 1);
  EXPECT_NEAR(one.stress_share(1), 1.0 / 1.5, 1e-12);
  EXPECT_TRUE(one.cotenant_on(0.5));  // even periods of the wall clock: on
  EXPECT_FALSE(one.cotenant_on(1.5));
  EXPECT_TRUE(one.cotenant_on(1e9 + 0.2));
  Straggler unpinned("stress:1=80", 2, 1);
  EXPECT_DOUBLE_EQ(unpinned.stress_share(1), 1.0);  // sharing unknown without pin=
  EXPECT_DOUBLE_EQ(unpinned.capacity(1, 0.0), 1.0);
}

TEST(Straggler, GpuProfileIsPiecewiseLinearAndCapsMemory) {
  Straggler s("static:1,0.5;gpu=0.01:32:0.001:64", 2, 1);
  ASSERT_TRUE(s.gpu_profile());
  EXPECT_EQ(s.mem_cap(0), 64);
  EXPECT_NEAR(s.emulated_seconds(0, 0, 16, 0.0), 0.01, 1e-12);          // flat below saturation
  EXPECT_NEAR(s.emulated_seconds(0, 0, 48, 0.0), 0.01 + 0.016, 1e-12);  // linear above
  EXPECT_NEAR(s.emulated_seconds(1, 0, 48, 0.0), 2 * 0.026, 1e-12);     // divided by the capacity
  EXPECT_NEAR(s.emulated_seconds(0, 0, 16, 0.5), 0.5, 1e-12);           // real compute slower than the curve
  EXPECT_THROW(s.emulated_seconds(0, 0, 65, 0.0), std::runtime_error);  // out of memory
}

TEST(Straggler, BadSpecsNameTheProblem) {
  auto message = [](const std::string& spec) {
    try {
      Straggler s(spec, 2, 1);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("wobble:1").find("unknown kind 'wobble'"), std::string::npos);
  EXPECT_NE(message("static:").find("static"), std::string::npos);
  EXPECT_NE(message("static:0").find("must be in (0, 1]"), std::string::npos);
  EXPECT_NE(message("static:1;scale=0").find("scale must be > 0"), std::string::npos);
  EXPECT_NE(message("static:1;gpu=1:2:3").find("FLOOR:SAT:SLOPE:CAP"), std::string::npos);
  EXPECT_NE(message("stress:5=50").find("stress rank 5 is not in 0..1"), std::string::npos);
  EXPECT_NE(message("stress:1=150").find("1..100"), std::string::npos);
  EXPECT_NE(message("static:1;color=red").find("unknown option 'color'"), std::string::npos);
  EXPECT_NE(message("trace:/nonexistent/dir").find("/nonexistent/dir"), std::string::npos);
  EXPECT_NE(message("static:1;rate=0").find("rate must be > 0"), std::string::npos);
  EXPECT_NE(message("static:1;rate=30").find("rate= and align= are for trace:"), std::string::npos);
  EXPECT_NE(message("static:1;align=sometimes").find("align must be 'time' or 'random'"), std::string::npos);
  EXPECT_NE(message("static:1;pin=0").find("pin= is for stress:"), std::string::npos);
  EXPECT_NE(message("stress:1=50;pin=-1").find("pin CPU -1"), std::string::npos);
  EXPECT_NE(message("static:1;tick=0").find("tick must be > 0"), std::string::npos);
  EXPECT_NE(message("stress:1=50;tick=1").find("tick= is for replay"), std::string::npos);
  EXPECT_EQ(message("none"), "no error");
}

TEST(Timeline, IsValidJsonAfterEveryFlush) {
  const std::string path = scratch("timeline.json");
  Timeline t(path);
  auto parse = [&] {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::json::parse(ss.str());
  };
  EXPECT_TRUE(parse().is_array());
  t.name_process(0, "rank 0");
  t.complete(0, "compute", "compute", 0.001, 0.002, "{\"batch\":3}");
  t.sync();  // flush() hands the events to the writer thread; sync() waits until they are in the file
  auto j = parse();
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["ph"], "X");
  EXPECT_EQ(j[1]["args"]["batch"], 3);
  EXPECT_DOUBLE_EQ(j[1]["ts"].get<double>(), 1000.0);
  t.complete(1, "wait", "wait", 0.003, 0.001, "");
  t.sync();
  EXPECT_EQ(parse().size(), 3u);
}

// The spin bound is set only where the user set neither libgomp variable, and is a count libgomp accepts.
TEST(KernelEnvironment, SetsTheSpinCountOnlyWhenTheUserSetNoWaitingPolicy) {
  const char* saved_policy = std::getenv("OMP_WAIT_POLICY");
  const char* saved_spin = std::getenv("GOMP_SPINCOUNT");
  const std::string policy = saved_policy ? saved_policy : "", spin = saved_spin ? saved_spin : "";
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  const std::vector<EnvSetting> settings = kernel_environment();
  ASSERT_EQ(settings.size(), 1u);
  EXPECT_EQ(settings[0].name, "GOMP_SPINCOUNT");
  const long count = std::stol(settings[0].value);
  EXPECT_GE(count, 100);
  EXPECT_LE(count, 1000000);
  setenv("OMP_WAIT_POLICY", "passive", 1);
  EXPECT_TRUE(kernel_environment().empty());
  unsetenv("OMP_WAIT_POLICY");
  setenv("GOMP_SPINCOUNT", "1234", 1);
  EXPECT_TRUE(kernel_environment().empty());
  unsetenv("GOMP_SPINCOUNT");
  if (saved_policy) setenv("OMP_WAIT_POLICY", policy.c_str(), 1);
  if (saved_spin) setenv("GOMP_SPINCOUNT", spin.c_str(), 1);
}

// More microseconds, more spins (each count from its own calibration, so only the order is checked, with a
// factor of 100 between the times asked).
TEST(KernelEnvironment, SpinCountGrowsWithTheTimeAsked) {
  EXPECT_LT(spin_count_for(20.0), spin_count_for(2000.0));
}
