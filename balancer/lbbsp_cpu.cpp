// lbbsp-cpu[:PREDICTOR]: the paper's CPU algorithm: one speed predictor per worker (predictors/), the batch
// split by the predicted speeds (assign_by_speed), held while the predicted gain is within the speeds' noise.
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer_base.hpp"
#include "common/state_io.hpp"
#include "predictors/fleet.hpp"
#include "predictors/predictor.hpp"

namespace lbbsp::balancer::detail {
namespace {

constexpr const char* kStateTag = "lbbsp-cpu/5";  // the one format read: docs/checkpoints.md

// Exogenous vectors are fitted to the configured length, and non-finite entries zeroed, before predictors see
// them.
std::vector<double> fit_exo(const std::vector<double>& exo, int num_exo) {
  std::vector<double> out(static_cast<size_t>(num_exo), 0.0);
  for (size_t k = 0; k < out.size() && k < exo.size(); ++k) out[k] = std::isfinite(exo[k]) ? exo[k] : 0.0;
  return out;
}

// Measured speeds of one iteration with implausible outliers clipped to 100 x the median (a worker that
// reports a 1000x speed would otherwise be handed the whole batch).
std::vector<double> clipped_speeds(const IterationReport& report) {
  std::vector<double> speeds(report.workers.size());
  std::vector<double> valid;
  valid.reserve(speeds.size());
  for (size_t i = 0; i < speeds.size(); ++i) {
    speeds[i] = measured_speed(report.workers[i]);
    if (!std::isnan(speeds[i])) valid.push_back(speeds[i]);
  }
  if (valid.size() >= 3) {
    auto mid = valid.begin() + static_cast<std::ptrdiff_t>(valid.size() / 2);
    std::nth_element(valid.begin(), mid, valid.end());
    const double limit = 100.0 * *mid;
    for (double& s : speeds)
      if (s > limit) s = limit;
  }
  return speeds;
}

class LbbspCpuBalancer final : public BalancerBase {
 public:
  LbbspCpuBalancer(const BalancerConfig& cfg, std::string spec, BandFactors factors)
      : BalancerBase(cfg, true), spec_(std::move(spec)), factors_(factors) {
    predictors_.reserve(n());
    for (size_t i = 0; i < n(); ++i)
      predictors_.push_back(
          predictors::make_predictor(spec_, cfg.num_exo, cfg.seed + static_cast<uint64_t>(i)));
    base_speed_.assign(n(), kNaN);
    signal_base_.assign(n(), kNaN);
  }
  std::string name() const override {
    std::ostringstream name;  // the shortest form of a factor, as given (0.5, not 0.500000)
    name << "lbbsp-cpu:" << spec_;
    if (factors_.band != BandFactors::kBand) name << ";band=" << factors_.band;
    if (factors_.track != BandFactors::kTrack) name << ";track=" << factors_.track;
    if (factors_.follow) name << ";follow=1";
    return name.str();
  }
  std::vector<int64_t> initial() override { return equal_split(bounds_for(nullptr)); }
  std::vector<int64_t> next(const IterationReport& report) override {
    check_report(report);
    const std::vector<double> speeds = clipped_speeds(report);
    const std::vector<double> misses = note_misses(speeds);
    band_ = current_band();
    const std::vector<double> followed = follow_new_phase(speeds, misses);
    if (held_.empty()) held_ = report_batch(report);  // the split in flight (the initial one)
    BatchBounds bounds = bounds_for(&report);
    predicted_.resize(n());
    // Each worker's predictor state is independent: large fleets update in parallel (same results for any
    // thread count), prefetching the state two workers ahead (thousands of states do not fit in cache).
    predictors::for_each_worker(n(), [&](size_t i) {
      if (i + 2 < n()) predictors_[i + 2]->prefetch();
      const WorkerReport& w = report.workers[i];
      predictors_[i]->observe(speeds[i], fit_exo(w.exo, cfg_.num_exo));
      if (!std::isnan(speeds[i]) && std::isfinite(w.truth.capacity) && w.truth.capacity > 0)
        base_speed_[i] = speeds[i] / w.truth.capacity;
      if (std::isfinite(base_speed_[i]) && std::isfinite(w.truth.capacity_next) && w.truth.capacity_next > 0)
        predictors_[i]->set_truth(base_speed_[i] *
                                  w.truth.capacity_next);  // only the oracle predictor listens
      const bool exo_next_known = static_cast<int>(w.exo_next.size()) == cfg_.num_exo && cfg_.num_exo > 0;
      predicted_[i] =
          predictors_[i]->predict(exo_next_known ? fit_exo(w.exo_next, cfg_.num_exo) : std::vector<double>{});
      // With a capacity signal an idle worker is still tracked: its speed at capacity 1 times the capacity
      // now.
      const double cap = capacity_signal(w.exo);
      if (!std::isnan(speeds[i]) && !std::isnan(cap)) signal_base_[i] = speeds[i] / cap;
      double cap_next = capacity_signal(w.exo_next);
      if (std::isnan(cap_next)) cap_next = cap;
      const bool tracked = std::isfinite(signal_base_[i]) && !std::isnan(cap_next);
      if (std::isnan(speeds[i]) && tracked) predicted_[i] = signal_base_[i] * cap_next;
      if (tracked) bounds.min[i] = std::min(cfg_.min_batch, bounds.max[i]);
    });
    for (size_t i = 0; i < followed.size(); ++i)
      if (!std::isnan(followed[i])) predicted_[i] = followed[i];
    std::vector<int64_t> batch = assign_by_speed(predicted_, cfg_.global_batch, bounds);
    const auto iteration_s = [&] {
      double worst = 0;
      for (size_t i = 0; i < n(); ++i)
        if (batch[i] > 0 && predicted_[i] > 0) worst = std::max(worst, batch[i] / predicted_[i]);
      return worst;
    };
    const auto probed = probe_hopeless(
        report, batch, iteration_s, [&](size_t i) { return 1.0 / signal_base_[i]; }, bounds);
    std::vector<int64_t> out = !probed.empty()    ? assign_by_speed(predicted_, cfg_.global_batch, bounds)
                               : followed.empty() ? hold_within_noise(batch, bounds)
                                                  : equal_within_noise(batch, bounds);
    if (out != held_) streak_.clear();  // a new split: the evidence against the held one starts afresh
    held_ = std::move(out);
    return held_;
  }
  std::vector<double> predicted_speeds() const override { return predicted_; }
  double noise_band() const override { return band_; }
  std::string save_state() const override {
    StateWriter w(StateOf::balancer, kStateTag);
    w.put_string(spec_);
    w.put_vector(predicted_);
    w.put_vector(base_speed_);
    w.put_vector(signal_base_);
    w.put_vector(held_);
    w.put_vector(std::vector<double>{miss2_, miss_weight_});
    w.put_vector(recent_miss2_);
    w.put_vector(streak_.shares);
    w.put_vector(std::vector<double>{static_cast<double>(streak_.steps)});
    for (const auto* v : {&suspect_.misses, &suspect_.predicted, &suspect_.log_speed, &suspect_.counted})
      w.put_vector(*v);
    w.put_vector(std::vector<double>{static_cast<double>(suspect_.steps)});
    for (const auto& p : predictors_) w.put_string(p->save_state());
    return w.str();
  }
  void load_state(const std::string& state) override {
    StateReader r(StateOf::balancer, state, kStateTag);
    if (r.get_string() != spec_)
      throw std::invalid_argument("lbbsp-cpu: state was saved with another predictor");
    predicted_ = r.get_vector<double>();
    base_speed_ = r.get_vector<double>();
    signal_base_ = r.get_vector<double>();
    if (base_speed_.size() != n() || signal_base_.size() != n())
      throw std::invalid_argument("lbbsp-cpu: state is for another worker count");
    held_ = r.get_vector<int64_t>();
    const std::vector<double> miss = r.get_vector<double>();
    if (!held_.empty() && held_.size() != n())
      throw std::invalid_argument("lbbsp-cpu: state is for another worker count");
    if (miss.size() != 2u) throw std::invalid_argument("lbbsp-cpu: bad miss statistics");
    miss2_ = miss[0], miss_weight_ = miss[1];
    recent_miss2_ = r.get_vector<double>();
    if (recent_miss2_.size() > kRecentSteps) throw std::invalid_argument("lbbsp-cpu: bad miss statistics");
    streak_.shares = r.get_vector<double>();
    const std::vector<double> steps = r.get_vector<double>();
    if ((!streak_.shares.empty() && streak_.shares.size() != n()) || steps.size() != 1 || steps[0] < 0)
      throw std::invalid_argument("lbbsp-cpu: bad averaged speeds of the held split");
    streak_.steps = static_cast<size_t>(steps[0]);
    load_suspect(r);
    for (auto& p : predictors_) p->load_state(r.get_string());
  }

 private:
  // The noise band: a new split is taken only when its predicted iteration time beats the equal split's and
  // the held one's by more than the predictions' recent misses (the RMS over the workers of log(measured /
  // predicted speed) relative to the fleet's: an EMA, and at least the last report's), so that noise in the
  // measured speeds (a co-scheduled process, 3 ranks on 2 cores, DataLoader workers) does not move samples
  // back and forth, while a straggler that costs more than the noise is balanced at once. Low-noise runs
  // (modelled costs, dedicated nodes) have a band near 0. docs/balancers.md has the measurements.
  static constexpr double kMissAlpha = 0.1;     // EMA weight of the newest iteration's misses
  static constexpr size_t kRecentSteps = 3;     // the band is no wider than the widest misses of these
  static constexpr size_t kAveragedSteps = 16;  // the averaged speeds' band narrows to a quarter, no further
  static constexpr size_t kConfirmSteps = 2;  // a change of phase is followed once this many steps confirm it
  // Misses relative to the fleet's, in logs (log(measured / predicted speed) less its mean over the workers
  // measured): what all workers share (a warm-up step, a slower allreduce, a change of phase) moves no
  // sample, and a speed 10x below its prediction counts as much as one 10x above. Returns this step's.
  std::vector<double> note_misses(const std::vector<double>& speeds) {
    std::vector<double> misses = relative_misses(speeds, predicted_);
    double miss2 = 0, count = 0;
    for (double q : misses)
      if (!std::isnan(q)) miss2 += q * q, ++count;
    if (count < 2) return misses;
    miss2 /= count;
    recent_miss2_.push_back(miss2);
    if (recent_miss2_.size() > kRecentSteps) recent_miss2_.erase(recent_miss2_.begin());
    miss2_ = (1 - kMissAlpha) * miss2_ + kMissAlpha * miss2;
    miss_weight_ = (1 - kMissAlpha) * miss_weight_ + kMissAlpha;  // bias correction, as Adam's
    return misses;
  }
  // Per worker log(measured / predicted speed) less its mean over the workers measured (NaN where either is
  // missing, all NaN with fewer than 2 measured).
  std::vector<double> relative_misses(const std::vector<double>& speeds,
                                      const std::vector<double>& predicted) const {
    std::vector<double> q(n(), kNaN);
    double mean = 0, count = 0;
    for (size_t i = 0; i < n() && i < predicted.size(); ++i)
      if (speeds[i] > 0 && std::isfinite(speeds[i]) && predicted[i] > 0 && std::isfinite(predicted[i]))
        q[i] = std::log(speeds[i] / predicted[i]), mean += q[i], ++count;
    for (double& v : q) v = count >= 2 ? v - mean / count : kNaN;
    return q;
  }
  // A change of phase (phase_changed: a co-tenant come or gone) is followed on the measured speeds, skipping
  // the predictors (NARX takes 5-10 steps to unlearn the old phase) and the band (widened by the change's own
  // misses), once the next kConfirmSteps steps confirm it: each sits nearer the suspected new phase than the
  // old predictions (sum over workers of (r - q)^2 < r^2, q and r the relative misses of the predictions made
  // before the change, on the suspected step and this one). A slow step or two (gone the next) move nothing:
  // recorded under a steady co-tenant, two-step blips were followed there and back at one confirming step.
  // Returns the speeds to split by (the geometric mean of the suspected and confirming steps'; NaN for a
  // worker measured in none of them), or nothing. `misses`: this step's, of predicted_ (note_misses).
  std::vector<double> follow_new_phase(const std::vector<double>& speeds, const std::vector<double>& misses) {
    if (!factors_.follow) return {};
    if (suspect_.misses.empty()) {
      if (phase_changed()) suspect_.start(misses, predicted_, speeds);
      return {};
    }
    const std::vector<double> r = relative_misses(speeds, suspect_.predicted);
    double nearer_new = 0, nearer_old = 0;
    for (size_t i = 0; i < n(); ++i)
      if (!std::isnan(r[i]) && !std::isnan(suspect_.misses[i]))
        nearer_new += (r[i] - suspect_.misses[i]) * (r[i] - suspect_.misses[i]), nearer_old += r[i] * r[i];
    if (!(nearer_new < nearer_old)) {
      suspect_.clear();  // its echo (the step after a spike, back to normal) is no change of phase of its own
      return {};
    }
    suspect_.add(speeds);
    if (suspect_.steps <= kConfirmSteps) return {};
    std::vector<double> followed = suspect_.mean_speeds();
    suspect_.clear();
    return followed;
  }
  // At least this iteration's own misses: after one wild step (a rank's DataLoader worker starved) the
  // predictions are off by about what that step missed by, and the next steps' misses say how far they still
  // are, so samples move only once the predictions have settled. At most the widest misses of the last
  // kRecentSteps: a burst (the first steps, while the predictors know nothing; a change of phase) stops
  // widening the band once it is over, where the EMA alone held a wrong split for 10-15 steps; noise that
  // persists keeps it wide.
  double current_band() const {
    if (miss_weight_ <= 0 || recent_miss2_.empty()) return 0.0;
    const double recent_max = *std::max_element(recent_miss2_.begin(), recent_miss2_.end());
    return std::sqrt(std::min(std::max(miss2_ / miss_weight_, recent_miss2_.back()), recent_max));
  }
  std::vector<int64_t> report_batch(const IterationReport& report) const {
    std::vector<int64_t> b(n());
    for (size_t i = 0; i < n(); ++i) b[i] = report.workers[i].batch;
    return b;
  }
  // The equal split when the new one beats it by no more than the noise (the speeds are then not known to
  // differ) and the speeds averaged over the held split do not tell the workers apart either, else the held
  // split when the new one beats that by no more than the noise times `track` (and the averaged speeds do not
  // say otherwise: below), else the new one. Leaving and returning to the equal split take the full band.
  std::vector<int64_t> hold_within_noise(const std::vector<int64_t>& batch, const BatchBounds& bounds) {
    const auto curves = curves_from_speeds(predicted_);
    const double band = factors_.band * band_, new_s = slowest_finish_s(curves, batch);
    const auto gains_little_over = [&](const std::vector<int64_t>& other, double width) {  // in logs
      return std::log(slowest_finish_s(curves, other) / new_s) <= width;
    };
    if (band <= 0) return batch;
    const std::vector<int64_t> equal = equal_split(bounds);
    const double track = equal == held_ ? band : factors_.track * band;  // between two unequal splits
    const bool keep_equal = gains_little_over(equal, band);
    if (!keep_equal && !(within(held_, bounds) && gains_little_over(held_, track))) return batch;
    if (!keep_equal || equal == held_) return held_or_averaged(track, bounds);
    if (!within(held_, bounds) || phase_changed()) return equal;
    const std::vector<int64_t> kept = held_or_averaged(track, bounds);
    return averaged_tell_apart(equal, kept, band) ? kept : equal;
  }
  // The split of a followed change of phase, or the equal split where that gains no more than the misses' EMA
  // (which the change itself has widened by a fifth of its own misses, not all of them as the band).
  std::vector<int64_t> equal_within_noise(const std::vector<int64_t>& batch,
                                          const BatchBounds& bounds) const {
    const std::vector<int64_t> equal = equal_split(bounds);
    const auto curves = curves_from_speeds(predicted_);
    const double ema_band = miss_weight_ > 0 ? std::sqrt(miss2_ / miss_weight_) : 0.0;
    const double gain = std::log(slowest_finish_s(curves, equal) / slowest_finish_s(curves, batch));
    return gain <= factors_.band * ema_band ? equal : batch;
  }
  // One step's prediction within the band of the equal split is noise as often as not: with a co-tenant off,
  // ranks a few percent apart (about one band) went to and from the equal split on 64 of 72 changes. So a
  // held split gives way to the equal one only when the speeds averaged over it (this step's included) gain
  // less than their own band over it, as held_or_averaged weighs the held split against the averaged one.
  bool averaged_tell_apart(const std::vector<int64_t>& equal, const std::vector<int64_t>& kept,
                           double band) const {
    if (streak_.steps == 0) return false;
    const auto curves = curves_from_speeds(streak_mean());
    const double gain = std::log(slowest_finish_s(curves, equal) / slowest_finish_s(curves, kept));
    return gain > band / std::sqrt(static_cast<double>(std::min<size_t>(streak_.steps, kAveragedSteps)));
  }
  // This step missed by more than twice the misses' RMS: a change of phase (a co-tenant gone), after which
  // the average over the held split is of the old phase and this step's own prediction decides.
  bool phase_changed() const {
    return !recent_miss2_.empty() && miss_weight_ > 0 && recent_miss2_.back() > 4 * miss2_ / miss_weight_;
  }
  // The noise band keeps a held split while each new prediction beats it by less than one step's misses.
  // Under a co-tenant that time-shares a core those misses are wide (20-30%), and a split taken on a noisy
  // step could be held for hundreds of steps 20% off (seen with 2 gloo ranks and a spinning co-tenant). The
  // mean of n steps' predictions misses by about band / sqrt(n): once the split best for the averaged speeds
  // beats the held one by more than that (n counted to 16: a split within a quarter of the band stays), it is
  // taken. Noise alone averages towards the held split, and nothing moves.
  std::vector<int64_t> held_or_averaged(double band, const BatchBounds& bounds) {
    double total = 0;
    for (double p : predicted_) total += std::isfinite(p) && p > 0 ? p : 0;
    if (total <= 0) return held_;
    if (streak_.shares.size() != n()) streak_.shares.assign(n(), 0.0);
    for (size_t i = 0; i < n(); ++i)  // shares, so that the fleet's speed changing together weighs nothing
      streak_.shares[i] += std::isfinite(predicted_[i]) && predicted_[i] > 0 ? predicted_[i] / total : 0.0;
    ++streak_.steps;
    const std::vector<double> mean = streak_mean();
    const std::vector<int64_t> averaged = assign_by_speed(mean, cfg_.global_batch, bounds);
    const auto curves = curves_from_speeds(mean);
    const double gain = std::log(slowest_finish_s(curves, held_) / slowest_finish_s(curves, averaged));
    const double steps = static_cast<double>(std::min<size_t>(streak_.steps, kAveragedSteps));
    return gain > band / std::sqrt(steps) ? averaged : held_;
  }
  void load_suspect(StateReader& r) {
    for (auto* v : {&suspect_.misses, &suspect_.predicted, &suspect_.log_speed, &suspect_.counted}) {
      *v = r.get_vector<double>();
      if (v->size() != suspect_.misses.size() || (!v->empty() && v->size() != n()))
        throw std::invalid_argument("lbbsp-cpu: bad suspected change of phase");
    }
    const std::vector<double> steps = r.get_vector<double>();
    if (steps.size() != 1 || steps[0] < 0 || steps[0] > kConfirmSteps)
      throw std::invalid_argument("lbbsp-cpu: bad suspected change of phase");
    suspect_.steps = static_cast<size_t>(steps[0]);
  }
  std::vector<double> streak_mean() const {  // the held split's averaged speeds, as shares
    std::vector<double> mean(n(), 0.0);
    for (size_t i = 0; i < n() && i < streak_.shares.size(); ++i)
      mean[i] = streak_.shares[i] / static_cast<double>(std::max<size_t>(streak_.steps, 1));
    return mean;
  }

  std::string spec_;
  BandFactors factors_;  // ;band=, ;track=: the band's widths; ;follow=1: follow_new_phase
  std::vector<std::unique_ptr<predictors::Predictor>> predictors_;
  std::vector<double> predicted_;
  std::vector<double> base_speed_;   // speed at capacity 1 (ground truth capacity), for the oracle predictor
  std::vector<double> signal_base_;  // speed at capacity 1 by the capacity exo (cfg.capacity_exo)
  std::vector<int64_t> held_;  // the split last decided (kept while a change would gain less than the noise)
  double miss2_ = 0, miss_weight_ = 0;  // EMA of the mean squared relative miss, and its weight so far
  std::vector<double> recent_miss2_;    // the mean squared relative miss of the last few reports, newest last
  double band_ = 0;  // current_band() at the last report (noise_band(): for logs and tests)
  struct Streak {    // the predicted speeds (as shares) summed over the steps held_ was kept
    std::vector<double> shares;
    size_t steps = 0;
    void clear() { shares.clear(), steps = 0; }
  } streak_;
  struct Suspect {  // a change of phase seen on one step, to be confirmed by the next two (follow_new_phase)
    std::vector<double> misses, predicted;   // that step's relative misses and the predictions they missed
    std::vector<double> log_speed, counted;  // per worker: the sum of log(speed) since, and how many
    size_t steps = 0;                        // the steps summed (the suspected one included)
    void start(std::vector<double> q, std::vector<double> p, const std::vector<double>& speeds) {
      misses = std::move(q), predicted = std::move(p);
      log_speed.assign(speeds.size(), 0.0), counted.assign(speeds.size(), 0.0), steps = 0;
      add(speeds);
    }
    void add(const std::vector<double>& speeds) {
      for (size_t i = 0; i < speeds.size() && i < log_speed.size(); ++i)
        if (speeds[i] > 0 && std::isfinite(speeds[i])) log_speed[i] += std::log(speeds[i]), ++counted[i];
      ++steps;
    }
    std::vector<double> mean_speeds() const {  // geometric means (NaN: never measured)
      std::vector<double> mean(log_speed.size(), kNaN);
      for (size_t i = 0; i < mean.size(); ++i)
        if (counted[i] > 0) mean[i] = std::exp(log_speed[i] / counted[i]);
      return mean;
    }
    void clear() { *this = Suspect{}; }
  } suspect_;
};

}  // namespace

std::unique_ptr<Balancer> make_lbbsp_cpu(const BalancerConfig& cfg, const std::string& predictor_spec,
                                         BandFactors factors) {
  return std::make_unique<LbbspCpuBalancer>(cfg, predictor_spec, factors);
}

}  // namespace lbbsp::balancer::detail
