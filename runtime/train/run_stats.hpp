// The trainer's running statistics: what the progress lines and the summary report, and what a checkpoint
// carries so that a resumed run reports as if it had never stopped (TrainState::stats, as one JSON object).
#pragma once
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace lbbsp::runtime {

struct RunStats {
  double train_time = 0;      // seconds in training iterations (evaluation and logging excluded)
  double coord_time = 0;      // of which deciding and distributing batch vectors
  double wait_rank_time = 0;  // rank-seconds spent waiting for the slowest rank
  double last_iter_s = 0;
  double epoch_loss = 0;  // loss sum of the current epoch so far
  int64_t epoch_samples = 0, epoch_correct = 0;
  double last_train_loss = NAN;  // mean loss of the last finished epoch
  double last_test_acc = NAN, last_test_loss = NAN;
  double time_to_target = -1;  // train_time when --target-accuracy was first reached (-1: not yet)
  nlohmann::json curve = nlohmann::json::array();  // one object per evaluation
  std::vector<double> predicted;  // rank 0: speeds the balancer predicted for the coming iteration
  double io_before = 0;           // rank 0's logging time in the runs before a resume

  // The checkpoint's "stats" object (keys and types as in every checkpoint so far); io_now: this run's
  // logging time, stored with io_before as "io_time".
  nlohmann::json to_json(double io_now) const;
  // The inverse; throws nlohmann::json::exception when a key is missing.
  static RunStats from_json(const nlohmann::json& j);
};

}  // namespace lbbsp::runtime
