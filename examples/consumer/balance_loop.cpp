// A trainer's balancing loop of its own, over the installed lbbsp core: four simulated workers (one slowed to
// a quarter of the others' speed halfway through) report their compute time every iteration, lbbsp-cpu
// re-sizes their shares, and each worker's slice of the global batch is cut from the seeded epoch
// permutation. Exits 0 when every check holds, else prints what failed and exits 1.
#include <lbbsp/core.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace lb = lbbsp::balancer;

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

// Worker speeds (samples/s) at an iteration: worker 3 slows down to a quarter from iteration 30 on.
std::vector<double> speeds_at(int iteration) {
  return {1000.0, 1000.0, 1000.0, iteration < 30 ? 1000.0 : 250.0};
}

// Worker slices of one step: together they must be the step's global batch, in order.
void check_slices(const std::vector<int64_t>& perm, int64_t step, const std::vector<int64_t>& batch,
                  int64_t X) {
  std::vector<int64_t> joined;
  for (int r = 0; r < static_cast<int>(batch.size()); ++r) {
    const auto mine = lb::rank_indices(perm, step, batch, r);
    joined.insert(joined.end(), mine.begin(), mine.end());
  }
  expect(joined == std::vector<int64_t>(perm.begin() + step * X, perm.begin() + (step + 1) * X),
         "the workers' slices are the step's global batch");
}

}  // namespace

int main() {
  const int workers = 4;
  const int64_t X = 256, n_samples = 60000;
  lb::BalancerConfig cfg;
  cfg.name = "lbbsp-cpu";
  cfg.predictor = "ema";
  cfg.workers = workers;
  cfg.global_batch = X;
  auto balancer = lb::make_balancer(cfg);

  const auto perm = lb::epoch_permutation(n_samples, /*seed=*/1, /*epoch=*/0);
  std::vector<int64_t> batch = balancer->initial();
  lb::IterationReport report;
  report.workers.resize(workers);
  for (int it = 0; it < 60; ++it) {
    lb::check_batch(batch, X, {}, workers);  // throws if the balancer broke its contract
    check_slices(perm, it, batch, X);
    const auto speed = speeds_at(it);
    report.iteration = it;
    for (int w = 0; w < workers; ++w)
      report.workers[w] = {.batch = batch[w], .compute_s = static_cast<double>(batch[w]) / speed[w]};
    batch = balancer->next(report);
  }
  std::printf("lbbsp %s: final batch vector %lld %lld %lld %lld\n", LBBSP_VERSION_STRING,
              static_cast<long long>(batch[0]), static_cast<long long>(batch[1]),
              static_cast<long long>(batch[2]), static_cast<long long>(batch[3]));
  // Speeds 4:4:4:1 -> shares 256 * 4/13 = 78.8 and 19.7: the slow worker gets about a quarter of the others'.
  expect(batch[3] >= 18 && batch[3] <= 21, "the slowed worker gets about 20 samples");
  expect(batch[0] >= 77 && batch[0] <= 80, "a fast worker gets about 79 samples");
  const auto predicted = balancer->predicted_speeds();
  expect(predicted.size() == workers && predicted[3] < 0.3 * predicted[0],
         "predicted speeds see the straggler");
  auto predictor = lbbsp::predictors::make_predictor("narx", 1, 7);
  for (int t = 0; t < 50; ++t) predictor->observe(500.0, {1.0});
  expect(predictor->predict({1.0}) > 400.0 && predictor->predict({1.0}) < 600.0,
         "narx predicts a steady speed");
  if (failures == 0) std::printf("consumer checks passed\n");
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
