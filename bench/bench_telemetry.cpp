// Rank 0's logging at scale. BM_TelemetryRun: RANKS x ITERATIONS rows through TelemetryWriter with a flush
// every 200 iterations, as the trainer does; counters compare the mean flush of the last tenth of the run
// with the first tenth (1.0: the cost does not grow with the rows already in the file) and the writer's
// resident memory growth. BM_TimelineEnqueue: what one iteration's slices cost the training thread (the
// writer thread formats and writes them): the CPU column is the training thread's, the counter
// process_cpu_us_per_iteration adds the writer's. Files go to $TMPDIR (96 x 100,000 rows: about 1 GB, removed
// afterwards).
//   build/bench/bench_telemetry --benchmark_filter=TelemetryRun/96/100000
#include <benchmark/benchmark.h>

#include <unistd.h>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/io/telemetry.hpp"

namespace fs = std::filesystem;
using namespace lbbsp::runtime;
using Clock = std::chrono::steady_clock;

namespace {

double rss_mb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

std::string bench_dir(const char* name) {
  return (fs::temp_directory_path() / ("lbbsp_bench_" + std::string(name) + "_" + std::to_string(::getpid())))
      .string();
}

double process_cpu_s() {  // every thread of the process, the timeline writer included
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double mean(const std::vector<double>& v, size_t lo, size_t hi) {
  return hi > lo ? std::accumulate(v.begin() + lo, v.begin() + hi, 0.0) / (hi - lo) : 0.0;
}

IterationRecord record(int64_t it, int r) {
  IterationRecord rec;
  rec.iteration = it;
  rec.rank = r;
  rec.batch = 64;
  rec.compute_s = 1e-4 * (1 + r % 7);
  rec.wait_s = 1e-5;
  rec.actual_speed = 64 / rec.compute_s;
  return rec;
}

}  // namespace

static void BM_TelemetryRun(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const int64_t iterations = state.range(1), flush_every = 200;
  const std::string dir = bench_dir("telemetry");
  std::vector<double> flush_s;
  double rss_growth = 0, file_mb = 0;
  for (auto _ : state) {
    flush_s.clear();
    const double rss0 = rss_mb();
    {
      TelemetryWriter w(dir, false, {{"model", "bench"}});
      for (int64_t it = 0; it < iterations; ++it) {
        for (int r = 0; r < ranks; ++r) w.add(record(it, r));
        if ((it + 1) % flush_every != 0) continue;
        const auto t = Clock::now();
        w.flush();
        flush_s.push_back(std::chrono::duration<double>(Clock::now() - t).count());
      }
      rss_growth = rss_mb() - rss0;  // before the writer frees its buffers
    }
    file_mb = static_cast<double>(fs::file_size(dir + "/telemetry.h5")) / (1 << 20);
    fs::remove_all(dir);
  }
  const size_t n = flush_s.size(), tenth = std::max<size_t>(1, n / 10);
  const double first = mean(flush_s, 0, tenth), last = mean(flush_s, n - tenth, n);
  state.counters["flushes"] = static_cast<double>(n);
  state.counters["flush_ms_first_tenth"] = 1e3 * first;
  state.counters["flush_ms_last_tenth"] = 1e3 * last;
  state.counters["last_over_first"] = first > 0 ? last / first : 0;
  state.counters["rss_growth_MB"] = rss_growth;
  state.counters["file_MB"] = file_mb;
}
BENCHMARK(BM_TelemetryRun)
    ->Args({96, 10000})
    ->Args({96, 100000})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

static void BM_TimelineEnqueue(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const std::string path = bench_dir("timeline") + ".json";
  {
    Timeline t(path);
    int64_t it = 0;
    const double cpu0 = process_cpu_s();
    for (auto _ : state) {
      const double start = it * 2e-4;
      for (int r = 0; r < ranks; ++r) {
        t.compute(r, start, 1e-4, it, 64, 1e-4);
        t.complete(r, "wait", "wait", start + 1e-4, 1e-5);
        t.complete(r, "allreduce", "allreduce", start + 1.1e-4, 2e-5);
        t.complete(r, "balancer", "balancer", start + 1.3e-4, 1e-5);
      }
      t.flush();
      ++it;
    }
    t.sync();
    state.counters["process_cpu_us_per_iteration"] =
        1e6 * (process_cpu_s() - cpu0) / std::max<int64_t>(1, it);
    state.counters["bytes_per_rank_iteration"] =
        static_cast<double>(fs::file_size(path)) / std::max<int64_t>(1, it * ranks);
  }
  state.SetItemsProcessed(state.iterations() * ranks * 4);
  fs::remove(path);
}
// Fixed iteration counts keep the files small (96 ranks x 2,000 iterations: about 80 MB).
BENCHMARK(BM_TimelineEnqueue)->Arg(4)->Iterations(20000);
BENCHMARK(BM_TimelineEnqueue)->Arg(96)->Iterations(2000);

BENCHMARK_MAIN();
