// Telemetry appended to extendible HDF5 datasets (what a killed process leaves on disk), its bounded buffer,
// the timeline writer thread and its --timeline-iterations window, RunLog's io time, and the float buffer's
// exact range.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/io/h5.hpp"
#include "runtime/io/telemetry.hpp"
#include "runtime/train/step_engine.hpp"
#include "scratch_dir.hpp"

namespace fs = std::filesystem;
using namespace lbbsp::runtime;

namespace {

std::string scratch(const std::string& name) {
  static const lbbsp::testing::ScratchDir dir("lbbsp_test_telemetry_");
  return dir.file(name);
}

IterationRecord row(int64_t it, int32_t rank) {
  IterationRecord r;
  r.iteration = it;
  r.rank = rank;
  r.batch = 10 + rank;
  r.compute_s = 0.001 * (it + 1);
  r.capacity = 0.5;
  r.time_s = 1.8e9 + 0.25 * static_cast<double>(it);  // Unix time: the float64 keeps a quarter second exact
  return r;
}

struct Read {
  std::vector<int64_t> iteration, batch;
  std::vector<double> compute_s, capacity, time_s;
  std::string model;
};

Read read_telemetry(const std::string& path) {
  h5::Handle f = h5::open_file(path, false);
  h5::Handle g(H5Gopen2(f, "/records", H5P_DEFAULT));
  Read r;
  r.iteration = h5::read_i64(g, "iteration", path);
  r.batch = h5::read_i64(g, "batch", path);
  r.compute_s = h5::read_f64(g, "compute_s", path);
  r.capacity = h5::read_f64(g, "capacity", path);
  r.time_s = h5::read_f64(g, "time_s", path);
  for (const char* k : {"rank", "wait_s", "allreduce_s", "balancer_s", "predicted_speed", "actual_speed",
                        "cpu_avail", "mem_avail", "load"})
    EXPECT_EQ(h5::dims(h5::open_dataset(g, k, path)).at(0), r.iteration.size()) << k;
  r.model = h5::read_string_attr(g, "model");
  return r;
}

nlohmann::json parse_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace

TEST(TelemetryWriter, FlushAppendsAndTheFileOnDiskHoldsEveryFlushedRow) {
  const std::string dir = scratch("append");
  {
    TelemetryWriter w(dir, false, {{"model", "logreg"}});
    for (int it = 0; it < 3; ++it)
      for (int r = 0; r < 2; ++r) w.add(row(it, r));
    w.flush();
    for (int r = 0; r < 2; ++r) w.add(row(3, r));
    w.flush();
    w.add(row(4, 0));  // buffered, not flushed
    EXPECT_EQ(w.rows_written(), 8);
    // What a SIGKILL now would leave: the file as it is on disk, while the writer still has it open.
    fs::copy_file(dir + "/telemetry.h5", dir + "/snapshot.h5", fs::copy_options::overwrite_existing);
    const Read snap = read_telemetry(dir + "/snapshot.h5");
    ASSERT_EQ(snap.iteration.size(), 8u);
    EXPECT_EQ(snap.iteration[7], 3);
    EXPECT_EQ(snap.batch[7], 11);
    EXPECT_DOUBLE_EQ(snap.compute_s[6], 0.004);
    EXPECT_EQ(snap.model, "logreg");
  }
  const Read all = read_telemetry(dir + "/telemetry.h5");  // the destructor flushed the last row
  ASSERT_EQ(all.iteration.size(), 9u);
  EXPECT_EQ(all.iteration.back(), 4);
  EXPECT_DOUBLE_EQ(all.capacity.back(), 0.5);
  EXPECT_DOUBLE_EQ(all.time_s.back(), row(all.iteration.back(), 0).time_s);
}

TEST(TelemetryWriter, HoldsAtMostItsBufferAndFlushesByItself) {
  const std::string dir = scratch("bounded");
  {
    TelemetryWriter w(dir, false, {}, /*max_buffered_rows=*/8);
    for (int it = 0; it < 100; ++it) {
      w.add(row(it, 0));
      EXPECT_LT(w.rows_buffered(), 8u);
    }
    EXPECT_EQ(w.rows_written(), 96);
  }
  const Read all = read_telemetry(dir + "/telemetry.h5");
  ASSERT_EQ(all.iteration.size(), 100u);
  for (int it = 0; it < 100; ++it) EXPECT_EQ(all.iteration[it], it);
}

TEST(TelemetryWriter, NamesTheFolderItCannotCreate) {
  try {
    TelemetryWriter w("/proc/no/such/dir", false, {});
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--log-dir"), std::string::npos) << e.what();
  }
}

TEST(Timeline, WritesEveryQueuedEventByTheTimeItCloses) {
  const std::string path = scratch("many.json");
  const int n = 20000;  // more than one hand-over wakes the writer for
  {
    Timeline t(path, /*max_queued=*/4096);  // small: flush() has to wait for the writer now and then
    t.name_process(0, "rank 0");
    for (int i = 0; i < n; ++i) {
      t.compute(0, i * 1e-3, 5e-4, i, 7, 4e-4);
      if (i % 100 == 99) t.flush();
    }
  }
  const auto j = parse_json(path);
  ASSERT_EQ(j.size(), static_cast<size_t>(n + 1));
  EXPECT_EQ(j[0]["ph"], "M");
  EXPECT_EQ(j[n]["args"]["iteration"], n - 1);
  EXPECT_EQ(j[n]["args"]["batch"], 7);
  EXPECT_DOUBLE_EQ(j[n]["args"]["predicted_s"].get<double>(), 4e-4);
  EXPECT_DOUBLE_EQ(j[n]["dur"].get<double>(), 500.0);
  EXPECT_EQ(j[n]["tid"], "compute");
}

TEST(Timeline, WindowParsesFirstToEnd) {
  EXPECT_TRUE(parse_timeline_window("").contains(123456789));
  const auto w = parse_timeline_window("10:20");
  EXPECT_FALSE(w.contains(9));
  EXPECT_TRUE(w.contains(10));
  EXPECT_TRUE(w.contains(19));
  EXPECT_FALSE(w.contains(20));
  for (const char* bad : {"10", "a:b", "10:", ":5", "-1:5", "5:5", "9:3", "1:2:3"}) {
    try {
      parse_timeline_window(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--timeline-iterations '" + std::string(bad) + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(RunLog, RecordsEveryRowButOnlyTheWindowsSlicesAndCountsItsTime) {
  RunLogConfig c;
  c.log_dir = scratch("runlog");
  c.timeline = scratch("runlog.json");
  c.timeline_window = parse_timeline_window("2:4");
  c.ranks = 2;
  c.flush_every = 3;
  double io_s = 0;
  {
    RunLog log(c);
    for (int it = 0; it < 6; ++it) log.add_iteration(it * 0.01, {row(it, 0), row(it, 1)});
    log.finish();
    io_s = log.io_s();
  }
  EXPECT_GT(io_s, 0.0);
  EXPECT_EQ(read_telemetry(c.log_dir + "/telemetry.h5").iteration.size(), 12u);
  std::set<int64_t> iterations;
  std::multiset<std::string> tracks;
  for (const auto& e : parse_json(c.timeline)) {
    if (e["ph"] != "X") continue;
    tracks.insert(e["tid"].get<std::string>());
    if (e["tid"] == "compute") iterations.insert(e["args"]["iteration"].get<int64_t>());
  }
  EXPECT_EQ(iterations, (std::set<int64_t>{2, 3}));
  EXPECT_EQ(tracks.count("compute"), 4u);
  EXPECT_EQ(tracks.count("allreduce"), 4u);
  EXPECT_GE(tracks.count("io"), 1u);  // the flush after iteration 2 ((2 + 1) % 3 == 0)
}

TEST(FloatBuffer, CountsUpTo2To24AreExactAndLargerOnesAreRefused) {
  EXPECT_NO_THROW(check_float_exact(kMaxExactFloatCount, "--global-batch"));
  EXPECT_EQ(static_cast<int64_t>(static_cast<float>(kMaxExactFloatCount)), kMaxExactFloatCount);
  EXPECT_NE(static_cast<int64_t>(static_cast<float>(kMaxExactFloatCount + 1)), kMaxExactFloatCount + 1);
  try {
    check_float_exact(kMaxExactFloatCount + 1, "--global-batch");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--global-batch 16777217 is above 16777216"), std::string::npos)
        << e.what();
  }
}
