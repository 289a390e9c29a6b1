#include "runtime/analysis/report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "common/format.hpp"
#include "runtime/io/h5.hpp"

namespace lbbsp::runtime::report {
namespace fs = std::filesystem;

namespace {

std::vector<double> read_column(hid_t g, const std::string& name, const std::string& file, size_t rows) {
  auto v = h5::read_f64(g, name, file);
  if (v.size() != rows)
    throw std::runtime_error("'" + file + "': /records/" + name + " has " + std::to_string(v.size()) +
                             " rows, /records/iteration has " + std::to_string(rows) +
                             " (truncated or from another run?)");
  return v;
}

nlohmann::json read_summary(const std::string& dir) {
  const std::string path = dir + "/summary.json";
  if (!fs::exists(path)) return nullptr;
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error("'" + path + "' is not valid JSON (" + e.what() +
                             "); rewrite it with lbbsp train --summary-json or remove it");
  }
}

// Every iteration must hold one row of each rank 0..ranks-1, in (iteration, rank) order as written.
void check_rows(const RunData& r) {
  const size_t n = r.iteration.size(), R = static_cast<size_t>(r.ranks);
  if (n == 0)
    throw std::runtime_error("'" + r.file + "' holds no iterations (the run stopped before its first)");
  if (n % R != 0)
    throw std::runtime_error("'" + r.file + "' has " + std::to_string(n) + " rows, not a whole number of " +
                             std::to_string(R) + "-rank iterations (truncated?)");
  for (size_t i = 0; i < n; ++i) {
    const auto want_rank = static_cast<int64_t>(i % R);
    const int64_t want_it = r.iteration[i - i % R];
    if (r.rank[i] != want_rank || r.iteration[i] != want_it)
      throw std::runtime_error("'" + r.file + "': row " + std::to_string(i) + " is iteration " +
                               std::to_string(r.iteration[i]) + " rank " + std::to_string(r.rank[i]) +
                               ", expected iteration " + std::to_string(want_it) + " rank " +
                               std::to_string(want_rank) + " (not an lbbsp telemetry file?)");
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string pct(double v) {
  return fmt("%.1f%%", 100 * v);
}
std::string ms(double s) {
  return fmt("%.2f ms", 1e3 * s);
}
std::string error_cell(double e) {
  return e < 0 ? "—" : pct(e);
}

// What a balanced run saved against an equal split, and the ideal, as lines of text ("" for bsp).
std::string savings_text(const RunReport& r) {
  if (r.balancer == "bsp" || r.estimated_iterations == 0) return "";
  const double saved = r.equal_split_s - r.compute_s;
  return "- against an equal split (estimated from the measured speeds, " +
         std::to_string(r.estimated_iterations) + " iterations): slowest-rank compute " +
         fmt("%.2f s", r.compute_s) + " instead of " + fmt("%.2f s", r.equal_split_s) + ", saved " +
         fmt("%.2f s", saved) + " (" + pct(r.equal_split_s > 0 ? saved / r.equal_split_s : 0) +
         "); all ranks finishing together would take " + fmt("%.2f s", r.ideal_s) + "\n";
}

}  // namespace

RunData load_run(const std::string& dir) {
  RunData r;
  r.dir = dir;
  r.file = (fs::path(dir) / "telemetry.h5").string();
  if (!fs::is_directory(dir))
    throw std::runtime_error("'" + dir + "' is not a folder (give the --log-dir of a lbbsp train run)");
  if (!fs::exists(r.file))
    throw std::runtime_error("'" + r.file + "' not found: '" + dir +
                             "' holds no telemetry (give the --log-dir of a lbbsp train run)");
  h5::Handle f;
  try {
    f = h5::open_file(r.file, false);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(e.what()) +
                             ": truncated or corrupt telemetry (the run died while "
                             "writing it?)");
  }
  if (!h5::exists(f, "/records"))
    throw std::runtime_error("'" + r.file + "' has no group /records (not an lbbsp telemetry file)");
  h5::Handle g(H5Gopen2(f, "/records", H5P_DEFAULT));
  r.iteration = h5::read_i64(g, "iteration", r.file);
  const size_t n = r.iteration.size();
  r.rank = h5::read_i64(g, "rank", r.file);
  r.batch = h5::read_i64(g, "batch", r.file);
  if (r.rank.size() != n || r.batch.size() != n)
    throw std::runtime_error("'" + r.file +
                             "': /records/rank and /records/batch do not have as many rows as " +
                             "/records/iteration (truncated?)");
  r.compute_s = read_column(g, "compute_s", r.file, n);
  r.wait_s = read_column(g, "wait_s", r.file, n);
  r.allreduce_s = read_column(g, "allreduce_s", r.file, n);
  r.balancer_s = read_column(g, "balancer_s", r.file, n);
  r.predicted_speed = read_column(g, "predicted_speed", r.file, n);
  r.actual_speed = read_column(g, "actual_speed", r.file, n);
  r.cpu_avail = read_column(g, "cpu_avail", r.file, n);
  r.capacity = read_column(g, "capacity", r.file, n);
  r.model = h5::read_string_attr(g, "model");
  r.balancer = h5::read_string_attr(g, "balancer");
  r.predictor = r.balancer == "lbbsp-cpu" ? h5::read_string_attr(g, "predictor") : "";
  r.straggle = h5::read_string_attr(g, "straggle");
  const std::string ranks = h5::read_string_attr(g, "ranks"), batch = h5::read_string_attr(g, "global_batch");
  int64_t max_rank = -1;
  for (auto k : r.rank) max_rank = std::max(max_rank, k);
  try {
    r.ranks = ranks.empty() ? static_cast<int>(max_rank + 1) : std::stoi(ranks);
    r.global_batch = batch.empty() ? 0 : std::stoll(batch);
  } catch (const std::logic_error&) {
    throw std::runtime_error("'" + r.file + "': attribute ranks '" + ranks + "' or global_batch '" + batch +
                             "' of /records is not a number");
  }
  if (r.ranks < 1) throw std::runtime_error("'" + r.file + "' holds no rows");
  check_rows(r);
  if (r.global_batch == 0)
    for (int k = 0; k < r.ranks; ++k) r.global_batch += r.batch[k];
  r.summary = read_summary(dir);
  return r;
}

void check_comparable(const std::vector<RunData>& runs) {
  for (const auto& r : runs)
    if (r.ranks != runs[0].ranks)
      throw std::runtime_error("cannot compare runs with different rank counts: '" + runs[0].file + "' has " +
                               std::to_string(runs[0].ranks) + " ranks, '" + r.file + "' has " +
                               std::to_string(r.ranks) + " (report them separately)");
}

namespace {

void per_rank_stats(const RunData& d, RunReport& out) {
  const int R = d.ranks;
  const size_t n_it = d.iteration.size() / R;
  out.per_rank.assign(R, {});
  std::vector<double> err_sum(R, 0), batch_sum(R, 0), cpu_sum(R, 0);
  for (size_t i = 0; i < d.iteration.size(); ++i) {
    const int k = static_cast<int>(d.rank[i]);
    auto& s = out.per_rank[k];
    batch_sum[k] += static_cast<double>(d.batch[i]);
    s.compute_s += d.compute_s[i];
    s.wait_s += d.wait_s[i];
    cpu_sum[k] += d.cpu_avail[i];
    if (d.batch[i] == 0) ++s.idle_iterations;
    if (d.predicted_speed[i] > 0 && d.batch[i] > 0 && d.actual_speed[i] > 0) {
      err_sum[k] += std::abs(d.predicted_speed[i] - d.actual_speed[i]) / d.actual_speed[i];
      ++s.predictions;
    }
  }
  double err_all = 0;
  int64_t pred_all = 0;
  for (int k = 0; k < R; ++k) {
    auto& s = out.per_rank[k];
    s.rank = k;
    s.mean_batch = batch_sum[k] / n_it;
    s.cpu_avail = cpu_sum[k] / n_it;
    s.speed = s.compute_s > 0 ? batch_sum[k] / s.compute_s : 0;
    if (s.predictions) s.predictor_error = err_sum[k] / s.predictions;
    out.wait_rank_s += s.wait_s;
    err_all += err_sum[k];
    pred_all += s.predictions;
  }
  if (pred_all) out.predictor_error = err_all / pred_all;
}

// Per iteration: its time, and the slowest compute against an equal split and against the ideal, from the
// measured speeds (a rank given 0 samples keeps its latest measured speed).
void time_and_savings(const RunData& d, RunReport& out) {
  const int R = d.ranks;
  const size_t n_it = d.iteration.size() / R;
  std::vector<double> speed(R, 0);
  const double share = static_cast<double>(d.global_batch) / R;
  for (size_t it = 0; it < n_it; ++it) {
    const size_t row = it * R;
    double slowest = 0, sum_speed = 0, equal = 0;
    bool known = true;
    for (int k = 0; k < R; ++k) {
      slowest = std::max(slowest, d.compute_s[row + k]);
      if (d.batch[row + k] > 0 && d.compute_s[row + k] > 0) speed[k] = d.actual_speed[row + k];
      known = known && speed[k] > 0;
      sum_speed += speed[k];
      if (speed[k] > 0) equal = std::max(equal, share / speed[k]);
    }
    out.telemetry_time_s += slowest + d.allreduce_s[row] + d.balancer_s[row];
    if (!known) continue;
    ++out.estimated_iterations;
    out.compute_s += slowest;
    out.equal_split_s += equal;
    out.ideal_s += static_cast<double>(d.global_batch) / sum_speed;
  }
}

// A rank straggles in an iteration when its speed is below opt.slow_below x the median of the others' speeds;
// an episode runs from a slow iteration to the last slow one before more than opt.episode_gap normal ones
// (iterations where it got 0 samples neither start nor end one).
void find_episodes(const RunData& d, const Options& opt, RunReport& out) {
  const int R = d.ranks;
  if (R < 2) return;
  const size_t n_it = d.iteration.size() / R;
  for (int k = 0; k < R; ++k) {
    Episode e;
    bool open = false;
    int64_t gap = 0, idle = 0;  // normal and 0-sample iterations since the last slow one
    double rel_sum = 0, cpu_sum = 0, cap_sum = 0, delay = 0;
    auto close = [&] {
      if (open && e.last - e.first + 1 >= opt.min_episode) {
        e.relative_speed = rel_sum / e.slow_iterations;
        e.cpu_avail = cpu_sum / e.slow_iterations;
        e.capacity = cap_sum / e.slow_iterations;
        out.episodes.push_back(e);
      }
      open = false;
    };
    for (size_t it = 0; it < n_it; ++it) {
      const size_t row = it * R, me = row + k;
      std::vector<double> others;
      double others_max = 0;
      for (int q = 0; q < R; ++q) {
        if (q == k) continue;
        others_max = std::max(others_max, d.compute_s[row + q]);
        if (d.batch[row + q] > 0 && d.actual_speed[row + q] > 0) others.push_back(d.actual_speed[row + q]);
      }
      const double ref = median(others);
      const double held_up = std::max(0.0, d.compute_s[me] - others_max);
      if (d.batch[me] == 0 || ref <= 0) {
        if (open && d.batch[me] == 0) ++idle;
        continue;
      }
      const double rel = d.actual_speed[me] / ref;
      if (rel < opt.slow_below) {
        if (!open) {
          e = Episode{};
          e.rank = k;
          e.first = d.iteration[me];
          rel_sum = cpu_sum = cap_sum = delay = 0;
          idle = 0;
          open = true;
        }
        e.last = d.iteration[me];
        ++e.slow_iterations;
        e.idle_iterations += idle;
        idle = 0;
        rel_sum += rel;
        cpu_sum += d.cpu_avail[me];
        cap_sum += d.capacity[me];
        delay += held_up;
        e.delay_s = delay;
        gap = 0;
      } else if (open && ++gap > opt.episode_gap) {
        close();
      } else if (open) {
        delay += held_up;  // a short normal stretch inside the episode
      }
    }
    close();
  }
}

}  // namespace

RunReport analyse(const RunData& d, const Options& opt) {
  RunReport r;
  r.dir = d.dir;
  r.name = fs::path(d.dir).lexically_normal().filename().string();
  if (r.name.empty()) r.name = fs::path(d.dir).lexically_normal().parent_path().filename().string();
  r.model = d.model;
  r.balancer = d.balancer;
  r.predictor = d.predictor;
  r.straggle = d.straggle;
  r.ranks = d.ranks;
  r.global_batch = d.global_batch;
  r.iterations = static_cast<int64_t>(d.iteration.size()) / d.ranks;
  r.first_iteration = d.iteration.front();
  r.last_iteration = d.iteration.back();
  r.summary = d.summary;
  per_rank_stats(d, r);
  time_and_savings(d, r);
  find_episodes(d, opt, r);
  r.time_s = r.telemetry_time_s;
  const auto& s = d.summary;
  if (s.is_object() && s.value("iterations", int64_t{-1}) == r.iterations &&
      s.value("start_iteration", int64_t{0}) == 0 && s.contains("train_time_s") &&
      s["train_time_s"].is_number()) {
    r.time_s = s["train_time_s"].get<double>();
    r.time_from_summary = true;
  }
  r.mean_iteration_s = r.time_s / r.iterations;
  r.wait_fraction = r.time_s > 0 ? r.wait_rank_s / (r.ranks * r.time_s) : 0;
  return r;
}

void disambiguate_names(std::vector<RunReport>& runs) {
  std::set<std::string> names;
  for (const auto& r : runs) names.insert(r.name);
  if (names.size() == runs.size()) return;
  for (auto& r : runs) {
    const fs::path p = fs::path(r.dir).lexically_normal();
    const fs::path folder = p.has_filename() ? p : p.parent_path();
    r.name = (folder.parent_path().filename() / folder.filename()).string();
  }
}

namespace {

std::string balancer_name(const RunReport& r) {
  return r.balancer + (r.predictor.empty() ? "" : "/" + r.predictor);
}

std::string summary_cell(const RunReport& r, const char* key, bool seconds) {
  if (!r.summary.is_object() || !r.summary.contains(key) || !r.summary[key].is_number()) return "—";
  const double v = r.summary[key].get<double>();
  return seconds ? fmt("%.1f s", v) : fmt("%.4f", v);
}

std::string comparison_table(const std::vector<RunReport>& runs) {
  std::string s =
      "## Side by side\n\n| run | balancer | iterations | mean iteration | vs first | wait fraction | "
      "straggler episodes | predictor error | saved vs equal split | test accuracy | time to target |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  const double base = runs[0].mean_iteration_s;
  for (const auto& r : runs) {
    std::string saved = "—";
    if (r.balancer != "bsp" && r.equal_split_s > 0)
      saved = pct((r.equal_split_s - r.compute_s) / r.equal_split_s);
    s += "| " + r.name + " | " + balancer_name(r) + " | " + std::to_string(r.iterations) + " | " +
         ms(r.mean_iteration_s) + " | " + fmt("%.2fx", base / r.mean_iteration_s) + " | " +
         pct(r.wait_fraction) + " | " + std::to_string(r.episodes.size()) + " | " +
         error_cell(r.predictor_error) + " | " + saved + " | " + summary_cell(r, "test_accuracy", false) +
         " | " + summary_cell(r, "time_to_target_s", true) + " |\n";
  }
  return s + "\n(vs first: the first run's mean iteration time over this one's)\n\n";
}

std::string rank_table(const RunReport& r) {
  std::string s =
      "| rank | mean batch | compute | wait at the barrier | share of the run | speed (samples/s) | CPU "
      "available | predictor error | iterations with 0 samples "
      "|\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& k : r.per_rank)
    s += "| " + std::to_string(k.rank) + " | " + fmt("%.1f", k.mean_batch) + " | " +
         fmt("%.2f s", k.compute_s) + " | " + fmt("%.2f s", k.wait_s) + " | " +
         pct(r.time_s > 0 ? k.wait_s / r.time_s : 0) + " | " + fmt("%.0f", k.speed) + " | " +
         fmt("%.2f", k.cpu_avail) + " | " + error_cell(k.predictor_error) + " | " +
         std::to_string(k.idle_iterations) + " |\n";
  return s;
}

std::string episode_table(const RunReport& r, size_t max_episodes) {
  if (r.ranks < 2) return "One rank: no stragglers to find.\n";
  if (r.episodes.empty()) return "No straggler episodes.\n";
  auto shown = r.episodes;
  std::stable_sort(shown.begin(), shown.end(),
                   [](const Episode& a, const Episode& b) { return a.last - a.first > b.last - b.first; });
  if (shown.size() > max_episodes) shown.resize(max_episodes);
  std::sort(shown.begin(), shown.end(), [](const Episode& a, const Episode& b) {
    return a.first < b.first || (a.first == b.first && a.rank < b.rank);
  });
  std::string s =
      "| rank | iterations | slow iterations | speed vs the others | CPU available | capacity | others held "
      "up | "
      "0 samples |\n|---:|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& e : shown)
    s += "| " + std::to_string(e.rank) + " | " + std::to_string(e.first) + "–" + std::to_string(e.last) +
         " | " + std::to_string(e.slow_iterations) + " | " + fmt("%.2fx", e.relative_speed) + " | " +
         fmt("%.2f", e.cpu_avail) + " | " + fmt("%.2f", e.capacity) + " | " + fmt("%.3f s", e.delay_s) +
         " | " + std::to_string(e.idle_iterations) + " |\n";
  if (r.episodes.size() > shown.size())
    s += "\n(the " + std::to_string(shown.size()) + " longest of " + std::to_string(r.episodes.size()) +
         " episodes; --format json lists all, --max-episodes shows more)\n";
  return s;
}

}  // namespace

std::string to_markdown(const std::vector<RunReport>& runs, size_t max_episodes) {
  std::string s = "# lbbsp report\n\n";
  if (runs.size() > 1) s += comparison_table(runs);
  for (const auto& r : runs) {
    s += "## " + r.name + ": " + r.model + ", " + balancer_name(r) + ", " + std::to_string(r.ranks) +
         " rank(s), global batch " + std::to_string(r.global_batch) + "\n\n";
    s += "- `" + r.dir + "`, straggle `" + r.straggle + "`\n";
    s += "- iterations " + std::to_string(r.first_iteration) + "–" + std::to_string(r.last_iteration) + " (" +
         std::to_string(r.iterations) + "), " + fmt("%.2f s", r.time_s) + ", mean iteration " +
         ms(r.mean_iteration_s) +
         (r.time_from_summary ? " (summary; slowest compute + allreduce + coordination in the telemetry: " +
                                    ms(r.telemetry_time_s / r.iterations) + ")"
                              : " (telemetry: slowest compute + allreduce + coordination)") +
         "; waiting at the barrier " + fmt("%.2f", r.wait_rank_s) + " rank-s (" + pct(r.wait_fraction) +
         " of all rank time); predictor error " + error_cell(r.predictor_error) + "\n";
    s += savings_text(r);
    if (r.summary.is_object())
      s += "- summary: test accuracy " + summary_cell(r, "test_accuracy", false) + ", time to target " +
           summary_cell(r, "time_to_target_s", true) + ", wall " + summary_cell(r, "wall_s", true) + "\n";
    else
      s += "- no summary.json in the folder (lbbsp train --summary-json DIR/summary.json adds accuracy)\n";
    s += "\n### Per rank\n\n" + rank_table(r) + "\n### Straggler episodes\n\n" +
         episode_table(r, max_episodes) + "\n";
  }
  return s;
}

nlohmann::json to_json(const std::vector<RunReport>& runs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : runs) {
    nlohmann::json j = {{"name", r.name},
                        {"dir", r.dir},
                        {"model", r.model},
                        {"balancer", r.balancer},
                        {"predictor", r.predictor},
                        {"straggle", r.straggle},
                        {"ranks", r.ranks},
                        {"global_batch", r.global_batch},
                        {"iterations", r.iterations},
                        {"first_iteration", r.first_iteration},
                        {"last_iteration", r.last_iteration},
                        {"time_s", r.time_s},
                        {"telemetry_time_s", r.telemetry_time_s},
                        {"time_from_summary", r.time_from_summary},
                        {"mean_iteration_s", r.mean_iteration_s},
                        {"wait_rank_s", r.wait_rank_s},
                        {"wait_fraction", r.wait_fraction},
                        {"predictor_error",
                         r.predictor_error < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.predictor_error)},
                        {"compute_s", r.compute_s},
                        {"equal_split_s", r.equal_split_s},
                        {"ideal_s", r.ideal_s},
                        {"estimated_iterations", r.estimated_iterations},
                        {"summary", r.summary}};
    for (const auto& k : r.per_rank)
      j["per_rank"].push_back({{"rank", k.rank},
                               {"mean_batch", k.mean_batch},
                               {"compute_s", k.compute_s},
                               {"wait_s", k.wait_s},
                               {"speed", k.speed},
                               {"cpu_avail", k.cpu_avail},
                               {"predictor_error", k.predictor_error < 0 ? nlohmann::json(nullptr)
                                                                         : nlohmann::json(k.predictor_error)},
                               {"predictions", k.predictions},
                               {"idle_iterations", k.idle_iterations}});
    j["episodes"] = nlohmann::json::array();
    for (const auto& e : r.episodes)
      j["episodes"].push_back({{"rank", e.rank},
                               {"first", e.first},
                               {"last", e.last},
                               {"slow_iterations", e.slow_iterations},
                               {"idle_iterations", e.idle_iterations},
                               {"relative_speed", e.relative_speed},
                               {"cpu_avail", e.cpu_avail},
                               {"capacity", e.capacity},
                               {"delay_s", e.delay_s}});
    out.push_back(j);
  }
  return out;
}

}  // namespace lbbsp::runtime::report
