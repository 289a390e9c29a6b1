// The lbbsp core: everything a trainer needs to balance per-worker batch sizes (no MPI, no I/O).
//
//   lbbsp::balancer::make_balancer(BalancerConfig) -> Balancer: initial(), next(IterationReport),
//   save_state() lbbsp::balancer::assign_by_speed / assign_by_curve / check_batch: the exact integer
//   assignment and its check lbbsp::balancer::epoch_permutation / rank_indices / slice_offset: the global
//   batch and each worker's slice lbbsp::predictors::make_predictor(spec, num_exo, seed) -> Predictor:
//   observe(), predict()
//
// Installed with `cmake --install`; a consumer writes find_package(lbbsp CONFIG REQUIRED) and
// target_link_libraries(app PRIVATE lbbsp::core). See examples/consumer/.
#pragma once

#include "balancer/assign.hpp"
#include "balancer/balancer.hpp"
#include "balancer/sampling.hpp"
#include "lbbsp/version.hpp"
#include "predictors/predictor.hpp"
