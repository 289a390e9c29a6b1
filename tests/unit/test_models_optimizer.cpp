// SGD update against hand-computed values, and the learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "models/model.hpp"
#include "models/optimizer.hpp"
#include "test_models_util.hpp"

namespace lbbsp::models {
namespace {

TEST(Sgd, MomentumAndWeightDecayByHand) {
  // g = grad_sum / B + wd * w; v = mu * v + g; w -= lr * v (B = 4, lr = 0.1, mu = 0.9, wd = 0.01).
  Sgd sgd(2, 0.9, 0.01);
  std::vector<float> w = {1.0f, -2.0f};
  const std::vector<float> grad_sum = {4.0f, 8.0f};
  sgd.step(w.data(), grad_sum.data(), 4, 0.1);
  // g = (1.01, 1.98) -> w = (0.899, -2.198)
  EXPECT_NEAR(w[0], 0.899, 1e-6);
  EXPECT_NEAR(w[1], -2.198, 1e-6);
  EXPECT_NEAR(sgd.velocity()[0], 1.01, 1e-6);
  sgd.step(w.data(), grad_sum.data(), 4, 0.1);
  // g = (1.00899, 1.97802), v = 0.9 * (1.01, 1.98) + g = (1.91799, 3.76002)
  EXPECT_NEAR(sgd.velocity()[0], 1.91799, 1e-6);
  EXPECT_NEAR(sgd.velocity()[1], 3.76002, 1e-6);
  EXPECT_NEAR(w[0], 0.707201, 1e-6);
  EXPECT_NEAR(w[1], -2.574002, 1e-6);
}

TEST(Sgd, PlainStepDividesByTheGlobalBatch) {
  Sgd sgd(1, 0.0, 0.0);
  float w = 3.0f;
  const float g = 10.0f;
  sgd.step(&w, &g, 5, 0.25);
  EXPECT_FLOAT_EQ(w, 3.0f - 0.25f * 2.0f);
}

TEST(Sgd, LargeBufferMatchesAScalarLoop) {
  // Each element must follow the same formula, on whichever path the pass takes.
  const size_t count = 300001;
  std::mt19937_64 rng(9);
  auto w = testing::random_floats(count, rng), g = testing::random_floats(count, rng);
  auto w_ref = w;
  std::vector<float> v_ref(count, 0.0f);
  Sgd sgd(count, 0.9, 5e-4);
  for (int step = 0; step < 3; ++step) {
    sgd.step(w.data(), g.data(), 256, 0.05);
    for (size_t i = 0; i < count; ++i) {
      const float gi = g[i] * float(1.0 / 256) + float(5e-4) * w_ref[i];
      v_ref[i] = 0.9f * v_ref[i] + gi;
      w_ref[i] -= 0.05f * v_ref[i];
    }
  }
  EXPECT_TRUE(testing::all_close(w, w_ref, 1e-6));
  EXPECT_TRUE(testing::all_close(sgd.velocity(), v_ref, 1e-6));
}

TEST(Sgd, SplitPassGivesTheBitsOfOneThread) {
  // 2 threads just after a parallel region (the team is awake: the 128k-2^20 pass may split) against one
  // thread: element-wise, so the same bits whichever way the pass ran.
  const size_t count = 300001;
  std::mt19937_64 rng(11);
  const auto g = testing::random_floats(count, rng);
  auto w_split = testing::random_floats(count, rng);
  auto w_one = w_split;
  Sgd split(count, 0.9, 5e-4), one(count, 0.9, 5e-4);
  set_num_threads(2);
  for (int step = 0; step < 3; ++step) {
    mark_team_released();
    split.step(w_split.data(), g.data(), 64, 0.05);
    const OneThreadScope single;
    EXPECT_FALSE(team_is_awake());  // one thread: nothing to wake
    one.step(w_one.data(), g.data(), 64, 0.05);
  }
  set_num_threads(1);
  EXPECT_EQ(w_split, w_one);
  EXPECT_EQ(split.velocity(), one.velocity());
}

TEST(Sgd, RejectsBadArguments) {
  EXPECT_THROW(Sgd(3, 1.0, 0.0), std::invalid_argument);
  EXPECT_THROW(Sgd(3, 0.9, -1.0), std::invalid_argument);
  Sgd sgd(1, 0.9, 0.0);
  float w = 0, g = 0;
  EXPECT_THROW(sgd.step(&w, &g, 0, 0.1), std::invalid_argument);
}

TEST(LrSchedule, WarmupThenConstant) {
  const LrSchedule s = parse_lr_schedule("constant", 0.4, 4, 100);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.2);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.4);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.4);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.4);
  EXPECT_DOUBLE_EQ(parse_lr_schedule("constant", 0.4, 0, 0).lr_at(0), 0.4);
}

TEST(LrSchedule, StepDecaysEveryIntervalAfterWarmup) {
  const LrSchedule s = parse_lr_schedule("step:10:0.5", 1.0, 5, 0);
  EXPECT_EQ(s.step_every, 10);
  EXPECT_DOUBLE_EQ(s.step_gamma, 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.6);  // warm-up: 3/5
  EXPECT_DOUBLE_EQ(s.lr_at(5), 1.0);  // first post-warm-up iteration
  EXPECT_DOUBLE_EQ(s.lr_at(14), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(15), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(35), 0.125);
}

TEST(LrSchedule, CosineFromBaseToZero) {
  const LrSchedule s = parse_lr_schedule("cosine", 0.2, 0, 100);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.2);
  EXPECT_NEAR(s.lr_at(50), 0.1, 1e-12);
  EXPECT_NEAR(s.lr_at(25), 0.1 * (1 + std::cos(M_PI / 4)), 1e-12);
  EXPECT_EQ(s.lr_at(100), 0.0);
  EXPECT_EQ(s.lr_at(500), 0.0);
  for (int i = 1; i < 100; ++i) EXPECT_LE(s.lr_at(i), s.lr_at(i - 1));
  const LrSchedule warm = parse_lr_schedule("cosine", 0.2, 10, 110);
  EXPECT_DOUBLE_EQ(warm.lr_at(9), 0.2);
  EXPECT_DOUBLE_EQ(warm.lr_at(10), 0.2);
  EXPECT_NEAR(warm.lr_at(60), 0.1, 1e-12);
}

TEST(LrSchedule, ParseErrorsNameTheSpec) {
  for (const char* spec :
       {"linear", "step:abc:0.1", "step:10", "step:0:0.1", "step:10:0", "step:10:0.1x", ""}) {
    try {
      parse_lr_schedule(spec, 0.1, 0, 100);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(spec) + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_lr_schedule("cosine", 0.1, 10, 10), std::invalid_argument);
  EXPECT_THROW(parse_lr_schedule("constant", 0.1, -1, 10), std::invalid_argument);
}

TEST(LrSchedule, KindIsAnEnumAndErrorsAreInTheSpecStyle) {
  EXPECT_EQ(parse_lr_schedule("constant", 0.1, 0, 100).kind, LrSchedule::Kind::kConstant);
  EXPECT_EQ(parse_lr_schedule("step:10:0.5", 0.1, 0, 100).kind, LrSchedule::Kind::kStep);
  EXPECT_EQ(parse_lr_schedule("cosine", 0.1, 0, 100).kind, LrSchedule::Kind::kCosine);
  for (const auto& [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"linear", "unknown kind"},
           {"step:0:0.1", "EVERY must be positive"},
           {"step", "missing ':EVERY:GAMMA'"},
           {"cosine:1", "'cosine' takes no arguments"},
           {"step:10:0.5;x=1", "'step' takes no ;KEY=VALUE options, got 'x'"},
           {"step:5:inf", "GAMMA must be finite"}}) {
    try {
      parse_lr_schedule(spec, 0.1, 0, 100);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "--lr-schedule: " + why + " (in '" + spec + "'; valid: constant, step:EVERY:GAMMA, cosine)");
    }
  }
}

}  // namespace
}  // namespace lbbsp::models
