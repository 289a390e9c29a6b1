// Running one update per worker over a whole fleet of predictor states.
#pragma once
#include <cstddef>
#include <functional>

namespace lbbsp::predictors {

// Calls body(i) once for every i in [0, n). With n >= kParallelWorkers the calls are spread over `threads`
// OpenMP threads (0: omp_get_max_threads(), i.e. 1 inside a training rank unless --threads says more), in
// static contiguous chunks; otherwise they run in order on the calling thread. body(i) must touch only
// worker i's data, so the results are identical for any thread count. An exception from body ends the call
// with the exception of the lowest such i (in parallel, after the other bodies have run).
inline constexpr size_t kParallelWorkers = 512;
void for_each_worker(size_t n, const std::function<void(size_t)>& body, int threads = 0);

}  // namespace lbbsp::predictors
