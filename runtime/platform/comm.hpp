// Comm: the only class that talks MPI. Rank 0 coordinates; errors on any rank end the whole job.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lbbsp::runtime {

class NodeWindow;

class Comm {
 public:
  Comm(int* argc, char*** argv);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // The job's nodes (as MPI sees them: MPI_COMM_TYPE_SHARED) and the fewest and most ranks on one of them,
  // the same on every rank.
  int nodes() const { return nodes_; }
  int min_local_size() const { return min_local_size_; }
  int max_local_size() const { return max_local_size_; }
  bool is_root() const { return rank_ == 0; }

  void allreduce_sum(float* buf, size_t n);
  void allreduce_sum(double* buf, size_t n);
  void allreduce_min_max(double* min_inout, double* max_inout);
  std::vector<int64_t> allgather(int64_t value);
  void bcast(int64_t* buf, size_t n, int root = 0);
  void bcast(float* buf, size_t n, int root = 0);
  void bcast(std::string* s, int root = 0);
  void barrier();
  double wtime() const;
  // Whether MPI calls accept CUDA device pointers: Open MPI's MPIX_Query_cuda_support or MPICH's
  // MPIX_GPU_query_support when the library has them, else false. cuda_support() says which and why.
  bool cuda_aware() const;
  std::string cuda_support() const;

  // Collective over all ranks: memory shared by the ranks of each node, `floats` floats per node. nullptr
  // when the MPI library cannot make it on some rank (every rank then gets nullptr), so callers can fall
  // back.
  std::unique_ptr<NodeWindow> node_window(size_t floats);

  // Prints "lbbsp: rank R: error: MESSAGE" once and ends every rank of the job (MPI_Abort). Never returns.
  [[noreturn]] void abort(const std::string& message, int code = 1) const;

 private:
  struct Handles;  // this node's communicator (comm.cpp: this header stays free of mpi.h)
  std::unique_ptr<Handles> mpi_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int nodes_ = 1, min_local_size_ = 1, max_local_size_ = 1;
};

// One node's shared memory (an MPI-3 shared window) and the collectives of a hierarchical reduction over it:
// the ranks of a node sum their buffers in place, and only one sum per node crosses the network.
class NodeWindow {
 public:
  ~NodeWindow();
  NodeWindow(const NodeWindow&) = delete;
  NodeWindow& operator=(const NodeWindow&) = delete;

  float* data() const { return data_; }  // the same memory on every rank of this node
  size_t floats() const { return floats_; }
  int rank() const { return comm_.local_rank(); }  // within the node
  int size() const { return comm_.local_size(); }
  int nodes() const { return comm_.nodes(); }
  // Barrier among this node's ranks; what each wrote to data() before is visible to all after.
  void sync();
  // Sums whole[0, n) over the nodes, each node holding its own sum there. [lo, hi) is this rank's share: when
  // every node has as many ranks, the ranks with the same node rank reduce their shares in parallel; else the
  // first rank of each node reduces it all. Call sync() after, before reading outside [lo, hi).
  void sum_across_nodes(float* whole, size_t n, size_t lo, size_t hi);

 private:
  friend class Comm;
  struct Handles;  // the MPI window and communicators (comm.cpp: this header stays free of mpi.h)
  explicit NodeWindow(const Comm& comm);
  // Every node has as many ranks: the ranks with the same node rank reduce their shares in parallel.
  bool uniform() const { return comm_.min_local_size() == comm_.max_local_size(); }
  const Comm& comm_;  // made the window and outlives it; the node layout is its
  std::unique_ptr<Handles> mpi_;
  float* data_ = nullptr;
  size_t floats_ = 0;
};

// Rank of this process as the launcher sees it, before MPI_Init (mpirun, srun, PMI); 0 when not launched so.
int launcher_rank();

}  // namespace lbbsp::runtime
