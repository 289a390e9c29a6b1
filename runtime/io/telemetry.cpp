#include "runtime/io/telemetry.hpp"

#include <filesystem>
#include <stdexcept>

#include "runtime/io/check.hpp"

namespace lbbsp::runtime {

namespace {

using Clock = std::chrono::steady_clock;

constexpr hsize_t kChunkRows = 4096;  // 32 KiB of int64/float64 per chunk
constexpr double kSliceAtLeast_s = 1e-3;

constexpr double IterationRecord::*kDoubleFields[] = {
    &IterationRecord::compute_s,  &IterationRecord::wait_s,          &IterationRecord::allreduce_s,
    &IterationRecord::balancer_s, &IterationRecord::predicted_speed, &IterationRecord::actual_speed,
    &IterationRecord::cpu_avail,  &IterationRecord::mem_avail,       &IterationRecord::load,
    &IterationRecord::capacity,   &IterationRecord::time_s};
constexpr const char* kDoubleNames[] = {
    "compute_s", "wait_s",    "allreduce_s", "balancer_s", "predicted_speed", "actual_speed",
    "cpu_avail", "mem_avail", "load",        "capacity",   "time_s"};

// An empty 1-D dataset that grows without limit, in chunks of kChunkRows.
h5::Handle create_column(hid_t group, const char* name, hid_t type) {
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
  h5::Handle space(H5Screate_simple(1, &zero, &unlimited));
  h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  LBBSP_H5_CHECK(H5Pset_chunk(dcpl, 1, &kChunkRows));
  h5::Handle ds(H5Dcreate2(group, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  LBBSP_H5_CHECK(ds.get());
  return ds;
}

// Grows the dataset by n rows and writes them at its end.
void append_column(hid_t ds, hid_t type, const void* data, hsize_t n) {
  const hsize_t old_rows = h5::dims(ds).at(0), new_rows = old_rows + n;
  LBBSP_H5_CHECK(H5Dset_extent(ds, &new_rows));
  h5::Handle file_space(H5Dget_space(ds));
  LBBSP_H5_CHECK(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &old_rows, nullptr, &n, nullptr));
  h5::Handle mem_space(H5Screate_simple(1, &n, nullptr));
  LBBSP_H5_CHECK(H5Dwrite(ds, type, mem_space, file_space, H5P_DEFAULT, data));
}

template <typename T, typename Get>
void append_field(hid_t ds, hid_t type, const std::vector<IterationRecord>& rows, Get get) {
  std::vector<T> col(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) col[i] = get(rows[i]);
  append_column(ds, type, col.data(), col.size());
}

}  // namespace

TelemetryWriter::TelemetryWriter(const std::string& dir, bool csv,
                                 std::vector<std::pair<std::string, std::string>> attrs,
                                 size_t max_buffered_rows)
    : path_(dir + "/telemetry.h5"), max_rows_(std::max<size_t>(1, max_buffered_rows)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("--log-dir: cannot create '" + dir + "': " + ec.message());
  create_file(attrs);
  rows_.reserve(std::min<size_t>(max_rows_, 1 << 12));
  if (csv) {
    csv_ = std::fopen((dir + "/telemetry.csv").c_str(), "w");
    if (!csv_) throw std::runtime_error("--log-dir: cannot write '" + dir + "/telemetry.csv'");
    std::fprintf(csv_,
                 "iteration,rank,batch,compute_s,wait_s,allreduce_s,balancer_s,predicted_speed,actual_speed,"
                 "cpu_avail,mem_avail,load,capacity,time_s\n");
  }
}

void TelemetryWriter::create_file(const std::vector<std::pair<std::string, std::string>>& attrs) {
  h5::quiet_errors();
  h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
#if H5_VERSION_GE(1, 10, 7)
  // No lock: h5py may read the rows flushed so far while the run goes on (HDF5 locks files it writes).
  LBBSP_H5_CHECK(H5Pset_file_locking(fapl, false, true));
#endif
  file_ = h5::Handle(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  if (!file_.valid()) throw std::runtime_error("--log-dir: cannot create '" + path_ + "' (is it writable?)");
  h5::Handle g = h5::ensure_group(file_, "/records");
  columns_.push_back(create_column(g, "iteration", H5T_NATIVE_INT64));
  columns_.push_back(create_column(g, "rank", H5T_NATIVE_INT32));
  columns_.push_back(create_column(g, "batch", H5T_NATIVE_INT64));
  for (const char* name : kDoubleNames) columns_.push_back(create_column(g, name, H5T_NATIVE_DOUBLE));
  for (const auto& [k, v] : attrs) h5::write_string_attr(g, k, v);
  LBBSP_H5_CHECK(H5Fflush(file_, H5F_SCOPE_LOCAL));
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
    std::fprintf(csv_, "%lld,%d,%lld,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.6g,%.6g,%.6g,%.6g,%.6f\n",
                 static_cast<long long>(r.iteration), r.rank, static_cast<long long>(r.batch), r.compute_s,
                 r.wait_s, r.allreduce_s, r.balancer_s, r.predicted_speed, r.actual_speed, r.cpu_avail,
                 r.mem_avail, r.load, r.capacity, r.time_s);
  }
  if (rows_.size() >= max_rows_) flush();
}

void TelemetryWriter::flush() {
  if (csv_) std::fflush(csv_);
  if (rows_.empty()) return;
  try {
    append_columns();
    // Metadata and chunks reach the file now: a SIGKILL from here on loses none of these rows.
    LBBSP_H5_CHECK(H5Fflush(file_, H5F_SCOPE_LOCAL));
  } catch (const std::exception& e) {
    throw std::runtime_error("--log-dir: cannot append to '" + path_ + "' (disk full?): " + e.what());
  }
  rows_written_ += static_cast<int64_t>(rows_.size());
  rows_.clear();
}

void TelemetryWriter::append_columns() {
  append_field<int64_t>(columns_[0], H5T_NATIVE_INT64, rows_, [](const auto& r) { return r.iteration; });
  append_field<int32_t>(columns_[1], H5T_NATIVE_INT32, rows_, [](const auto& r) { return r.rank; });
  append_field<int64_t>(columns_[2], H5T_NATIVE_INT64, rows_, [](const auto& r) { return r.batch; });
  for (size_t k = 0; k < std::size(kDoubleFields); ++k) {
    const auto field = kDoubleFields[k];
    append_field<double>(columns_[3 + k], H5T_NATIVE_DOUBLE, rows_,
                         [field](const auto& r) { return r.*field; });
  }
}

RunLog::RunLog(const RunLogConfig& cfg) : window_(cfg.timeline_window), flush_every_(cfg.flush_every) {
  if (!cfg.log_dir.empty()) telemetry_ = std::make_unique<TelemetryWriter>(cfg.log_dir, cfg.csv, cfg.attrs);
  if (!cfg.timeline.empty()) {
    timeline_ = std::make_unique<Timeline>(cfg.timeline);
    for (int r = 0; r < cfg.ranks; ++r) timeline_->name_process(r, "rank " + std::to_string(r));
  }
}

double RunLog::since_origin(Clock::time_point t) const {
  return std::chrono::duration<double>(t - t0_).count();
}

void RunLog::add_iteration(double start_s, const std::vector<IterationRecord>& ranks) {
  if (ranks.empty()) return;
  const auto begin = Clock::now();
  const int64_t it = ranks.front().iteration;
  bool flushed = false;
  if (telemetry_) {
    for (const auto& r : ranks) telemetry_->add(r);
    flushed = (it + 1) % flush_every_ == 0;
    if (flushed) telemetry_->flush();
  }
  in_window_ = timeline_ && window_.contains(it);
  if (in_window_) add_slices(start_s, ranks);
  const double took = std::chrono::duration<double>(Clock::now() - begin).count();
  if (in_window_ && (flushed || took >= kSliceAtLeast_s))
    timeline_->complete(0, "io", flushed ? "telemetry flush" : "logging", since_origin(begin), took);
  if (timeline_) timeline_->flush();
  io_s_ += std::chrono::duration<double>(Clock::now() - begin).count();
}

// compute, then wait for the slowest rank, the allreduce and the balancer's decision, on every rank's track.
void RunLog::add_slices(double start_s, const std::vector<IterationRecord>& ranks) {
  for (const auto& r : ranks) {
    const double predicted_s = r.predicted_speed > 0 ? r.batch / r.predicted_speed : 0.0;
    timeline_->compute(r.rank, start_s, r.compute_s, r.iteration, r.batch, predicted_s);
    const double reduce_at = start_s + r.compute_s + r.wait_s;
    if (r.wait_s > 0) timeline_->complete(r.rank, "wait", "wait", start_s + r.compute_s, r.wait_s);
    timeline_->complete(r.rank, "allreduce", "allreduce", reduce_at, r.allreduce_s);
    timeline_->complete(r.rank, "balancer", "balancer", reduce_at + r.allreduce_s, r.balancer_s);
  }
}

void RunLog::finish() {
  const auto begin = Clock::now();
  if (telemetry_) telemetry_->flush();
  const double took = std::chrono::duration<double>(Clock::now() - begin).count();
  io_s_ += took;
  if (timeline_) {
    if (telemetry_ && in_window_) timeline_->complete(0, "io", "telemetry flush", since_origin(begin), took);
    timeline_->sync();
  }
}

}  // namespace lbbsp::runtime
