#include "runtime/train/batch_manager.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace lbbsp::runtime {

BatchSizeManager::BatchSizeManager(const balancer::BalancerConfig& cfg, int lag)
    : cfg_(cfg), lag_(lag), balancer_(balancer::make_balancer(cfg)) {
  if (lag < 0) throw std::invalid_argument("lag " + std::to_string(lag) + " must be >= 0");
}

BatchSizeManager::~BatchSizeManager() {
  if (in_flight_.valid()) in_flight_.wait();
}

void BatchSizeManager::check(const std::vector<int64_t>& b) const {
  if (static_cast<int>(b.size()) != cfg_.workers) {
    throw std::logic_error("balancer '" + cfg_.name + "' returned " + std::to_string(b.size()) +
                           " batch sizes for " + std::to_string(cfg_.workers) + " ranks");
  }
  int64_t sum = 0;
  for (auto x : b) {
    if (x < 0) throw std::logic_error("balancer '" + cfg_.name + "' returned a negative batch size");
    sum += x;
  }
  if (sum != cfg_.global_batch) {
    throw std::logic_error("balancer '" + cfg_.name + "' returned batch sizes summing to " +
                           std::to_string(sum) + " instead of the global batch " +
                           std::to_string(cfg_.global_batch));
  }
}

std::vector<int64_t> BatchSizeManager::initial() {
  auto b = balancer_->initial();
  check(b);
  queued_.assign(lag_, Decision{b, {}});
  return b;
}

BatchSizeManager::Decision BatchSizeManager::decide_now(const balancer::IterationReport& report) {
  Decision d{balancer_->next(report), balancer_->predicted_speeds()};
  check(d.batch);
  return d;
}

void BatchSizeManager::decide(balancer::IterationReport report) {
  settle_in_flight();  // the balancer decides one iteration after the other
  if (lag_ == 0) {
    queued_.push_back(decide_now(report));
    return;
  }
  in_flight_ = std::async(std::launch::async, [this, r = std::move(report)] { return decide_now(r); });
}

void BatchSizeManager::settle_in_flight() {
  if (in_flight_.valid()) queued_.push_back(in_flight_.get());
}

std::vector<int64_t> BatchSizeManager::next() {
  if (queued_.empty()) settle_in_flight();
  if (queued_.empty()) throw std::logic_error("BatchSizeManager: next() before any decision");
  Decision d = std::move(queued_.front());
  queued_.pop_front();
  predicted_ = std::move(d.predicted);
  return std::move(d.batch);
}

std::vector<int64_t> BatchSizeManager::settle() {
  settle_in_flight();
  std::vector<int64_t> flat;
  for (const auto& d : queued_) flat.insert(flat.end(), d.batch.begin(), d.batch.end());
  return flat;
}

void BatchSizeManager::restore_pending(const std::vector<int64_t>& flat) {
  if (flat.size() != static_cast<size_t>(lag_) * cfg_.workers)
    throw std::invalid_argument("pending decisions hold " + std::to_string(flat.size()) + " sizes, not " +
                                std::to_string(lag_) + " x " + std::to_string(cfg_.workers) +
                                " (lag x ranks)");
  queued_.clear();
  for (int k = 0; k < lag_; ++k) {
    std::vector<int64_t> b(flat.begin() + k * cfg_.workers, flat.begin() + (k + 1) * cfg_.workers);
    check(b);
    queued_.push_back({std::move(b), {}});
  }
}

}  // namespace lbbsp::runtime
