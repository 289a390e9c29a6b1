// --inject-fault RANK:ITERATION:KIND: one rank fails on purpose at the start of one iteration's compute, to
// test that a failing rank ends the whole job promptly (tests/mpi/test_faults.sh).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/train/hooks.hpp"

namespace lbbsp::runtime {

enum class FaultKind { kNone, kThrow, kAbort, kNan, kHang };

struct Fault {
  int rank = -1;
  int64_t iteration = -1;
  FaultKind kind = FaultKind::kNone;
};

// "" -> no fault. Throws std::invalid_argument in the common/spec.hpp style ("--inject-fault: WHY (in
// 'SPEC'; valid: ...)") for a bad spec or a rank outside 0..ranks-1.
Fault parse_fault(const std::string& spec, int ranks);

// throw: an exception; abort: std::abort(); hang: sleeps forever (the watchdog ends the job); nan: a NaN
// loss. nullptr when the fault is not this rank's.
std::unique_ptr<TrainHook> make_fault_hook(const Fault& fault, int rank, Watchdog& watchdog);

}  // namespace lbbsp::runtime
