// The peers of bench/train_peers.cpp (OmniLearn's controller, the naive proportional one) as the benchmark
// runs them, and register_balancer(), through which they become balancer kinds.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer.hpp"
#include "balancer_cluster.hpp"

using namespace lbbsp::balancer;
using namespace lbbsp::balancer::test_cluster;

namespace {

std::string message_of(const std::string& name) {
  try {
    make_balancer(config(name, 2, 300));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

// Two workers, the second twice as fast: the oracle split of 300 is {100, 200}.
Cluster two_speeds(size_t iterations) {
  Cluster c;
  c.base_speed = {100.0, 200.0};
  c.capacity.assign(iterations + 1, std::vector<double>(2, 1.0));
  return c;
}

}  // namespace

TEST(RegisteredBalancers, AreBuiltFromTheirSpecAndListedInTheErrors) {
  EXPECT_EQ(make_balancer(config("omnilearn", 2, 300))->name(), "omnilearn");
  EXPECT_EQ(make_balancer(config("omnilearn:5", 2, 300))->name(), "omnilearn");
  EXPECT_EQ(make_balancer(config("naive", 2, 300))->name(), "naive");
  EXPECT_NE(message_of("nope").find("oracle, naive[:ARGS], omnilearn[:ARGS])"), std::string::npos)
      << message_of("nope");
  EXPECT_EQ(message_of("omnilearn:0"), "omnilearn:WINDOW takes a window of >= 1 iterations, got '0'");
  EXPECT_EQ(message_of("naive:2"), "naive takes no arguments, got '2'");
  EXPECT_NE(message_of("naive;band=1").find("'naive' takes no ;KEY=VALUE options"), std::string::npos)
      << message_of("naive;band=1");
  const auto factory = [](const BalancerConfig& cfg, const std::string&) { return make_balancer(cfg); };
  for (const char* taken : {"bsp", "lbbsp-cpu", "naive", "", "a:b", "a;b"})
    EXPECT_THROW(register_balancer(taken, factory), std::invalid_argument) << taken;
  EXPECT_THROW(register_balancer("unset", BalancerFactory{}), std::invalid_argument);
  register_balancer("null",
                    [](const BalancerConfig&, const std::string&) { return std::unique_ptr<Balancer>{}; });
  EXPECT_NE(message_of("null").find("the factory registered for 'null' returned no balancer"),
            std::string::npos)
      << message_of("null");
}

TEST(OmniLearnPeer, HoldsItsSplitForAWindowThenMovesByTheTimeDifference) {
  auto b = make_balancer(config("omnilearn", 2, 300));
  const Cluster c = two_speeds(40);
  std::vector<int64_t> batch = b->initial();
  EXPECT_EQ(batch, (std::vector<int64_t>{150, 150}));
  for (size_t t = 0; t < 19; ++t) {
    batch = b->next(c.report(t, batch));
    ASSERT_EQ(batch, (std::vector<int64_t>{150, 150})) << "moved before its window ended, at " << t;
  }
  // t = 1.5 and 0.75 s, mean 1.125: b -= (b / t)(t - mean) gives 112.5 and 225, normalised to 300
  batch = b->next(c.report(19, batch));
  EXPECT_EQ(batch, (std::vector<int64_t>{100, 200}));
  for (size_t t = 20; t < 40; ++t) batch = b->next(c.report(t, batch));  // balanced: inside the 5% dead band
  EXPECT_EQ(batch, (std::vector<int64_t>{100, 200}));
  EXPECT_THROW(b->save_state(), std::runtime_error);  // no checkpoints: a benchmark runs without them
  EXPECT_THROW(b->load_state(""), std::runtime_error);
}

TEST(NaivePeer, SplitsByTheSmoothedMeasuredSpeedsEveryIteration) {
  auto b = make_balancer(config("naive", 2, 300));
  Cluster c = two_speeds(3);
  c.capacity[1] = {1.0, 0.25};  // the second worker slows to 50 samples/s for one iteration
  std::vector<int64_t> batch = b->next(c.report(0, b->initial()));
  EXPECT_EQ(batch, (std::vector<int64_t>{100, 200}));
  batch = b->next(c.report(1, batch));  // speeds (100+100)/2 and (200+50)/2: 200 / 225 of the sum
  EXPECT_EQ(batch, (std::vector<int64_t>{133, 167}));
  auto garbage = c.report(2, batch);
  garbage.workers[1].compute_s = 0.0;  // no speed measured: the last estimate stands
  EXPECT_EQ(b->next(garbage), batch);
}
