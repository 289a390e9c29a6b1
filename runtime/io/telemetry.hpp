// Per-iteration, per-rank telemetry (HDF5 and optional CSV in --log-dir) and the run's timeline
// (runtime/io/timeline.hpp). Rank 0 writes both: every rank's timings reach it in the gradient allreduce
// buffer.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/h5.hpp"
#include "runtime/io/timeline.hpp"

namespace lbbsp::runtime {

struct IterationRecord {
  int64_t iteration = 0;
  int32_t rank = 0;
  int64_t batch = 0;
  double compute_s = 0;        // compute of this rank's slice, emulated slow-down included
  double wait_s = 0;           // waiting for the slowest rank at the allreduce
  double allreduce_s = 0;      // the reduction itself
  double balancer_s = 0;       // deciding and broadcasting the next batch vector (coordination)
  double predicted_speed = 0;  // samples/s the balancer expected for this iteration (0 when none)
  double actual_speed = 0;     // batch / compute_s
  double cpu_avail = 0, mem_avail = 0, load = 0;
  double capacity = 1;  // emulated capacity factor
  double time_s = 0;    // when the iteration's compute began, Unix time (to line it up with other logs)
};

// Columnar HDF5 layout: group /records with one 1-D dataset per field above (same names), one row per
// (iteration, rank); attributes on /records name the run (model, balancer, straggle, ranks, global_batch).
// The datasets are chunked and extendible: flush() appends the buffered rows and flushes the file, so its
// cost depends on the rows since the last flush, not on the length of the run, and the file on disk holds
// every row flushed so far if the process is killed. The file stays open (without a lock, so that readers may
// look in while the run goes on).
class TelemetryWriter {
 public:
  static constexpr size_t kMaxBufferedRows = 1 << 16;  // add() flushes by itself at this many
  TelemetryWriter(const std::string& dir, bool csv, std::vector<std::pair<std::string, std::string>> attrs,
                  size_t max_buffered_rows = kMaxBufferedRows);
  ~TelemetryWriter();
  TelemetryWriter(const TelemetryWriter&) = delete;
  TelemetryWriter& operator=(const TelemetryWriter&) = delete;
  void add(const IterationRecord& r);
  void flush();
  int64_t rows_written() const { return rows_written_; }
  size_t rows_buffered() const { return rows_.size(); }

 private:
  void create_file(const std::vector<std::pair<std::string, std::string>>& attrs);
  void append_columns();
  std::string path_;
  h5::Handle file_;
  std::vector<h5::Handle> columns_;  // iteration, rank, batch, then the float64 fields in kDoubleFields order
  std::vector<IterationRecord> rows_;
  size_t max_rows_;
  int64_t rows_written_ = 0;
  std::FILE* csv_ = nullptr;
};

struct RunLogConfig {
  std::string log_dir;  // telemetry when not empty
  bool csv = false;
  std::vector<std::pair<std::string, std::string>> attrs;  // on /records
  std::string timeline;                                    // timeline JSON when not empty
  TimelineWindow timeline_window;
  int ranks = 1;
  int64_t flush_every = 200;  // iterations between telemetry flushes
};

// Rank 0's logs of one run: telemetry rows and timeline slices per iteration, and the time they cost the
// training thread (io_s: while rank 0 writes, the other ranks wait for it at the next allreduce). That time
// is also a slice "io" on rank 0's timeline whenever it flushed the telemetry or took over a millisecond.
class RunLog {
 public:
  explicit RunLog(const RunLogConfig& cfg);
  // The timeline's time zero (the training clock's start).
  void set_origin(std::chrono::steady_clock::time_point t0) { t0_ = t0; }
  // One record per rank, in rank order; start_s: when the iteration's compute began, seconds since the
  // origin.
  void add_iteration(double start_s, const std::vector<IterationRecord>& ranks);
  void finish();  // flushes both: call at the end of the run
  double io_s() const { return io_s_; }

 private:
  void add_slices(double start_s, const std::vector<IterationRecord>& ranks);
  double since_origin(std::chrono::steady_clock::time_point t) const;
  std::unique_ptr<TelemetryWriter> telemetry_;
  std::unique_ptr<Timeline> timeline_;
  TimelineWindow window_;
  int64_t flush_every_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double io_s_ = 0;
  bool in_window_ = false;  // the last iteration was inside the timeline's window
};

}  // namespace lbbsp::runtime
