#include "runtime/io/timeline.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace lbbsp::runtime {

namespace {

constexpr const char* kTail = "\n]\n";
constexpr size_t kWakeAt = 8192;  // events handed over that wake the writer at once
constexpr auto kWritePeriod = std::chrono::milliseconds(200);  // otherwise it writes this often

int64_t parse_iteration(const std::string& spec, const std::string& part) {
  int64_t v = -1;
  auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
  if (part.empty() || ec != std::errc() || p != part.data() + part.size() || v < 0) {
    throw std::invalid_argument("--timeline-iterations '" + spec +
                                "': expected FIRST:END, two iterations >= 0 (records FIRST .. END-1, "
                                "e.g. 1000:1200)");
  }
  return v;
}

void put(std::string* out, const char* s) {
  out->append(s);
}
void put(std::string* out, int64_t v) {
  char buf[24];
  out->append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}
// JSON has no inf or NaN: those are written as 0.
void put_fixed(std::string* out, double v, int decimals) {
  char buf[400];  // the longest double in fixed notation has 309 digits before the point
  auto r =
      std::to_chars(buf, buf + sizeof buf, std::isfinite(v) ? v : 0.0, std::chars_format::fixed, decimals);
  out->append(buf, r.ec == std::errc() ? r.ptr : buf);
}
// Microseconds with 3 decimals (nanosecond resolution), as Perfetto reads "ts" and "dur".
void put_us(std::string* out, double seconds) {
  put_fixed(out, seconds * 1e6, 3);
}

}  // namespace

TimelineWindow parse_timeline_window(const std::string& spec) {
  TimelineWindow w;
  if (spec.empty()) return w;
  const auto colon = spec.find(':');
  if (colon == std::string::npos) parse_iteration(spec, "");  // throws the message
  w.first = parse_iteration(spec, spec.substr(0, colon));
  w.end = parse_iteration(spec, spec.substr(colon + 1));
  if (w.end <= w.first) {
    throw std::invalid_argument("--timeline-iterations '" + spec +
                                "': END must be larger than FIRST (records " + "FIRST .. END-1)");
  }
  return w;
}

Timeline::Timeline(const std::string& path, size_t max_queued) : path_(path), max_queued_(max_queued) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("--timeline: cannot write '" + path + "' (check the folder exists)");
  const std::string head = std::string("[") + kTail;
  if (::pwrite(fd_, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size())) {
    ::close(fd_);
    throw std::runtime_error("--timeline: cannot write '" + path + "': " + std::strerror(errno));
  }
  end_pos_ = 1;
  writer_ = std::thread([this] { writer_loop(); });
}

Timeline::~Timeline() {
  try {
    flush();
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_writer_.notify_one();
  writer_.join();
  ::close(fd_);
}

void Timeline::complete(int pid, const char* track, const char* name, double start_s, double dur_s,
                        const std::string& args_json) {
  pending_.push_back({'X', pid, track, name, start_s, dur_s, 0, 0, 0, args_json});
}

void Timeline::compute(int pid, double start_s, double dur_s, int64_t iteration, int64_t batch,
                       double predicted_s) {
  pending_.push_back({'C', pid, "compute", "compute", start_s, dur_s, iteration, batch, predicted_s, {}});
}

void Timeline::name_process(int pid, const std::string& name) {
  pending_.push_back({'M', pid, nullptr, nullptr, 0, 0, 0, 0, 0, name});
}

void Timeline::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!error_.empty()) throw std::runtime_error(error_);
  if (pending_.empty()) return;
  if (handed_.size() >= max_queued_) {
    // Back-pressure: a writer this far behind makes the training thread wait (counted as its I/O time).
    wake_ = true;
    wake_writer_.notify_one();
    written_.wait(lock, [&] { return handed_.size() < max_queued_ || !error_.empty(); });
  }
  handed_.insert(handed_.end(), std::make_move_iterator(pending_.begin()),
                 std::make_move_iterator(pending_.end()));
  handed_count_ += pending_.size();
  pending_.clear();
  if (handed_.size() >= std::min(kWakeAt, max_queued_ / 2) && !wake_) {
    wake_ = true;
    lock.unlock();
    wake_writer_.notify_one();
  }
}

void Timeline::sync() {
  flush();
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = handed_count_;
  wake_ = true;
  wake_writer_.notify_one();
  written_.wait(lock, [&] { return written_count_ >= target || !error_.empty(); });
  if (!error_.empty()) throw std::runtime_error(error_);
}

void Timeline::writer_loop() {
  std::vector<Event> batch;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_writer_.wait_for(lock, kWritePeriod, [&] { return stop_ || wake_; });
    wake_ = false;
    if (handed_.empty() && stop_) return;
    if (handed_.empty()) continue;
    batch.swap(handed_);
    lock.unlock();
    std::string error;
    try {
      write_events(batch);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    if (!error.empty() && error_.empty()) error_ = error;
    written_count_ += batch.size();
    batch.clear();
    written_.notify_all();
  }
}

// One pwrite of the new events and the closing bracket over the old one: the file is valid JSON before and
// after.
void Timeline::write_events(const std::vector<Event>& events) {
  std::string out;
  out.reserve(events.size() * 120 + 4);
  for (const auto& e : events) append_event(e, &out);
  const size_t body = out.size();
  out += kTail;
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pwrite(fd_, out.data() + done, out.size() - done, end_pos_ + static_cast<long long>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("--timeline: cannot write '" + path_ + "': " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  end_pos_ += static_cast<long long>(body);
}

void Timeline::append_event(const Event& e, std::string* out) {
  put(out, first_ ? "\n{\"ph\":\"" : ",\n{\"ph\":\"");
  first_ = false;
  if (e.phase == 'M') {
    put(out, "M\",\"pid\":");
    put(out, static_cast<int64_t>(e.pid));
    put(out, ",\"name\":\"process_name\",\"args\":{\"name\":\"");
    put(out, e.text.c_str());
    put(out, "\"}}");
    return;
  }
  put(out, "X\",\"pid\":");
  put(out, static_cast<int64_t>(e.pid));
  put(out, ",\"tid\":\"");
  put(out, e.track);
  put(out, "\",\"name\":\"");
  put(out, e.name);
  put(out, "\",\"ts\":");
  put_us(out, e.start_s);
  put(out, ",\"dur\":");
  put_us(out, e.dur_s);
  if (e.phase == 'C') {
    put(out, ",\"args\":{\"iteration\":");
    put(out, e.iteration);
    put(out, ",\"batch\":");
    put(out, e.batch);
    put(out, ",\"predicted_s\":");
    put_fixed(out, e.predicted_s, 6);
    put(out, "}");
  } else if (!e.text.empty()) {
    put(out, ",\"args\":");
    put(out, e.text.c_str());
  }
  put(out, "}");
}

}  // namespace lbbsp::runtime
