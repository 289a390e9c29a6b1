// `lbbsp report`: reads the telemetry (and summary) of finished runs and says where the time went: per rank
// the wait at the barrier, straggler episodes, the predictor's error, and what balancing saved against an
// equal split. Pure reading and arithmetic, no MPI. docs/report.md explains every number.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lbbsp::runtime::report {

// One run's --log-dir: the columns of telemetry.h5 /records (one row per iteration and rank) and
// summary.json.
struct RunData {
  std::string dir, file;  // the folder and its telemetry.h5
  std::string model, balancer, predictor, straggle;
  int ranks = 0;
  int64_t global_batch = 0;
  std::vector<int64_t> iteration, batch, rank;
  std::vector<double> compute_s, wait_s, allreduce_s, balancer_s, predicted_speed, actual_speed, cpu_avail,
      capacity;
  nlohmann::json summary;  // null when the run has no summary.json
};

// Reads DIR/telemetry.h5 and, when present, DIR/summary.json. Throws std::runtime_error naming the file when
// a folder has no telemetry, the file is truncated or not HDF5, a field is missing, or the rows do not form
// complete iterations of every rank.
RunData load_run(const std::string& dir);

struct Options {
  double slow_below = 0.8;  // a rank straggles when its speed is below this fraction of the others' median
  int64_t min_episode = 5;  // iterations from an episode's first to its last slow one, at least
  int64_t episode_gap = 2;  // this many normal iterations inside an episode do not end it
};

struct RankStats {
  int rank = 0;
  double mean_batch = 0, compute_s = 0, wait_s = 0, speed = 0, cpu_avail = 0;
  double predictor_error = -1;  // mean |predicted - actual| / actual speed; -1 without predictions
  int64_t predictions = 0, idle_iterations = 0;
};

struct Episode {
  int rank = 0;
  int64_t first = 0, last = 0, slow_iterations = 0, idle_iterations = 0;
  double relative_speed = 0;  // mean of speed / the other ranks' median speed over its slow iterations
  double cpu_avail = 0, capacity = 0;  // means over its slow iterations
  double delay_s = 0;                  // how long the others waited for this rank beyond the next-slowest one
};

struct RunReport {
  std::string name, dir, model, balancer, predictor, straggle;
  int ranks = 0;
  int64_t global_batch = 0, iterations = 0, first_iteration = 0, last_iteration = 0;
  // The run's training time: the summary's train_time_s (the loop as timed by lbbsp train) when summary.json
  // covers the same iterations, else telemetry_time_s.
  double time_s = 0;
  double telemetry_time_s = 0;  // sum over iterations of the slowest compute + allreduce + coordination
  bool time_from_summary = false;
  double mean_iteration_s = 0;  // time_s / iterations
  double wait_rank_s = 0;       // rank-seconds spent waiting for the slowest rank
  double wait_fraction = 0;     // wait_rank_s / (ranks * time_s)
  double predictor_error = -1;  // over all ranks, -1 without predictions
  // Equal split estimated from each iteration's measured speeds (a rank's latest when it had no samples).
  double compute_s = 0;      // sum of the slowest rank's compute, as run
  double equal_split_s = 0;  // the same had every rank got global_batch / ranks
  double ideal_s = 0;        // the same had every rank finished together: global_batch / sum of speeds
  int64_t estimated_iterations = 0;  // iterations where every rank's speed was known
  std::vector<RankStats> per_rank;
  std::vector<Episode> episodes;
  nlohmann::json summary;
};

RunReport analyse(const RunData& run, const Options& opt);

// Runs are named by their folder; when two folders have the same name, every run is named parent/folder.
void disambiguate_names(std::vector<RunReport>& runs);

// Markdown: with several runs a side-by-side table first, then each run's per-rank table and episodes (the
// longest max_episodes). Throws std::runtime_error when the runs have different rank counts.
std::string to_markdown(const std::vector<RunReport>& runs, size_t max_episodes);
nlohmann::json to_json(const std::vector<RunReport>& runs);

// Throws naming both files when the runs do not have the same rank count.
void check_comparable(const std::vector<RunData>& runs);

}  // namespace lbbsp::runtime::report
