#include "runtime/comm.hpp"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "runtime/check.hpp"

namespace lbbsp::runtime {

Comm::Comm(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    LBBSP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  }
  // Errors come back as codes that LBBSP_MPI_CHECK turns into exceptions, then into abort() with the rank.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  LBBSP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void Comm::allreduce_sum(float* buf, size_t n) {
  LBBSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
}
void Comm::allreduce_sum(double* buf, size_t n) {
  LBBSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
}
void Comm::allreduce_min_max(double* mn, double* mx) {
  LBBSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mn, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
  LBBSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
}
std::vector<int64_t> Comm::allgather(int64_t value) {
  std::vector<int64_t> all(size_);
  LBBSP_MPI_CHECK(MPI_Allgather(&value, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD));
  return all;
}
void Comm::bcast(int64_t* buf, size_t n, int root) {
  LBBSP_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(n), MPI_INT64_T, root, MPI_COMM_WORLD));
}
void Comm::bcast(float* buf, size_t n, int root) {
  LBBSP_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(n), MPI_FLOAT, root, MPI_COMM_WORLD));
}
void Comm::bcast(std::string* s, int root) {
  int64_t n = static_cast<int64_t>(s->size());
  bcast(&n, 1, root);
  s->resize(n);
  LBBSP_MPI_CHECK(MPI_Bcast(s->data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD));
}
void Comm::barrier() {
  LBBSP_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}
double Comm::wtime() const {
  return MPI_Wtime();
}

namespace {
// Whether MPI calls accept CUDA device pointers, and the library's own words for it.
std::pair<bool, std::string> query_cuda_support() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  const bool on = MPIX_Query_cuda_support() == 1;
  return {on, on ? "Open MPI built with CUDA support, enabled at run time"
                 : "Open MPI built with CUDA support, but disabled at run time"};
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return {false, "this Open MPI was built without CUDA support"};
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported);
  return {supported != 0, supported ? "MPICH with CUDA support" : "this MPICH has no CUDA support enabled"};
#else
  return {false, "this MPI library does not say whether it supports CUDA memory"};
#endif
}
}  // namespace

bool Comm::cuda_aware() const {
  return query_cuda_support().first;
}
std::string Comm::cuda_support() const {
  return query_cuda_support().second;
}

void Comm::abort(const std::string& message, int code) const {
  std::fprintf(stderr, "lbbsp: rank %d: error: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  if (size_ == 1) std::_Exit(code);  // nothing to tear down: spare the user Open MPI's abort banner
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

}  // namespace lbbsp::runtime
