// runtime/analysis/report: the analysis of `lbbsp report` on hand-made telemetry whose answers are known
// exactly.
#include "runtime/analysis/report.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace lbbsp::runtime::report {
namespace {

// R ranks, one row per (iteration, rank). speeds[it][k] samples/s with batch[it][k] samples each.
RunData make_run(const std::vector<std::vector<double>>& speeds,
                 const std::vector<std::vector<int64_t>>& batch, const std::string& balancer = "lbbsp-cpu") {
  RunData d;
  d.dir = "/runs/x";
  d.file = "/runs/x/telemetry.h5";
  d.balancer = balancer;
  d.ranks = static_cast<int>(speeds[0].size());
  for (size_t it = 0; it < speeds.size(); ++it) {
    double slowest = 0;
    std::vector<double> compute(d.ranks);
    for (int k = 0; k < d.ranks; ++k) {
      compute[k] = batch[it][k] > 0 ? batch[it][k] / speeds[it][k] : 1e-6;
      slowest = std::max(slowest, compute[k]);
    }
    for (int k = 0; k < d.ranks; ++k) {
      d.iteration.push_back(static_cast<int64_t>(it));
      d.rank.push_back(k);
      d.batch.push_back(batch[it][k]);
      d.compute_s.push_back(compute[k]);
      d.wait_s.push_back(slowest - compute[k]);
      d.allreduce_s.push_back(0.001);
      d.balancer_s.push_back(0.0005);
      d.predicted_speed.push_back(it > 0 ? speeds[it][k] * 1.1 : 0.0);  // 10% high from the second iteration
      d.actual_speed.push_back(batch[it][k] > 0 ? speeds[it][k] : 0.0);
      d.cpu_avail.push_back(speeds[it][k] / 100.0);
      d.capacity.push_back(speeds[it][k] / 100.0);
    }
  }
  d.global_batch = 0;
  for (int k = 0; k < d.ranks; ++k) d.global_batch += batch[0][k];
  return d;
}

TEST(Report, WaitTimeAndEqualSplitAreExact) {
  // Two ranks at 100 and 50 samples/s; the balanced run gives them 20 and 10 of 30 (both take 0.2 s).
  std::vector<std::vector<double>> speeds(10, {100.0, 50.0});
  std::vector<std::vector<int64_t>> batch(10, {20, 10});
  auto r = analyse(make_run(speeds, batch), Options{});
  EXPECT_EQ(r.iterations, 10);
  EXPECT_NEAR(r.time_s, 10 * (0.2 + 0.0015), 1e-12);  // no summary: the telemetry's sum
  EXPECT_FALSE(r.time_from_summary);
  auto with_summary = make_run(speeds, batch);
  with_summary.summary = {{"iterations", 10}, {"train_time_s", 2.5}, {"start_iteration", 0}};
  auto rs = analyse(with_summary, Options{});
  EXPECT_TRUE(rs.time_from_summary);
  EXPECT_NEAR(rs.mean_iteration_s, 0.25, 1e-12);
  EXPECT_NEAR(rs.telemetry_time_s, r.time_s, 1e-12);
  with_summary.summary["start_iteration"] = 4;  // resumed: the summary's time covers more than the telemetry
  EXPECT_FALSE(analyse(with_summary, Options{}).time_from_summary);
  EXPECT_NEAR(r.wait_rank_s, 0.0, 1e-12);
  EXPECT_NEAR(r.compute_s, 10 * 0.2, 1e-12);
  EXPECT_NEAR(r.equal_split_s, 10 * (15 / 50.0), 1e-12);  // the slow rank's 15 samples
  EXPECT_NEAR(r.ideal_s, 10 * (30 / 150.0), 1e-12);
  EXPECT_NEAR(r.predictor_error, 0.1, 1e-12);
  EXPECT_EQ(r.per_rank[1].predictions, 9);
  EXPECT_NEAR(r.per_rank[0].mean_batch, 20, 1e-12);
  EXPECT_NEAR(r.per_rank[1].speed, 50, 1e-9);

  // The equal split itself: rank 0 waits 0.3 - 0.15 s each iteration.
  auto b = analyse(make_run(speeds, std::vector<std::vector<int64_t>>(10, {15, 15}), "bsp"), Options{});
  EXPECT_NEAR(b.wait_rank_s, 10 * 0.15, 1e-12);
  EXPECT_NEAR(b.per_rank[0].wait_s, 10 * 0.15, 1e-12);
  EXPECT_NEAR(b.wait_fraction, b.wait_rank_s / (2 * b.time_s), 1e-12);
  EXPECT_NEAR(b.equal_split_s, b.compute_s, 1e-12);
}

TEST(Report, EpisodeBoundsSpeedAndDelay) {
  // Three ranks at 100; rank 2 at 40 in iterations 10-19 except 14-15 (a gap of 2 normal ones), then at 70 in
  // 30-32 (too short for an episode of 5).
  std::vector<std::vector<double>> speeds(40, {100.0, 100.0, 100.0});
  for (int it = 10; it < 20; ++it)
    if (it != 14 && it != 15) speeds[it][2] = 40;
  for (int it = 30; it < 33; ++it) speeds[it][2] = 70;
  std::vector<std::vector<int64_t>> batch(40, {10, 10, 10});
  auto r = analyse(make_run(speeds, batch, "bsp"), Options{});
  ASSERT_EQ(r.episodes.size(), 1u);
  const auto& e = r.episodes[0];
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.first, 10);
  EXPECT_EQ(e.last, 19);
  EXPECT_EQ(e.slow_iterations, 8);
  EXPECT_NEAR(e.relative_speed, 0.4, 1e-12);
  EXPECT_NEAR(e.cpu_avail, 0.4, 1e-12);
  EXPECT_NEAR(e.delay_s, 8 * (10 / 40.0 - 10 / 100.0), 1e-12);  // the others' compute is 0.1 s

  // Three normal iterations end it: two episodes, 10-13 is then too short, 16-19 too.
  Options strict;
  strict.episode_gap = 1;
  EXPECT_TRUE(analyse(make_run(speeds, batch, "bsp"), strict).episodes.empty());
  strict.min_episode = 4;
  EXPECT_EQ(analyse(make_run(speeds, batch, "bsp"), strict).episodes.size(), 2u);
}

TEST(Report, IdleIterationsKeepAnEpisodeAndTheLastSpeed) {
  // Rank 1 slow (20 vs 100) in 0-4, given 0 samples in 5-9, slow again in 10-11.
  std::vector<std::vector<double>> speeds(12, {100.0, 20.0});
  std::vector<std::vector<int64_t>> batch(12, {30, 6});
  for (int it = 5; it < 10; ++it) batch[it] = {36, 0};
  auto r = analyse(make_run(speeds, batch), Options{});
  ASSERT_EQ(r.episodes.size(), 1u);
  EXPECT_EQ(r.episodes[0].first, 0);
  EXPECT_EQ(r.episodes[0].last, 11);
  EXPECT_EQ(r.episodes[0].slow_iterations, 7);
  EXPECT_EQ(r.episodes[0].idle_iterations, 5);
  EXPECT_EQ(r.per_rank[1].idle_iterations, 5);
  // The idle rank keeps its speed of 20: an equal split is 18 / 20 s in every iteration.
  EXPECT_EQ(r.estimated_iterations, 12);
  EXPECT_NEAR(r.equal_split_s, 12 * (18 / 20.0), 1e-9);
}

TEST(Report, ComparisonNeedsTheSameRankCount) {
  auto a =
      make_run(std::vector<std::vector<double>>(3, {1.0, 1.0}), std::vector<std::vector<int64_t>>(3, {1, 1}));
  auto b = make_run(std::vector<std::vector<double>>(3, {1.0}), std::vector<std::vector<int64_t>>(3, {1}));
  b.file = "/runs/y/telemetry.h5";
  EXPECT_NO_THROW(check_comparable({a, a}));
  try {
    check_comparable({a, b});
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'/runs/x/telemetry.h5' has 2 ranks, '/runs/y/telemetry.h5' has 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(to_markdown({analyse(b, Options{})}, 15).find("One rank: no stragglers"), std::string::npos);
}

}  // namespace
}  // namespace lbbsp::runtime::report
