#include "runtime/platform/comm.hpp"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <utility>

#include "runtime/io/check.hpp"

#define LBBSP_MPI_CHECK(call)                                                                             \
  do {                                                                                                    \
    int lbbsp_rc_ = (call);                                                                               \
    if (lbbsp_rc_ != 0) ::lbbsp::runtime::throw_call_failed("MPI", #call, lbbsp_rc_, __FILE__, __LINE__); \
  } while (0)

namespace lbbsp::runtime {

struct Comm::Handles {
  MPI_Comm node = MPI_COMM_NULL;  // this node's ranks
};

Comm::Comm(int* argc, char*** argv) : mpi_(std::make_unique<Handles>()) {
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
  LBBSP_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &mpi_->node));
  MPI_Comm_rank(mpi_->node, &local_rank_);
  MPI_Comm_size(mpi_->node, &local_size_);
  // Each node's first rank reports its node's size: the count of nodes and the fewest/most ranks on one.
  std::vector<int> sizes(size_);
  const int mine = local_rank_ == 0 ? local_size_ : 0;
  LBBSP_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD));
  nodes_ = 0;
  min_local_size_ = size_;
  max_local_size_ = 1;
  for (int n : sizes) {
    if (n == 0) continue;
    ++nodes_;
    min_local_size_ = std::min(min_local_size_, n);
    max_local_size_ = std::max(max_local_size_, n);
  }
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (mpi_->node != MPI_COMM_NULL) MPI_Comm_free(&mpi_->node);
  MPI_Finalize();
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

struct NodeWindow::Handles {
  MPI_Win win = MPI_WIN_NULL;
  MPI_Comm node = MPI_COMM_NULL;    // this node's ranks: Comm's, which outlives the window
  MPI_Comm across = MPI_COMM_NULL;  // same node rank on every node (uniform), or the node leaders
};

NodeWindow::NodeWindow(const Comm& comm) : comm_(comm), mpi_(std::make_unique<Handles>()) {}

NodeWindow::~NodeWindow() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Freeing is collective: while an error unwinds one rank the others are not coming, and the job is about to
  // be aborted anyway.
  if (finalized || std::uncaught_exceptions() > 0) return;
  if (mpi_->win != MPI_WIN_NULL) {
    if (floats_ > 0) MPI_Win_unlock_all(mpi_->win);  // locked once made on every rank
    MPI_Win_free(&mpi_->win);
  }
  if (mpi_->across != MPI_COMM_NULL) MPI_Comm_free(&mpi_->across);
}

void NodeWindow::sync() {
  // The unified-memory idiom for shared windows: sync, barrier, sync.
  LBBSP_MPI_CHECK(MPI_Win_sync(mpi_->win));
  LBBSP_MPI_CHECK(MPI_Barrier(mpi_->node));
  LBBSP_MPI_CHECK(MPI_Win_sync(mpi_->win));
}

void NodeWindow::sum_across_nodes(float* whole, size_t n, size_t lo, size_t hi) {
  if (nodes() == 1) return;
  if (uniform()) {
    if (hi > lo)
      LBBSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, whole + lo, static_cast<int>(hi - lo), MPI_FLOAT, MPI_SUM,
                                    mpi_->across));
    return;
  }
  sync();  // every share of the node's sum is in place before the leader sends it all
  if (rank() == 0)
    LBBSP_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, whole, static_cast<int>(n), MPI_FLOAT, MPI_SUM, mpi_->across));
}

std::unique_ptr<NodeWindow> Comm::node_window(size_t floats) {
  std::unique_ptr<NodeWindow> w(new NodeWindow(*this));
  auto& h = *w->mpi_;
  h.node = mpi_->node;
  // The window lives in the node's first rank's segment, so data() is one contiguous array.
  const MPI_Aint bytes = local_rank_ == 0 ? static_cast<MPI_Aint>(floats * sizeof(float)) : 0;
  float* mine = nullptr;
  MPI_Comm_set_errhandler(h.node, MPI_ERRORS_RETURN);
  int ok = MPI_Win_allocate_shared(bytes, sizeof(float), MPI_INFO_NULL, h.node, &mine, &h.win) == MPI_SUCCESS;
  if (ok) {
    MPI_Aint size = 0;
    int unit = 0;
    ok = MPI_Win_shared_query(h.win, 0, &size, &unit, &w->data_) == MPI_SUCCESS &&
         size >= static_cast<MPI_Aint>(floats * sizeof(float));
  }
  LBBSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (!ok) return nullptr;  // the destructor frees what was made
  w->floats_ = floats;
  LBBSP_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, h.win));

  const int color = w->uniform() ? local_rank_ : (local_rank_ == 0 ? 0 : MPI_UNDEFINED);
  LBBSP_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, rank_, &h.across));
  return w;
}

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

}  // namespace lbbsp::runtime
