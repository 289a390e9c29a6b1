// One macro per library whose return codes we must check, naming file and line (as llm.c's mpiCheck): HDF5's
// here, MPI's (LBBSP_MPI_CHECK) in runtime/platform/comm.cpp, its only user.
#pragma once
#include <stdexcept>
#include <string>

namespace lbbsp::runtime {
[[noreturn]] void throw_call_failed(const char* lib, const char* call, long code, const char* file, int line);
}

#define LBBSP_H5_CHECK(call)                                                                              \
  do {                                                                                                    \
    long lbbsp_rc_ = static_cast<long>(call);                                                             \
    if (lbbsp_rc_ < 0) ::lbbsp::runtime::throw_call_failed("HDF5", #call, lbbsp_rc_, __FILE__, __LINE__); \
  } while (0)
