// Chrome-trace/Perfetto timeline (Trace Event Format JSON array), written off the training thread: events are
// queued and a writer thread formats and appends them (as Horovod's timeline writer does). The file ends with
// "]" after every write, so it stays valid JSON while the job runs and if it dies.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lbbsp::runtime {

// Iterations [first, end) that the timeline records (--timeline-iterations FIRST:END); all by default.
struct TimelineWindow {
  int64_t first = 0;
  int64_t end = INT64_MAX;
  bool contains(int64_t iteration) const { return iteration >= first && iteration < end; }
};
// "" -> everything; "A:B" -> [A, B). Throws std::invalid_argument naming --timeline-iterations.
TimelineWindow parse_timeline_window(const std::string& spec);

class Timeline {
 public:
  // max_queued: events waiting for the writer before flush() blocks (bounds memory if the disk is slow).
  explicit Timeline(const std::string& path, size_t max_queued = 1 << 18);
  ~Timeline();  // writes every queued event, then closes the file
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A complete event ("ph":"X") on track `track` of process `pid` (= rank); times in seconds since the start.
  // track and name must be string literals (they are kept by pointer until written). args_json: "" or an
  // object.
  void complete(int pid, const char* track, const char* name, double start_s, double dur_s,
                const std::string& args_json = "");
  // The same with args {"iteration", "batch", "predicted_s"}, formatted by the writer thread.
  void compute(int pid, double start_s, double dur_s, int64_t iteration, int64_t batch, double predicted_s);
  void name_process(int pid, const std::string& name);
  // Hands the events so far to the writer thread and returns (waits only while max_queued are pending).
  // Throws std::runtime_error when an earlier write failed (disk full, ...).
  void flush();
  // flush(), then waits until the file holds every event handed over.
  void sync();

 private:
  struct Event {
    char phase;  // 'X' complete, 'C' compute (an X with structured args), 'M' process name
    int pid;
    const char* track;
    const char* name;
    double start_s, dur_s;
    int64_t iteration, batch;
    double predicted_s;
    std::string text;  // args JSON ('X') or the process name ('M')
  };
  void writer_loop();
  void write_events(const std::vector<Event>& events);
  void append_event(const Event& e, std::string* out);

  std::string path_;
  int fd_ = -1;
  long long end_pos_ = 0;  // where the closing "\n]\n" starts
  bool first_ = true;      // writer thread only
  size_t max_queued_;
  std::vector<Event> pending_;  // training thread only

  std::mutex mu_;
  std::condition_variable wake_writer_, written_;
  std::vector<Event> handed_;  // guarded by mu_
  uint64_t handed_count_ = 0, written_count_ = 0;
  bool stop_ = false;
  bool wake_ = false;  // write now: sync(), back-pressure or many events handed over
  std::string error_;
  std::thread writer_;
};

}  // namespace lbbsp::runtime
