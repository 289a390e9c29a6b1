#include "runtime/analysis/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "balancer/balancer.hpp"
#include "common/format.hpp"
#include "common/spec.hpp"

namespace lbbsp::runtime {
namespace {

using balancer::TimeCurve;

// "lbbsp-cpu" of "lbbsp-cpu:narx" and of "lbbsp-cpu;band=2" (lenient: it only finds where an entry starts).
std::string base_name(const std::string& entry) {
  return entry.substr(0, entry.find_first_of(":;"));
}

bool starts_with_balancer(const std::string& piece) {
  const std::string base = base_name(piece);
  const auto& kinds = balancer::balancer_kinds();
  return std::find(kinds.begin(), kinds.end(), base) != kinds.end();
}

void check_config(const SimulatorConfig& cfg) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("simulate: " + what); };
  if (cfg.workers < 1) bad("--workers must be >= 1");
  if (cfg.iterations < 1) bad("--iterations must be >= 1");
  if (cfg.profile != "cpu" && cfg.profile != "gpu")
    bad("--profile must be cpu or gpu, got '" + cfg.profile + "'");
  if (cfg.global_batch < 0) bad("--global-batch must be >= 0 (0: 32 per worker)");
  if (!(cfg.time_scale_s >= 0) || !std::isfinite(cfg.time_scale_s)) bad("--time-scale must be >= 0");
  if (!(cfg.sample_cost_s > 0) || !std::isfinite(cfg.sample_cost_s)) bad("--sample-cost must be > 0");
  if (!(cfg.heterogeneity >= 1) || !std::isfinite(cfg.heterogeneity)) bad("--heterogeneity must be >= 1");
  if (!(cfg.gpu_floor_s >= 0) || !(cfg.gpu_sat_batch >= 0) || !(cfg.gpu_slope_s > 0) ||
      !std::isfinite(cfg.gpu_floor_s + cfg.gpu_sat_batch + cfg.gpu_slope_s))
    bad("GPU curve needs floor >= 0, saturation batch >= 0, slope > 0");
  if (!(cfg.mem_factor > 0) || !std::isfinite(cfg.mem_factor)) bad("--mem-factor must be > 0");
  if (!(cfg.grad_bytes >= 0) || !(cfg.bandwidth_Bps > 0) || !(cfg.latency_s >= 0) ||
      !std::isfinite(cfg.grad_bytes + cfg.bandwidth_Bps + cfg.latency_s))
    bad("allreduce needs bytes >= 0, bandwidth > 0, latency >= 0");
  if (cfg.min_batch < 0) bad("--min-batch must be >= 0");
  if (cfg.balancers.empty()) bad("--balancers is empty");
}

// The simulated cluster: which trace each worker replays and how fast it is at full capacity.
struct Cluster {
  std::vector<const TraceSeries*> series;
  std::vector<size_t> offset;
  std::vector<double> cost_s;    // CPU: seconds per sample at capacity 1
  std::vector<TimeCurve> curve;  // GPU: curve at capacity 1
  std::vector<int64_t> mem_cap;  // GPU: samples (unlimited on CPU)

  double capacity(size_t worker, int64_t step) const {
    const auto& c = series[worker]->capacity;
    return c[(offset[worker] + static_cast<size_t>(step)) % c.size()];
  }
};

Cluster build_cluster(const SimulatorConfig& cfg, const std::vector<TraceSeries>& traces, int64_t X) {
  std::vector<const TraceSeries*> usable;
  for (const auto& s : traces)
    if (!s.capacity.empty()) usable.push_back(&s);
  if (usable.empty()) throw std::runtime_error("simulate: the traces hold no capacity samples");
  std::mt19937_64 rng(cfg.seed);
  std::shuffle(usable.begin(), usable.end(), rng);  // seeded assignment, reused cyclically beyond the count
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const size_t n = static_cast<size_t>(cfg.workers);
  Cluster c;
  c.series.resize(n);
  c.offset.resize(n);
  for (size_t i = 0; i < n; ++i) {
    c.series[i] = usable[i % usable.size()];
    c.offset[i] = static_cast<size_t>(rng() % c.series[i]->capacity.size());
    const double slowdown = 1.0 + (cfg.heterogeneity - 1.0) * u(rng);
    c.cost_s.push_back(cfg.sample_cost_s * slowdown);
    c.curve.push_back(TimeCurve{cfg.gpu_floor_s * slowdown, cfg.gpu_sat_batch, cfg.gpu_slope_s * slowdown});
    if (cfg.profile == "gpu") {
      const double cap =
          cfg.mem_factor * static_cast<double>(X) / static_cast<double>(n) * (0.75 + 0.5 * u(rng));
      c.mem_cap.push_back(std::max<int64_t>(1, static_cast<int64_t>(std::floor(cap))));
    } else {
      c.mem_cap.push_back(std::numeric_limits<int64_t>::max());
    }
  }
  if (cfg.profile == "gpu") {
    int64_t total = 0;
    for (int64_t m : c.mem_cap) total = std::min(X, total + m);
    if (total < X)
      throw std::invalid_argument("simulate: GPU memory caps hold fewer than the global batch " +
                                  std::to_string(X) + " samples; raise --mem-factor");
  }
  return c;
}

struct Run {
  double total_iteration_s = 0, total_compute_s = 0, wait_worker_s = 0, busy_worker_s = 0, decision_s = 0;
};

// One CSV row per worker of the report a balancer gets, every double exact (17 significant digits): a program
// that feeds the same reports to the same balancer (the Python package's tests do) must get the same vectors.
void write_reports(std::ostream& out, const std::string& balancer, const balancer::IterationReport& report) {
  char buf[160];
  for (size_t i = 0; i < report.workers.size(); ++i) {
    const balancer::WorkerReport& w = report.workers[i];
    std::snprintf(buf, sizeof buf, ",%lld,%zu,%lld,%.17g,%.17g,%.17g,%lld\n",
                  static_cast<long long>(report.iteration), i, static_cast<long long>(w.batch), w.compute_s,
                  w.exo[0], w.truth.capacity_next, static_cast<long long>(w.mem_cap));
    out << balancer << buf;
  }
}

Run run_one(const SimulatorConfig& cfg, const Cluster& cluster, balancer::Balancer& bal, int64_t X,
            double allreduce_s, std::ostream* trace_out, std::ostream* reports_out) {
  const size_t n = static_cast<size_t>(cfg.workers);
  const bool gpu = cfg.profile == "gpu";
  balancer::IterationReport report;
  report.workers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    report.workers[i].exo.assign(1, 0.0);
    report.workers[i].mem_cap = cluster.mem_cap[i];
  }
  auto step_at = [&](int64_t iteration, double sim_time) {
    return cfg.time_scale_s > 0 ? static_cast<int64_t>(std::floor(sim_time / cfg.time_scale_s)) : iteration;
  };
  Run run;
  double sim_time = 0.0;
  std::vector<int64_t> batch = bal.initial();
  std::vector<double> compute(n);
  for (int64_t t = 0; t < cfg.iterations; ++t) {
    if (batch.size() != n)
      throw std::runtime_error("simulate: balancer " + bal.name() + " returned " +
                               std::to_string(batch.size()) + " batch sizes for " + std::to_string(n) +
                               " workers");
    const int64_t step = step_at(t, sim_time);
    int64_t total = 0;
    double slowest = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t b = batch[i];
      if (b < 0 || b > cluster.mem_cap[i])
        throw std::runtime_error(
            "simulate: balancer " + bal.name() + " gave worker " + std::to_string(i) + " " +
            std::to_string(b) + " samples at iteration " + std::to_string(t) +
            (b < 0 ? "" : ", over its memory cap of " + std::to_string(cluster.mem_cap[i])));
      total += b;
      const double cap = cluster.capacity(i, step);
      compute[i] =
          (gpu ? cluster.curve[i].time(static_cast<double>(b)) : static_cast<double>(b) * cluster.cost_s[i]) /
          cap;
      slowest = std::max(slowest, compute[i]);
    }
    if (total != X)
      throw std::runtime_error("simulate: balancer " + bal.name() + " assigned " + std::to_string(total) +
                               " samples at iteration " + std::to_string(t) + ", not " + std::to_string(X));
    for (size_t i = 0; i < n; ++i) run.wait_worker_s += slowest - compute[i];
    run.busy_worker_s += slowest * static_cast<double>(n);
    run.total_compute_s += slowest;
    const double iteration_s = slowest + allreduce_s;
    run.total_iteration_s += iteration_s;
    sim_time += iteration_s;
    if (trace_out) {
      *trace_out << bal.name() << ',' << t << ',' << iteration_s << ',' << slowest;
      for (int64_t b : batch) *trace_out << ',' << b;
      *trace_out << '\n';
    }
    const int64_t next_step = step_at(t + 1, sim_time);
    report.iteration = t;
    for (size_t i = 0; i < n; ++i) {
      balancer::WorkerReport& w = report.workers[i];
      const double cap = cluster.capacity(i, step), cap_next = cluster.capacity(i, next_step);
      w.batch = batch[i];
      w.compute_s = compute[i];
      w.exo[0] = cap;  // CPU available during this iteration: known after it, never ahead
      if (cfg.exo_next) w.exo_next.assign(1, cap_next);
      w.truth.capacity = cap;
      w.truth.capacity_next = cap_next;
      if (gpu) {
        const TimeCurve& c = cluster.curve[i];
        w.truth.curve_next = TimeCurve{c.floor_s / cap_next, c.sat_batch, c.slope_s_per_sample / cap_next};
      }
    }
    if (reports_out) write_reports(*reports_out, bal.name(), report);
    const auto start = std::chrono::steady_clock::now();
    batch = bal.next(report);
    run.decision_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return run;
}

}  // namespace

double ring_allreduce_s(int workers, double bytes, double bandwidth_Bps, double latency_s) {
  if (workers <= 1) return 0.0;
  const double n = workers;
  return 2.0 * (n - 1.0) / n * bytes / bandwidth_Bps + 2.0 * (n - 1.0) * latency_s;
}

std::vector<std::string> split_balancer_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string piece;
  while (std::getline(ss, piece, ',')) {
    if (!out.empty() && !starts_with_balancer(piece) && out.back().rfind("lbbsp-cpu:", 0) == 0) {
      out.back() += ',' + piece;  // more of a predictor spec such as narx:hidden=8,window=32
      continue;
    }
    if (piece.empty())
      throw std::invalid_argument("simulate: empty entry in the balancer list '" + list + "'");
    out.push_back(piece);
  }
  return out;
}

SimulationResult simulate(const SimulatorConfig& cfg, const std::vector<TraceSeries>& traces) {
  check_config(cfg);
  const int64_t X = cfg.global_batch > 0 ? cfg.global_batch : 32 * static_cast<int64_t>(cfg.workers);
  std::vector<std::string> entries = cfg.balancers;
  for (const char* reference : {"bsp", "oracle"})
    if (std::find(entries.begin(), entries.end(), reference) == entries.end()) entries.push_back(reference);

  // Build every balancer first so that a bad name fails before any time is spent.
  const Cluster cluster = build_cluster(cfg, traces, X);
  std::vector<std::unique_ptr<balancer::Balancer>> balancers;
  std::vector<std::string> predictor_of;
  for (const auto& entry : entries) {
    balancer::BalancerConfig bc;
    bc.name = entry;
    bc.predictor = cfg.predictor;
    bc.workers = cfg.workers;
    bc.global_batch = X;
    bc.min_batch = cfg.min_batch;
    bc.num_exo = 1;
    bc.capacity_exo = 0;  // exo[0] is the capacity measured during the iteration
    bc.seed = cfg.seed;
    if (cfg.profile == "gpu") bc.mem_cap = cluster.mem_cap;
    balancers.push_back(balancer::make_balancer(bc));
    const spec::Spec parsed(entry, "balancer", "");  // as make_balancer read it: KIND[:ARGS][;KEY=VALUE...]
    predictor_of.push_back(parsed.kind() != "lbbsp-cpu" ? ""
                           : parsed.has_args()          ? parsed.args()
                                                        : cfg.predictor);
  }

  std::unique_ptr<std::ofstream> trace_file;
  if (!cfg.trace_out.empty()) {
    trace_file = std::make_unique<std::ofstream>(cfg.trace_out);
    if (!*trace_file) throw std::runtime_error("simulate: cannot write " + cfg.trace_out);
    *trace_file << "balancer,iteration,iteration_s,compute_s";
    for (int i = 0; i < cfg.workers; ++i) *trace_file << ",b" << i;
    *trace_file << '\n';
    trace_file->precision(9);
  }
  std::unique_ptr<std::ofstream> reports_file;
  if (!cfg.reports_out.empty()) {
    reports_file = std::make_unique<std::ofstream>(cfg.reports_out);
    if (!*reports_file) throw std::runtime_error("simulate: cannot write " + cfg.reports_out);
    *reports_file << "balancer,iteration,worker,batch,compute_s,cpu_avail,capacity_next,mem_cap\n";
  }

  SimulationResult result;
  result.workers = cfg.workers;
  result.iterations = cfg.iterations;
  result.profile = cfg.profile;
  result.global_batch = X;
  result.trace_series = traces.size();
  result.allreduce_s = ring_allreduce_s(cfg.workers, cfg.grad_bytes, cfg.bandwidth_Bps, cfg.latency_s);
  double bsp_mean = 0, oracle_mean = 0;
  for (size_t k = 0; k < balancers.size(); ++k) {
    const Run run =
        run_one(cfg, cluster, *balancers[k], X, result.allreduce_s, trace_file.get(), reports_file.get());
    BalancerResult r;
    r.balancer = entries[k];
    r.predictor = predictor_of[k];
    const double T = static_cast<double>(cfg.iterations);
    r.mean_iteration_s = run.total_iteration_s / T;
    r.mean_compute_s = run.total_compute_s / T;
    r.wait_fraction = run.busy_worker_s > 0 ? run.wait_worker_s / run.busy_worker_s : 0.0;
    r.decision_ms_per_iteration = 1e3 * run.decision_s / T;
    if (entries[k] == "bsp") bsp_mean = r.mean_iteration_s;
    if (entries[k] == "oracle") oracle_mean = r.mean_iteration_s;
    result.results.push_back(r);
  }
  for (auto& r : result.results) {
    r.efficiency_vs_oracle = r.mean_iteration_s > 0 ? oracle_mean / r.mean_iteration_s : 1.0;
    r.speedup_vs_bsp = r.mean_iteration_s > 0 ? bsp_mean / r.mean_iteration_s : 1.0;
  }
  return result;
}

std::string to_markdown(const SimulationResult& res) {
  std::string s = "simulated " + std::to_string(res.workers) + " workers x " +
                  std::to_string(res.iterations) + " iterations, profile " + res.profile + ", global batch " +
                  std::to_string(res.global_batch) + ", " + std::to_string(res.trace_series) +
                  " trace series, allreduce " + fmt("%.4g", res.allreduce_s * 1e3) + " ms\n\n";
  s += "| balancer | predictor | mean iteration (s) | efficiency vs oracle | speed-up vs BSP | wait fraction "
       "| decision ms/iter |\n";
  s += "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& r : res.results)
    s += "| " + r.balancer + " | " + (r.predictor.empty() ? "-" : r.predictor) + " | " +
         fmt("%.4g", r.mean_iteration_s) + " | " + fmt("%.3f", r.efficiency_vs_oracle) + " | " +
         fmt("%.3f", r.speedup_vs_bsp) + " | " + fmt("%.3f", r.wait_fraction) + " | " +
         fmt("%.3g", r.decision_ms_per_iteration) + " |\n";
  return s;
}

nlohmann::json to_json(const SimulationResult& res) {
  nlohmann::json j;
  j["workers"] = res.workers;
  j["iterations"] = res.iterations;
  j["profile"] = res.profile;
  j["global_batch"] = res.global_batch;
  j["trace_series"] = res.trace_series;
  j["allreduce_s"] = res.allreduce_s;
  j["results"] = nlohmann::json::array();
  for (const auto& r : res.results) {
    j["results"].push_back(
        {{"balancer", r.balancer},
         {"predictor", r.predictor.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.predictor)},
         {"mean_iteration_s", r.mean_iteration_s},
         {"mean_compute_s", r.mean_compute_s},
         {"efficiency_vs_oracle", r.efficiency_vs_oracle},
         {"speedup_vs_bsp", r.speedup_vs_bsp},
         {"wait_fraction", r.wait_fraction},
         {"decision_ms_per_iteration", r.decision_ms_per_iteration}});
  }
  return j;
}

}  // namespace lbbsp::runtime
