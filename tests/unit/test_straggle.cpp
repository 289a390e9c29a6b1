// runtime/straggle/: the --straggle parser's Config and error style, each kind behind the Emulation
// interface, and the seeded trace assignment and noise stream checked against a plain reference written out
// here (so that splitting or reordering the code cannot change which trace, offset or noise value a rank
// gets).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "runtime/analysis/traces.hpp"
#include "runtime/straggle/emulation.hpp"
#include "runtime/straggle/spec.hpp"
#include "runtime/straggle/straggler.hpp"
#include "scratch_dir.hpp"

namespace fs = std::filesystem;
using namespace lbbsp::runtime;

namespace {

std::string scratch_dir(const std::string& name) {
  static const lbbsp::testing::ScratchDir dir("lbbsp_test_straggle_");
  fs::create_directories(dir.file(name));
  return dir.file(name);
}

std::string error_of(const std::string& spec, int ranks = 2) {
  try {
    Straggler s(spec, ranks, 1);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(StraggleSpec, ParsesEveryOptionIntoTheConfigWithoutReadingTraces) {
  const auto c = straggle::parse(
      "trace:/no/such/a,/no/such/b;scale=2;rate=3;offset=1,-2;noise=0.1;tick=0.5;seed=7;"
      "gpu=0.01:32:0.001:64,0.02:8:0:16",
      3, 99);
  EXPECT_EQ(c.kind, straggle::Kind::kTrace);
  EXPECT_EQ(c.trace_paths, (std::vector<std::string>{"/no/such/a", "/no/such/b"}));
  EXPECT_EQ(c.ranks, 3);
  EXPECT_EQ(c.seed, 7u);  // seed= overrides the training seed
  EXPECT_DOUBLE_EQ(c.scale_s, 2);
  EXPECT_DOUBLE_EQ(c.rate, 3);
  EXPECT_EQ(c.offsets, (std::vector<int64_t>{1, -2}));
  EXPECT_DOUBLE_EQ(c.noise_sd, 0.1);
  EXPECT_DOUBLE_EQ(c.tick_s, 0.5);
  ASSERT_EQ(c.gpu_curves.size(), 2u);
  EXPECT_DOUBLE_EQ(c.gpu_curves[1].floor_s, 0.02);
  EXPECT_DOUBLE_EQ(c.gpu_curves[1].sat_batch, 8);
  EXPECT_EQ(c.gpu_caps, (std::vector<int64_t>{64, 16}));

  const auto s = straggle::parse("stress:1=40,3=100;pin=0,1;period=2", 4, 5);
  EXPECT_EQ(s.kind, straggle::Kind::kStress);
  EXPECT_EQ(s.seed, 5u);
  EXPECT_EQ(s.stress_load, (std::vector<int>{0, 40, 0, 100}));
  EXPECT_EQ(s.pin, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(s.period_s, 2);
  EXPECT_EQ(straggle::parse("static:1,0.5", 2, 1).static_factors, (std::vector<double>{1, 0.5}));
}

// Specs that ran before the shared parser still do (strtod numbers, empty lists, arguments of none ignored).
TEST(StraggleSpec, AcceptsWhatTheOldParserAccepted) {
  EXPECT_EQ(straggle::parse("static:1;seed=1e3", 1, 1).seed, 1000u);
  EXPECT_EQ(straggle::parse("static:1;seed=-1", 1, 1).seed, ~0ull);
  EXPECT_DOUBLE_EQ(straggle::parse("static: 0.5", 1, 1).static_factors[0], 0.5);
  EXPECT_TRUE(straggle::parse("stress:1=50;pin=", 2, 1).pin.empty());
  EXPECT_TRUE(straggle::parse("static:1;gpu=", 2, 1).gpu_curves.empty());
  EXPECT_EQ(straggle::parse("none:5", 2, 1).kind, straggle::Kind::kNone);
}

TEST(StraggleSpec, ErrorsUseTheSharedStyleAndNameTheSpec) {
  const std::string m = error_of("static:1,2");
  EXPECT_EQ(
      m.rfind("--straggle: static factor 2 must be in (0, 1] (in 'static:1,2'; valid: none | static:", 0), 0u)
      << m;
  EXPECT_EQ(error_of("").rfind("--straggle: empty spec (in ''; valid:", 0), 0u);
  const std::string t = error_of("trace:/nonexistent/dir");
  EXPECT_EQ(t.rfind("--straggle: /nonexistent/dir", 0), 0u) << t;
  EXPECT_NE(t.find("(in 'trace:/nonexistent/dir'; valid:"), std::string::npos) << t;
  // The option's own range is checked before the kind it belongs to (as before): the first wrong option wins.
  EXPECT_NE(error_of("static:1;scale=0;pin=-1").find("scale must be > 0"), std::string::npos);
  EXPECT_NE(error_of("wobble:1;scale=0").find("scale must be > 0"), std::string::npos);
}

TEST(StraggleKinds, EachKindBehindTheInterface) {
  auto none = straggle::make_emulation(straggle::parse("none", 2, 1));
  EXPECT_FALSE(none->replay());
  EXPECT_DOUBLE_EQ(none->capacity(1, 5.0), 1.0);
  EXPECT_EQ(none->source_of(1), "");

  auto fixed = straggle::make_emulation(straggle::parse("static:0.5,0.25", 3, 1));
  EXPECT_TRUE(fixed->replay());
  EXPECT_DOUBLE_EQ(fixed->capacity(1, 0.0), 0.25);
  EXPECT_DOUBLE_EQ(fixed->capacity(2, 1e6), 0.5);  // cycled, constant in time
  EXPECT_FALSE(fixed->mem_avail(0, 0.0).has_value());

  // Real interference: never stretched (replay capacity 1), capacity is the modelled share.
  auto stress = straggle::make_emulation(straggle::parse("stress:1=100;pin=3,3", 2, 1));
  EXPECT_FALSE(stress->replay());
  EXPECT_DOUBLE_EQ(stress->replay_capacity(1, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(stress->stress_share(0), 2.0 / 3.0);  // 2 ranks + one co-tenant at 100% on CPU 3
  EXPECT_DOUBLE_EQ(stress->capacity(0, 0.0), 2.0 / 3.0);

  // The GPU cost goes on top of the kind: the curve is divided by the static factor.
  Straggler gpu("static:1,0.5;gpu=0.02:10:0.001:50", 2, 1);
  EXPECT_DOUBLE_EQ(gpu.curve(1, 0.0).floor_s, 0.04);
  EXPECT_DOUBLE_EQ(gpu.curve(1, 0.0).slope_s_per_sample, 0.002);
  EXPECT_DOUBLE_EQ(gpu.curve(0, 0.0).sat_batch, 10);
  EXPECT_EQ(gpu.mem_cap(3), 50);
  EXPECT_TRUE(Straggler("static:1", 1, 1).curve(0, 0.0).time(100) == 0.0);  // no profile: a zero curve
}

// The seeded assignment (shuffle of the series, then one rng() % length offset per rank) and the xorshift /
// Box-Muller noise stream, written out plainly: the same numbers the emulation must produce.
TEST(StraggleKinds, TraceAssignmentOffsetsAndNoiseFollowTheSeededReference) {
  const std::string dir = scratch_dir("traces");
  const std::vector<int> lengths = {5, 7, 11};
  for (size_t f = 0; f < lengths.size(); ++f) {
    std::ofstream out(dir + "/m" + std::to_string(f) + ".csv");
    out << "time_s,capacity,mem_pct\n";
    for (int k = 0; k < lengths[f]; ++k) out << k << "," << 0.1 + 0.01 * k + 0.2 * f << "," << 10 * k << "\n";
  }
  const uint64_t seed = 9;
  const double scale = 0.5, noise_sd = 0.1;
  const int ranks = 5;
  Straggler s("trace:" + dir + ";scale=0.5;noise=0.1;seed=9", ranks, 1);

  const auto series = load_traces(dir);
  ASSERT_EQ(series.size(), 3u);
  std::mt19937_64 rng(seed ^ 0x5eedULL);
  std::vector<int> order = {0, 1, 2};
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> offset(ranks);
  for (int r = 0; r < ranks; ++r)
    offset[r] = static_cast<int64_t>(rng() % series[order[r % 3]].capacity.size());

  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto uniform = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return ((state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  ResourceMetrics measured;
  measured.cpu_avail = 0.3;
  for (double e : {0.0, 0.7, 2.2, 9.9}) {
    for (int r = 0; r < ranks; ++r) {
      const auto& t = series[order[r % 3]];
      ASSERT_EQ(s.source_of(r), t.source);
      const int64_t len = static_cast<int64_t>(t.capacity.size());
      const int64_t step = (static_cast<int64_t>(std::floor(e / scale)) + offset[r]) % len;
      EXPECT_DOUBLE_EQ(s.capacity(r, e), t.capacity[step]) << "rank " << r << " at " << e;
      EXPECT_DOUBLE_EQ(s.trace_time(r, e), t.time_s[step]);
      const double u1 = uniform(), u2 = uniform();
      const double cpu =
          t.capacity[step] + noise_sd * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      const ResourceMetrics m = s.metrics(r, e, measured);
      // Near, not equal: whether a*b*c + d contracts to an FMA is the compiler's choice in each place.
      EXPECT_NEAR(m.cpu_avail, std::clamp(cpu, 0.0, 1.0), 1e-12)
          << "noise draw for rank " << r << " at " << e;
      EXPECT_DOUBLE_EQ(m.mem_avail, 1.0 - 10.0 * static_cast<double>(step) / 100.0);  // mem_pct used
    }
  }
}
