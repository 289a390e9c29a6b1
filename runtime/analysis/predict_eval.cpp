#include "runtime/analysis/predict_eval.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "balancer/balancer.hpp"
#include "common/format.hpp"
#include "predictors/predictor.hpp"

namespace lbbsp::runtime {
namespace {

constexpr const char* kReference = "ema";  // rmse_vs_ema is relative to the default EMA

// Running sums of one predictor's errors.
struct ErrorSums {
  size_t n = 0;
  double sq = 0, abs = 0, rel = 0;
  void add(double predicted, double truth) {
    const double e = predicted - truth;
    ++n;
    sq += e * e;
    abs += std::abs(e);
    rel += std::abs(e) / std::abs(truth);
  }
  void merge(const ErrorSums& o) {
    n += o.n;
    sq += o.sq;
    abs += o.abs;
    rel += o.rel;
  }
  double rmse() const { return n ? std::sqrt(sq / n) : NAN; }
};

ErrorSums replay(const EvalSeries& s, const std::string& spec, uint64_t seed, size_t max_steps) {
  auto predictor = predictors::make_predictor(spec, s.num_exo, seed);
  ErrorSums sums;
  const size_t steps = max_steps ? std::min(max_steps, s.speed.size()) : s.speed.size();
  const size_t k = static_cast<size_t>(s.num_exo);
  std::vector<double> exo(k), exo_next;
  for (size_t t = 0; t < steps; ++t) {
    if (t > 0) {
      predictor->set_truth(s.speed[t]);
      const double p = predictor->predict(exo_next);
      if (!std::isfinite(p) || p <= 0)
        throw std::logic_error("predictor '" + spec + "' returned " + std::to_string(p) + " on " + s.source);
      if (std::isfinite(s.speed[t]) && s.speed[t] > 0) sums.add(p, s.speed[t]);
    }
    std::copy(s.exo.begin() + t * k, s.exo.begin() + (t + 1) * k, exo.begin());
    predictor->observe(s.speed[t], exo);
    if (s.exo_next.empty()) {
      exo_next.clear();
    } else {
      exo_next.assign(s.exo_next.begin() + t * k, s.exo_next.begin() + (t + 1) * k);
    }
  }
  return sums;
}

std::vector<PredictorScore> scores(const std::vector<std::string>& specs, const std::vector<ErrorSums>& sums,
                                   const ErrorSums& reference) {
  std::vector<PredictorScore> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ErrorSums& e = sums[i];
    PredictorScore s;
    s.predictor = specs[i];
    s.steps = e.n;
    s.rmse = e.rmse();
    s.mae = e.n ? e.abs / e.n : NAN;
    s.mape = e.n ? 100.0 * e.rel / e.n : NAN;
    s.rmse_vs_ema = s.rmse / reference.rmse();
    out.push_back(s);
  }
  return out;
}

// ---- HDF5 telemetry ----

struct H5Id {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5Id() {
    if (id >= 0) close(id);
  }
};

template <class T>
std::vector<T> read_column(hid_t group, const std::string& name, hid_t mem_type, const std::string& file) {
  if (H5Lexists(group, name.c_str(), H5P_DEFAULT) <= 0)
    throw std::runtime_error(file + ": missing dataset /records/" + name);
  H5Id ds{H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (ds.id < 0) throw std::runtime_error(file + ": cannot open /records/" + name);
  H5Id space{H5Dget_space(ds.id), H5Sclose};
  if (H5Sget_simple_extent_ndims(space.id) != 1)
    throw std::runtime_error(file + ": /records/" + name + " is not 1-D");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.id, &n, nullptr);
  std::vector<T> v(n);
  if (n && H5Dread(ds.id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw std::runtime_error(file + ": cannot read /records/" + name);
  return v;
}

// A score to `precision` significant digits; "nan" for any non-finite one.
std::string score(double v, int precision) {
  return std::isfinite(v) ? fmt("%.*g", precision, v) : "nan";
}

void md_table(std::ostringstream& out, const std::vector<PredictorScore>& rows) {
  out << "| predictor | steps | RMSE | MAE | MAPE % | RMSE / EMA |\n|---|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows)
    out << "| " << r.predictor << " | " << r.steps << " | " << score(r.rmse, 5) << " | " << score(r.mae, 5)
        << " | " << score(r.mape, 4) << " | " << score(r.rmse_vs_ema, 4) << " |\n";
}

}  // namespace

std::vector<std::string> split_predictor_list(const std::string& list) {
  std::vector<std::string> specs;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    // "2", "0.5", "dy=4" continue the previous spec's arguments; anything else ("lstm" too) starts a new
    // spec.
    const bool argument_like =
        !item.empty() && item.find(':') == std::string::npos &&
        (item.find('=') != std::string::npos || std::isdigit(static_cast<unsigned char>(item[0])) ||
         item[0] == '.' || item[0] == '-');
    if (argument_like && !specs.empty() && specs.back().find(':') != std::string::npos)
      specs.back() += "," + item;
    else
      specs.push_back(item);
  }
  return specs;
}

std::vector<EvalSeries> series_from_traces(const std::vector<TraceSeries>& traces) {
  std::vector<EvalSeries> out;
  for (const TraceSeries& t : traces) {
    EvalSeries s;
    s.family = t.family;
    s.source = t.source;
    s.num_exo = static_cast<int>(t.exo.size());
    s.speed = t.capacity;
    s.exo.resize(s.speed.size() * s.num_exo);
    for (size_t i = 0; i < s.speed.size(); ++i)
      for (int k = 0; k < s.num_exo; ++k) s.exo[i * s.num_exo + k] = t.exo[k][i];
    out.push_back(std::move(s));  // exo_next stays empty: nothing of the predicted step is known
  }
  return out;
}

std::vector<EvalSeries> series_from_telemetry(const std::string& run_dir, TelemetryExo mode) {
  const std::string file = (std::filesystem::path(run_dir) / "telemetry.h5").string();
  if (!std::filesystem::exists(file)) throw std::runtime_error(file + ": no such telemetry file");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // we report errors ourselves, naming the file
  H5Id f{H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (f.id < 0) throw std::runtime_error(file + ": cannot open as HDF5");
  if (H5Lexists(f.id, "records", H5P_DEFAULT) <= 0)
    throw std::runtime_error(file + ": missing group /records");
  H5Id g{H5Gopen2(f.id, "records", H5P_DEFAULT), H5Gclose};
  if (g.id < 0) throw std::runtime_error(file + ": cannot open group /records");
  auto iteration = read_column<int64_t>(g.id, "iteration", H5T_NATIVE_INT64, file);
  auto rank = read_column<int32_t>(g.id, "rank", H5T_NATIVE_INT32, file);
  auto speed = read_column<double>(g.id, "actual_speed", H5T_NATIVE_DOUBLE, file);
  std::vector<std::vector<double>> exo;  // telemetry's columns of the rank's exogenous inputs
  for (const char* name : balancer::kRankExo)
    exo.push_back(read_column<double>(g.id, name, H5T_NATIVE_DOUBLE, file));
  const size_t n = iteration.size();
  bool equal = rank.size() == n && speed.size() == n;
  for (auto& column : exo) equal = equal && column.size() == n;
  if (!equal) throw std::runtime_error(file + ": /records datasets have different lengths");
  std::map<int32_t, std::vector<size_t>> rows_by_rank;
  for (size_t i = 0; i < n; ++i) rows_by_rank[rank[i]].push_back(i);
  std::vector<EvalSeries> out;
  for (auto& [r, rows] : rows_by_rank) {
    std::stable_sort(rows.begin(), rows.end(),
                     [&](size_t a, size_t b) { return iteration[a] < iteration[b]; });
    EvalSeries s;
    s.family = "telemetry";
    s.source = file + "#rank" + std::to_string(r);
    s.num_exo = static_cast<int>(exo.size());
    for (size_t j = 0; j < rows.size(); ++j) {
      s.speed.push_back(speed[rows[j]]);
      for (const auto& column : exo) s.exo.push_back(column[rows[j]]);
      if (mode == TelemetryExo::kBarrier) {
        // Measured at the barrier after iteration j: the newest values known before iteration j+1.
        for (const auto& column : exo) s.exo_next.push_back(column[rows[j]]);
      } else {
        // The next row's values, known before the next iteration by that convention.
        for (const auto& column : exo) s.exo_next.push_back(j + 1 < rows.size() ? column[rows[j + 1]] : NAN);
      }
    }
    out.push_back(std::move(s));
  }
  if (out.empty()) throw std::runtime_error(file + ": /records is empty");
  return out;
}

EvalReport evaluate(const std::vector<EvalSeries>& all_series, const EvalOptions& options) {
  if (options.predictors.empty()) throw std::invalid_argument("no predictors to evaluate");
  for (const auto& spec : options.predictors) predictors::make_predictor(spec, 0, 0);  // validate specs early
  const size_t count =
      options.max_series ? std::min(options.max_series, all_series.size()) : all_series.size();
  const size_t p = options.predictors.size();
  std::vector<ErrorSums> total(p);
  ErrorSums total_ref;
  std::map<std::string, std::vector<ErrorSums>> family;
  std::map<std::string, ErrorSums> family_ref;
  EvalReport report;
  for (size_t i = 0; i < count; ++i) {
    const EvalSeries& s = all_series[i];
    const uint64_t seed = options.seed * 1000003ull + i;
    auto& fam = family[s.family];
    fam.resize(p);
    ++report.family_series[s.family];
    for (size_t j = 0; j < p; ++j) {
      ErrorSums e = replay(s, options.predictors[j], seed, options.max_steps);
      total[j].merge(e);
      fam[j].merge(e);
    }
    ErrorSums ref = replay(s, kReference, seed, options.max_steps);
    total_ref.merge(ref);
    family_ref[s.family].merge(ref);
    report.steps += ref.n;
  }
  report.series = count;
  report.overall = scores(options.predictors, total, total_ref);
  for (auto& [name, sums] : family)
    report.by_family[name] = scores(options.predictors, sums, family_ref[name]);
  return report;
}

std::string format_report(const EvalReport& report, const std::string& format) {
  std::ostringstream out;
  if (format == "json") {
    nlohmann::json j;
    j["series"] = report.series;
    j["steps"] = report.steps;
    auto rows = [](const std::vector<PredictorScore>& scores) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& s : scores)
        a.push_back({{"predictor", s.predictor},
                     {"rmse", s.rmse},
                     {"mae", s.mae},
                     {"mape", s.mape},
                     {"rmse_vs_ema", s.rmse_vs_ema},
                     {"steps", s.steps}});
      return a;
    };
    j["results"] = rows(report.overall);
    nlohmann::json fam = nlohmann::json::object();
    for (const auto& [name, scores] : report.by_family)
      fam[name] = {{"series", report.family_series.at(name)}, {"results", rows(scores)}};
    j["families"] = fam;
    out << j.dump(2) << "\n";
  } else if (format == "csv") {
    out << "family,predictor,steps,rmse,mae,mape,rmse_vs_ema\n";
    auto rows = [&](const std::string& family, const std::vector<PredictorScore>& scores) {
      for (const auto& s : scores)
        out << family << "," << s.predictor << "," << s.steps << "," << score(s.rmse, 8) << ","
            << score(s.mae, 8) << "," << score(s.mape, 8) << "," << score(s.rmse_vs_ema, 8) << "\n";
    };
    rows("all", report.overall);
    for (const auto& [name, scores] : report.by_family) rows(name, scores);
  } else if (format == "md") {
    out << "## All series (" << report.series << " series, " << report.steps << " scored steps)\n\n";
    md_table(out, report.overall);
    for (const auto& [name, scores] : report.by_family) {
      out << "\n## " << name << " (" << report.family_series.at(name) << " series)\n\n";
      md_table(out, scores);
    }
  } else {
    throw std::invalid_argument("unknown format '" + format + "' (valid: md, csv, json)");
  }
  return out.str();
}

}  // namespace lbbsp::runtime
