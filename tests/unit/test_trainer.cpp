// The trainer's small parts: the reduction buffer's layout, the run statistics a checkpoint carries, and the
// --inject-fault grammar.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/train/fault_injection.hpp"
#include "runtime/train/reduction_buffer.hpp"
#include "runtime/train/run_stats.hpp"

using namespace lbbsp::runtime;

TEST(ReductionBuffer, LaysOutGradientTotalsSlotsAndNextBatch) {
  const size_t P = 10;
  const int R = 3;
  ReductionBuffer b(P, R);
  ASSERT_EQ(b.size(), P + 2 + R * kSlotFields + R);
  EXPECT_EQ(b.extra(), b.size() - P);
  EXPECT_EQ(b.coordination_floats(), static_cast<size_t>(R * kSlotFields + R));
  b.clear();
  b.set_totals(2.5, 7);
  EXPECT_EQ(b.data()[P], 2.5f);
  EXPECT_EQ(b.data()[P + 1], 7.0f);
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(b.slot(r), b.data() + P + 2 + r * kSlotFields);
    b.slot(r)[kCompute] = static_cast<float>(r + 1);
  }
  b.set_next_batch({4, 0, 60});
  EXPECT_EQ(b.data()[P + 2 + R * kSlotFields + 2], 60.0f);
  EXPECT_EQ(b.next_batch(), (std::vector<int64_t>{4, 0, 60}));
  // Nothing written past the layout disturbed the slots or the totals.
  EXPECT_EQ(b.loss_sum(), 2.5);
  EXPECT_EQ(b.correct(), 7.0);
  EXPECT_EQ(b.max_compute(), 3.0);
  EXPECT_EQ(b.wait_sum(3.0), 2.0 + 1.0 + 0.0);
  EXPECT_EQ(b.field(1, kCompute), 2.0);
}

TEST(ReductionBuffer, StopSignalIsTheFirstNonZeroInRankOrder) {
  ReductionBuffer b(4, 3);
  b.clear();
  EXPECT_EQ(b.stop_signal(), 0);
  b.slot(2)[kStop] = 10;
  EXPECT_EQ(b.stop_signal(), 10);
  b.slot(1)[kStop] = 15;
  EXPECT_EQ(b.stop_signal(), 15);
}

TEST(RunStats, CheckpointObjectKeepsItsKeysTypesAndRoundTrips) {
  RunStats s;
  s.train_time = 1.5;
  s.coord_time = 0.25;
  s.wait_rank_time = 0.125;
  s.last_iter_s = 0.0625;
  s.epoch_loss = 3;
  s.epoch_samples = 64;
  s.epoch_correct = 40;
  s.last_test_acc = 0.75;
  s.time_to_target = -1;
  s.curve.push_back({{"iteration", 10}, {"test_accuracy", 0.75}});
  s.predicted = {100, 200};
  s.io_before = 0.5;
  const nlohmann::json j = s.to_json(0.25);
  // The exact text every checkpoint so far holds (keys sorted, NaN as null, counts as integers).
  EXPECT_EQ(
      j.dump(),
      "{\"coord_time\":0.25,\"curve\":[{\"iteration\":10,\"test_accuracy\":0.75}],\"epoch_correct\":40,"
      "\"epoch_loss\":3.0,\"epoch_samples\":64,\"io_time\":0.75,\"last_iter_s\":0.0625,"
      "\"last_test_acc\":0.75,\"last_test_loss\":null,\"last_train_loss\":null,\"predicted\":[100.0,200.0],"
      "\"time_to_target\":-1.0,\"train_time\":1.5,\"wait_rank_time\":0.125}");
  const RunStats r = RunStats::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(r.to_json(0.0), j);
  EXPECT_TRUE(std::isnan(r.last_train_loss));
  EXPECT_EQ(r.io_before, 0.75);
  EXPECT_EQ(r.epoch_samples, 64);
}

// Every checkpoint read has all the keys (the older ones without "io_time" or "predicted" also lack the
// optimiser record, and read_checkpoint refuses them first).
TEST(RunStats, EveryKeyIsRequired) {
  const nlohmann::json full = RunStats{}.to_json(0);
  for (const char* key : {"io_time", "predicted", "train_time"}) {
    nlohmann::json j = full;
    j.erase(key);
    EXPECT_THROW(RunStats::from_json(j), nlohmann::json::exception) << key;
  }
}

TEST(InjectFault, ParsesRankIterationKind) {
  EXPECT_EQ(parse_fault("", 2).kind, FaultKind::kNone);
  const Fault f = parse_fault("1:7:hang", 2);
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.iteration, 7);
  EXPECT_EQ(f.kind, FaultKind::kHang);
  EXPECT_EQ(parse_fault("0:0:nan", 1).kind, FaultKind::kNan);
}

TEST(InjectFault, ErrorsNameTheSpecInTheSharedStyle) {
  auto message = [](const std::string& spec) {
    try {
      parse_fault(spec, 2);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("x"),
            "--inject-fault: expected RANK:ITERATION:KIND (in 'x'; valid: RANK:ITERATION:KIND, KIND = throw, "
            "abort, nan or hang)");
  EXPECT_NE(message("0:1:2:throw").find("expected RANK:ITERATION:KIND (in '0:1:2:throw'"), std::string::npos);
  EXPECT_NE(message("a:1:throw").find("RANK and ITERATION must be integers (in 'a:1:throw'"),
            std::string::npos);
  EXPECT_NE(message("0:1x:throw").find("RANK and ITERATION must be integers"), std::string::npos);
  EXPECT_NE(message("0:1:explode").find("KIND must be throw, abort, nan or hang (in '0:1:explode'"),
            std::string::npos);
  EXPECT_NE(message("2:1:throw").find("rank 2 is not in 0..1 (in '2:1:throw'"), std::string::npos);
  EXPECT_NE(message("-1:1:throw").find("rank -1 is not in 0..1"), std::string::npos);
}
