// `lbbsp info`: build configuration, topology and (under mpirun) each rank's binding.
#include <cstdio>
#include <cstdlib>

#include "models/cuda/cuda_models.hpp"
#include "models/gemm.hpp"
#include "models/model.hpp"
#include "models/simd.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/platform/topology.hpp"

namespace lbbsp::cli {

void add_info_command(CLI::App& app) {
  auto* info = app.add_subcommand("info", "Print build configuration, hardware topology and rank bindings");
  info->callback([] {
    int argc = 0;
    char** argv = nullptr;
    runtime::Comm comm(&argc, &argv);
    std::string line = "rank " + std::to_string(comm.rank()) + "/" + std::to_string(comm.size()) +
                       " (local " + std::to_string(comm.local_rank()) + "): bound to " +
                       runtime::current_binding();
    if (comm.is_root()) {
      std::printf("lbbsp %s\n", LBBSP_VERSION);
#ifdef LBBSP_WITH_CUDA
      std::printf("cuda backend: built, %d GPU(s) visible\n", models::cuda_device_count());
#else
      std::printf("cuda backend: not built\n");
#endif
      std::printf("mpi and GPU memory: %s\n", comm.cuda_support().c_str());
      std::printf("topology: %s\n", runtime::describe_topology().c_str());
      std::printf("kernel threads: %d, vector kernels: %s (docs/threads.md)\n", models::num_threads(),
                  models::simd::kName);
      const char* spin = std::getenv("GOMP_SPINCOUNT");
      std::printf("blas kernels: OpenBLAS %s; idle OpenMP threads: %s\n", models::blas_core(),
                  spin ? ("spin " + std::string(spin) + " times, then sleep").c_str()
                  : std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY")
                                                   : "libgomp default");
      std::printf("nodes: %d, ranks per node %d-%d\n", comm.nodes(), comm.min_local_size(),
                  comm.max_local_size());
    }
    // Print in rank order.
    for (int r = 0; r < comm.size(); ++r) {
      if (r == comm.rank()) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
      comm.barrier();
    }
  });
}

}  // namespace lbbsp::cli
