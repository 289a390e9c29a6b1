// Per-iteration, per-rank telemetry (HDF5 and optional CSV in --log-dir) and a Chrome-trace/Perfetto
// timeline. Rank 0 writes both: every rank's timings reach it in the gradient allreduce buffer.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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
};

// Columnar HDF5 layout: group /records with one 1-D dataset per field above (same names), one row per
// (iteration, rank); attributes on /records name the run (model, balancer, straggle, ranks, global_batch).
class TelemetryWriter {
 public:
  TelemetryWriter(const std::string& dir, bool csv, std::vector<std::pair<std::string, std::string>> attrs);
  ~TelemetryWriter();
  void add(const IterationRecord& r);
  void flush();  // rewrites telemetry.h5 atomically (temp file + rename)

 private:
  std::string dir_;
  std::vector<std::pair<std::string, std::string>> attrs_;
  std::vector<IterationRecord> rows_;
  std::FILE* csv_ = nullptr;
  size_t flushed_rows_ = 0;
};

// Trace Event Format JSON array; the file always ends with "]" so it stays valid JSON if the job dies.
class Timeline {
 public:
  explicit Timeline(const std::string& path);
  ~Timeline();
  // A complete event ("ph":"X") on track `tid` of process `pid` (= rank); times in seconds since the start.
  void complete(int pid, const char* tid, const char* name, double start_s, double dur_s,
                const std::string& args_json);
  void name_process(int pid, const std::string& name);
  void flush();

 private:
  std::FILE* f_ = nullptr;
  std::string pending_;
  bool first_ = true;
  long end_pos_ = 0;
  std::string path_;
};

}  // namespace lbbsp::runtime
