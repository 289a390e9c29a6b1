// `lbbsp_peers`: the `lbbsp` command with two more balancer kinds, the peers bench/train_cotenant.py runs
// beside lbbsp-cpu (benchmark code, not the product; bench/torch_cotenant.py has the same two for
// lbbsp.torch):
//   omnilearn[:WINDOW]  OmniLearn's controller (TPDS 2025) as its paper gives it: every WINDOW iterations
//   (20) each
//                       worker moves its batch by -(b/t)(t - mean t), t its mean compute time over the
//                       window, where |t - mean t| > 5% of mean t
//   naive               what a user would write: sizes proportional to the measured speeds (samples/s), an
//   EMA of
//                       0.5, re-sized every iteration
// Both keep every worker at >= 1 sample and ignore memory caps (the CPU runs they serve have none).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/balancer.hpp"

namespace {

using lbbsp::balancer::Balancer;
using lbbsp::balancer::BalancerConfig;
using lbbsp::balancer::IterationReport;

// Integer sizes proportional to `weights`, summing to `total`, each >= 1 (largest remainders).
std::vector<int64_t> largest_remainder(const std::vector<double>& weights, int64_t total) {
  const auto n = static_cast<int64_t>(weights.size());
  std::vector<double> w(weights.size());
  std::transform(weights.begin(), weights.end(), w.begin(),
                 [](double v) { return std::isfinite(v) ? std::max(v, 1e-12) : 1e-12; });
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<int64_t> sizes(w.size());
  std::vector<double> raw(w.size());
  int64_t given = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    raw[i] = w[i] / sum * static_cast<double>(total - n);
    sizes[i] = static_cast<int64_t>(std::floor(raw[i]));
    given += sizes[i];
  }
  std::vector<size_t> order(w.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return raw[a] - sizes[a] > raw[b] - sizes[b]; });
  for (int64_t k = 0; k < total - n - given; ++k) ++sizes[order[static_cast<size_t>(k)]];
  for (auto& s : sizes) ++s;
  return sizes;
}

class PeerBase : public Balancer {
 public:
  explicit PeerBase(const BalancerConfig& cfg) : cfg_(cfg) {
    if (cfg.global_batch < cfg.workers)
      throw std::invalid_argument(name_of(cfg) + ": needs a global batch >= the workers (one sample each)");
    sizes_ = largest_remainder(std::vector<double>(static_cast<size_t>(cfg.workers), 1.0), cfg.global_batch);
  }
  std::vector<int64_t> initial() override { return sizes_; }
  std::string save_state() const override { throw no_checkpoint(); }
  void load_state(const std::string&) override { throw no_checkpoint(); }

 protected:
  static std::string name_of(const BalancerConfig& cfg) { return cfg.name.substr(0, cfg.name.find(':')); }
  std::runtime_error no_checkpoint() const {
    return std::runtime_error(name() +
                              ": a benchmark peer keeps no checkpoint (run without --checkpoint-dir)");
  }
  BalancerConfig cfg_;
  std::vector<int64_t> sizes_;
};

class OmniLearn final : public PeerBase {
 public:
  OmniLearn(const BalancerConfig& cfg, int64_t window)
      : PeerBase(cfg), window_(window), sum_s_(static_cast<size_t>(cfg.workers), 0.0) {}
  std::string name() const override { return "omnilearn"; }
  std::vector<int64_t> next(const IterationReport& report) override {
    for (size_t i = 0; i < sum_s_.size(); ++i) sum_s_[i] += report.workers.at(i).compute_s;
    if (++seen_ % window_ != 0) return sizes_;
    const double mean =
        std::accumulate(sum_s_.begin(), sum_s_.end(), 0.0) / static_cast<double>(sum_s_.size());
    std::vector<double> target(sum_s_.size());
    for (size_t i = 0; i < sum_s_.size(); ++i) {
      const double b = static_cast<double>(sizes_[i]), t = sum_s_[i];  // sums: the means' ratios are the same
      const double move = std::abs(t - mean) > kBand * mean && t > 0 ? -(b / t) * (t - mean) : 0.0;
      target[i] = std::max(b + move, 1.0);
    }
    std::fill(sum_s_.begin(), sum_s_.end(), 0.0);
    return sizes_ = largest_remainder(target, cfg_.global_batch);
  }

 private:
  static constexpr double kBand = 0.05;
  int64_t window_, seen_ = 0;
  std::vector<double> sum_s_;
};

class Naive final : public PeerBase {
 public:
  using PeerBase::PeerBase;
  std::string name() const override { return "naive"; }
  std::vector<int64_t> next(const IterationReport& report) override {
    speed_.resize(sizes_.size(), std::nan(""));
    for (size_t i = 0; i < speed_.size(); ++i) {
      const auto& w = report.workers.at(i);
      if (!(w.compute_s > 0) || w.batch <= 0) continue;  // no speed measured: the last one stands
      const double s = static_cast<double>(w.batch) / w.compute_s;
      speed_[i] = std::isnan(speed_[i]) ? s : 0.5 * speed_[i] + 0.5 * s;
    }
    if (std::any_of(speed_.begin(), speed_.end(), [](double s) { return std::isnan(s); })) return sizes_;
    return sizes_ = largest_remainder(speed_, cfg_.global_batch);
  }

 private:
  std::vector<double> speed_;
};

int64_t window_of(const std::string& args) {
  size_t used = 0;
  int64_t window = 20;
  try {
    if (!args.empty()) window = std::stoll(args, &used);
  } catch (const std::exception&) {
    used = std::string::npos;
  }
  if ((!args.empty() && used != args.size()) || window < 1)
    throw std::invalid_argument("omnilearn:WINDOW takes a window of >= 1 iterations, got '" + args + "'");
  return window;
}

// Registered before main() runs (runtime/cli/main.cpp, linked into this program as into `lbbsp`).
[[maybe_unused]] const bool kRegistered = [] {
  lbbsp::balancer::register_balancer("omnilearn", [](const BalancerConfig& cfg, const std::string& args) {
    return std::unique_ptr<Balancer>(std::make_unique<OmniLearn>(cfg, window_of(args)));
  });
  lbbsp::balancer::register_balancer("naive", [](const BalancerConfig& cfg, const std::string& args) {
    if (!args.empty()) throw std::invalid_argument("naive takes no arguments, got '" + args + "'");
    return std::unique_ptr<Balancer>(std::make_unique<Naive>(cfg));
  });
  return true;
}();

}  // namespace
