#include "runtime/telemetry.hpp"

#include <filesystem>
#include <stdexcept>

#include "runtime/h5.hpp"

namespace lbbsp::runtime {

TelemetryWriter::TelemetryWriter(const std::string& dir, bool csv,
                                 std::vector<std::pair<std::string, std::string>> attrs)
    : dir_(dir), attrs_(std::move(attrs)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw std::runtime_error("--log-dir: cannot create '" + dir_ + "': " + ec.message());
  if (csv) {
    csv_ = std::fopen((dir_ + "/telemetry.csv").c_str(), "w");
    if (!csv_) throw std::runtime_error("--log-dir: cannot write '" + dir_ + "/telemetry.csv'");
    std::fprintf(csv_,
                 "iteration,rank,batch,compute_s,wait_s,allreduce_s,balancer_s,predicted_speed,actual_speed,"
                 "cpu_avail,mem_avail,load,capacity\n");
  }
}

TelemetryWriter::~TelemetryWriter() {
  try {
    flush();
  } catch (...) {
  }
  if (csv_) std::fclose(csv_);
}

void TelemetryWriter::add(const IterationRecord& r) {
  rows_.push_back(r);
  if (csv_) {
    std::fprintf(csv_, "%lld,%d,%lld,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.6g,%.6g,%.6g,%.6g\n",
                 static_cast<long long>(r.iteration), r.rank, static_cast<long long>(r.batch), r.compute_s,
                 r.wait_s, r.allreduce_s, r.balancer_s, r.predicted_speed, r.actual_speed, r.cpu_avail,
                 r.mem_avail, r.load, r.capacity);
  }
}

void TelemetryWriter::flush() {
  if (csv_) std::fflush(csv_);
  if (flushed_rows_ == rows_.size() && flushed_rows_ > 0) return;
  const hsize_t n = rows_.size();
  std::vector<int64_t> iteration(n), batch(n);
  std::vector<int32_t> rank(n);
  std::vector<std::vector<double>> cols(11, std::vector<double>(n));
  for (size_t i = 0; i < n; ++i) {
    const auto& r = rows_[i];
    iteration[i] = r.iteration;
    rank[i] = r.rank;
    batch[i] = r.batch;
    double v[11] = {r.compute_s,
                    r.wait_s,
                    r.allreduce_s,
                    r.balancer_s,
                    r.predicted_speed,
                    r.actual_speed,
                    r.cpu_avail,
                    r.mem_avail,
                    r.load,
                    r.capacity,
                    0};
    for (int k = 0; k < 10; ++k) cols[k][i] = v[k];
  }
  static const char* names[10] = {"compute_s",    "wait_s",    "allreduce_s", "balancer_s", "predicted_speed",
                                  "actual_speed", "cpu_avail", "mem_avail",   "load",       "capacity"};
  std::string tmp = dir_ + "/telemetry.h5.tmp", final_path = dir_ + "/telemetry.h5";
  {
    h5::Handle f = h5::create_file(tmp);
    h5::Handle g = h5::ensure_group(f, "/records");
    h5::write_i64(g, "iteration", iteration.data(), {n});
    h5::write_i32(g, "rank", rank.data(), {n});
    h5::write_i64(g, "batch", batch.data(), {n});
    for (int k = 0; k < 10; ++k) h5::write_f64(g, names[k], cols[k].data(), {n});
    for (auto& [k, v] : attrs_) h5::write_string_attr(g, k, v);
  }
  std::filesystem::rename(tmp, final_path);
  flushed_rows_ = rows_.size();
}

Timeline::Timeline(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw std::runtime_error("--timeline: cannot write '" + path + "' (check the folder exists)");
  std::fputs("[", f_);
  end_pos_ = std::ftell(f_);
  std::fputs("\n]\n", f_);
  std::fflush(f_);
}

Timeline::~Timeline() {
  if (!f_) return;
  flush();
  std::fclose(f_);
}

void Timeline::complete(int pid, const char* tid, const char* name, double start_s, double dur_s,
                        const std::string& args_json) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s\n{\"ph\":\"X\",\"pid\":%d,\"tid\":\"%s\",\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f%s%s}",
                first_ ? "" : ",", pid, tid, name, start_s * 1e6, dur_s * 1e6,
                args_json.empty() ? "" : ",\"args\":", args_json.c_str());
  first_ = false;
  pending_ += buf;
}

void Timeline::name_process(int pid, const std::string& name) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"%s\"}}",
                first_ ? "" : ",", pid, name.c_str());
  first_ = false;
  pending_ += buf;
}

void Timeline::flush() {
  if (!f_ || pending_.empty()) return;
  // Overwrite the closing bracket, then write it again after the new events: valid JSON after every flush.
  std::fseek(f_, end_pos_, SEEK_SET);
  std::fwrite(pending_.data(), 1, pending_.size(), f_);
  end_pos_ = std::ftell(f_);
  std::fputs("\n]\n", f_);
  std::fflush(f_);
  pending_.clear();
}

}  // namespace lbbsp::runtime
