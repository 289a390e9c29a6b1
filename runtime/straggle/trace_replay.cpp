#include "runtime/straggle/trace_replay.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "runtime/analysis/traces.hpp"
#include "runtime/straggle/emulation.hpp"

namespace lbbsp::runtime::straggle {

namespace {

CapacitySeries to_capacity_series(const TraceSeries& t) {
  CapacitySeries s;
  s.source = t.source;
  s.origin_s = t.origin_s;
  for (double c : t.capacity) s.capacity.push_back(std::clamp(std::isfinite(c) ? c : 1.0, 0.05, 1.0));
  s.time_s = t.time_s;
  if (s.time_s.size() != s.capacity.size()) {  // no usable clock: one step per second
    s.time_s.resize(s.capacity.size());
    for (size_t k = 0; k < s.time_s.size(); ++k) s.time_s[k] = static_cast<double>(k);
  }
  for (size_t k = 0; k < t.exo_names.size(); ++k) {
    if (t.exo_names[k].find("mem") == std::string::npos) continue;
    for (double v : t.exo[k]) {
      const double frac = v > 1.0 ? v / 100.0 : v;  // percent or fraction used
      s.mem_avail.push_back(std::clamp(1.0 - frac, 0.0, 1.0));
    }
    break;  // the first memory column only
  }
  return s;
}

class TraceReplay final : public Emulation {
 public:
  explicit TraceReplay(const Config& c);
  bool replay() const override { return true; }
  double replay_capacity(int rank, double elapsed_s) const override {
    return series_of(rank).capacity[step_of(rank, elapsed_s)];
  }
  std::optional<double> mem_avail(int rank, double elapsed_s) const override {
    const auto& mem = series_of(rank).mem_avail;
    if (mem.empty()) return std::nullopt;
    return mem[step_of(rank, elapsed_s) % mem.size()];
  }
  const std::string& source_of(int rank) const override { return series_of(rank).source; }
  double trace_time(int rank, double elapsed_s) const override {
    const auto& s = series_of(rank);
    return s.origin_s + s.time_s[step_of(rank, elapsed_s)];
  }

 private:
  const CapacitySeries& series_of(int rank) const { return series_[series_of_rank_[rank]]; }
  int64_t step_of(int rank, double elapsed_s) const;
  void assign_aligned(std::mt19937_64& rng, const std::vector<int>& order, int ranks);
  void assign_from_offsets(std::mt19937_64& rng, const std::vector<int>& order, const Config& c);

  std::vector<CapacitySeries> series_;
  double scale_s_ = 1.0;
  double rate_ = 0;                    // trace seconds per training second (0: scale_s_ per step)
  std::vector<int> series_of_rank_;    // which series each rank replays
  std::vector<int64_t> offsets_;       // start step per rank
  std::vector<double> start_of_rank_;  // trace time (from the series' origin) at elapsed 0
};

TraceReplay::TraceReplay(const Config& c)
    : series_(load_capacity_series(c)), scale_s_(c.scale_s), rate_(c.rate) {
  // Seeded assignment of series to ranks (cycled when more ranks than series) and start offsets.
  std::mt19937_64 rng(c.seed ^ 0x5eedULL);
  std::vector<int> order(series_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::shuffle(order.begin(), order.end(), rng);
  if (c.align_time)
    assign_aligned(rng, order, c.ranks);
  else
    assign_from_offsets(rng, order, c);
}

// Co-located machines at one moment: a seeded start time in the traces' own clock, covered by as many series
// as there are ranks (or by the most found in 1000 draws); ranks take distinct covering series.
void TraceReplay::assign_aligned(std::mt19937_64& rng, const std::vector<int>& order, int ranks) {
  double lo = INFINITY, hi = -INFINITY;
  for (auto& s : series_) lo = std::min(lo, s.origin_s), hi = std::max(hi, s.origin_s + s.span_s());
  auto covering = [&](double t) {
    std::vector<int> out;
    for (int i : order)
      if (series_[i].origin_s <= t && t <= series_[i].origin_s + series_[i].span_s()) out.push_back(i);
    return out;
  };
  std::uniform_real_distribution<double> when(lo, std::max(lo, hi));
  std::vector<int> best;
  double best_t = lo;
  const size_t want = std::min(series_.size(), static_cast<size_t>(ranks));
  for (int draw = 0; draw < 1000 && best.size() < want; ++draw) {
    const double t = when(rng);
    auto covered = covering(t);
    if (covered.size() > best.size()) best = covered, best_t = t;
  }
  if (best.empty()) best = order;
  for (int r = 0; r < ranks; ++r) {
    const int s = best[r % best.size()];
    series_of_rank_.push_back(s);
    offsets_.push_back(0);
    start_of_rank_.push_back(std::max(0.0, best_t - series_[s].origin_s));
  }
}

void TraceReplay::assign_from_offsets(std::mt19937_64& rng, const std::vector<int>& order, const Config& c) {
  for (int r = 0; r < c.ranks; ++r) {
    const int s = order[r % order.size()];
    series_of_rank_.push_back(s);
    const int64_t len = static_cast<int64_t>(series_[s].capacity.size());
    const int64_t off = c.offsets.empty() ? static_cast<int64_t>(rng() % len)
                                          : c.offsets[std::min<size_t>(r, c.offsets.size() - 1)];
    offsets_.push_back(((off % len) + len) % len);
    start_of_rank_.push_back(series_[s].time_s[offsets_.back()]);
  }
}

int64_t TraceReplay::step_of(int rank, double elapsed_s) const {
  const auto& s = series_of(rank);
  const int64_t len = static_cast<int64_t>(s.capacity.size());
  if (rate_ > 0) {
    // The trace's own clock: the latest sample at or before the replayed time holds until the next one.
    double t = start_of_rank_[rank] + rate_ * std::max(0.0, elapsed_s);
    // Replay wraps around; the last sample lasts one mean sample gap before the first comes back.
    const double span = s.span_s();
    if (span > 0) t = std::fmod(t, span + span / static_cast<double>(len - 1));
    auto it = std::upper_bound(s.time_s.begin(), s.time_s.end(), t);
    return std::max<int64_t>(0, static_cast<int64_t>(it - s.time_s.begin()) - 1);
  }
  const int64_t step = static_cast<int64_t>(std::floor(std::max(0.0, elapsed_s) / scale_s_)) + offsets_[rank];
  return step % len;  // replay wraps around
}

}  // namespace

std::vector<CapacitySeries> load_capacity_series(const Config& c) {
  std::vector<CapacitySeries> out;
  for (const auto& path : c.trace_paths) {
    std::vector<TraceSeries> loaded;
    try {
      loaded = load_traces(path);
    } catch (const std::exception& e) {
      fail(c, e.what());
    }
    for (const auto& t : loaded) {
      CapacitySeries s = to_capacity_series(t);
      if (!s.capacity.empty()) out.push_back(std::move(s));
    }
  }
  if (out.empty()) {
    std::string args;
    for (const auto& p : c.trace_paths) args += (args.empty() ? "" : ",") + p;
    fail(c, "no trace series found in '" + args + "'");
  }
  return out;
}

std::unique_ptr<Emulation> make_trace_replay(const Config& config) {
  return std::make_unique<TraceReplay>(config);
}

}  // namespace lbbsp::runtime::straggle
