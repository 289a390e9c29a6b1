// Comm: the only class that talks MPI. Rank 0 coordinates; errors on any rank end the whole job.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lbbsp::runtime {

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

  // Prints "lbbsp: rank R: error: MESSAGE" once and ends every rank of the job (MPI_Abort). Never returns.
  [[noreturn]] void abort(const std::string& message, int code = 1) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

// Rank of this process as the launcher sees it, before MPI_Init (mpirun, srun, PMI); 0 when not launched so.
int launcher_rank();

}  // namespace lbbsp::runtime
