#include "runtime/batch_manager.hpp"

#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace lbbsp::runtime {

BatchSizeManager::BatchSizeManager(const balancer::BalancerConfig& cfg, int lag)
    : cfg_(cfg), lag_(lag), balancer_(balancer::make_balancer(cfg)) {}

BatchSizeManager::~BatchSizeManager() {
  if (pending_.valid()) pending_.wait();
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
  return b;
}

std::vector<int64_t> BatchSizeManager::decide(const balancer::IterationReport& report) {
  auto b = balancer_->next(report);
  check(b);
  predicted_ = balancer_->predicted_speeds();
  return b;
}

void BatchSizeManager::decide_async(balancer::IterationReport report) {
  if (pending()) throw std::logic_error("BatchSizeManager: a decision is already in flight");
  pending_ = std::async(std::launch::async, [this, r = std::move(report)] {
    auto b = balancer_->next(r);
    pending_predicted_ = balancer_->predicted_speeds();
    return b;
  });
}

std::vector<int64_t> BatchSizeManager::settle() {
  if (pending_.valid()) {
    ready_ = pending_.get();
    check(ready_);
    predicted_ = pending_predicted_;
  }
  return ready_;
}

void BatchSizeManager::restore_pending(const std::vector<int64_t>& b) {
  check(b);
  ready_ = b;
}

std::vector<int64_t> BatchSizeManager::collect() {
  if (!ready_.empty()) return std::exchange(ready_, {});
  auto b = pending_.get();
  check(b);
  predicted_ = pending_predicted_;
  return b;
}

}  // namespace lbbsp::runtime
