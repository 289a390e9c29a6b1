#include "predictors/fleet.hpp"

#include <omp.h>

#include <exception>
#include <vector>

namespace lbbsp::predictors {

void for_each_worker(size_t n, const std::function<void(size_t)>& body, int threads) {
  if (n < kParallelWorkers || threads == 1) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  const auto count = static_cast<std::ptrdiff_t>(n);
  std::vector<std::exception_ptr> errors(n);  // per worker, so the lowest index wins whatever the schedule
  bool failed = false;
  if (threads <= 0) threads = omp_get_max_threads();
#pragma omp parallel for schedule(static) reduction(|| : failed) num_threads(threads)
  for (std::ptrdiff_t i = 0; i < count; ++i) {
    try {
      body(static_cast<size_t>(i));
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
      failed = true;
    }
  }
  if (failed)
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
}

}  // namespace lbbsp::predictors
