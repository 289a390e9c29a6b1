// StepEngine: where a rank's parameters live and how one step's reduction buffer travels. The trainer's
// buffer is [gradient sums P | E floats of loss, per-rank slots and batch sizes]; the engine fills the
// gradient part, reduces the whole buffer over all ranks, and applies SGD, in one of four modes:
//   host                 parameters and SGD on the host (CPU models; or a CUDA model that copies parameters
//                        in and the gradient out on every step: --gpu-params host); plain MPI_Allreduce
//   host/node-shared     CPU models, several ranks per node (--allreduce node): the ranks of a node keep one
//                        copy of the parameters and velocity in shared memory, sum their buffers there (each
//                        rank a share, in rank order), reduce one sum per node over MPI, and each rank
//                        applies SGD to its share: per node one SGD instead of one per rank, and a fraction
//                        of the memory traffic of MPI_Allreduce between processes; released_at() says when
//                        the node's ranks all left the step (straggler emulation starts modelled compute
//                        there)
//   device/staged        parameters, velocity and gradient stay on the GPU; only the gradient crosses to the
//                        host for a plain MPI_Allreduce and back (2 copies of P floats per step)
//   device/cuda-aware    the same, and MPI_Allreduce reduces the device buffer itself (MPI built with CUDA)
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "models/optimizer.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/train/run_options.hpp"

namespace lbbsp::models {
class DeviceResident;
}

namespace lbbsp::runtime {

struct StepEngineConfig {
  Device device = Device::kCpu;
  GpuParams gpu_params = GpuParams::kDevice;         // cuda only
  GpuAllreduce gpu_allreduce = GpuAllreduce::kAuto;  // cuda with GpuParams::kDevice only
  // Host parameters: auto (node on a CPU run with several ranks on some node) | mpi | node.
  HostAllreduce host_allreduce = HostAllreduce::kAuto;
  double momentum = 0.9, weight_decay = 0.0;
  // The model's device-resident face (models::device_resident; nullptr for CPU models) and what the MPI
  // library says about GPU memory (Comm::cuda_aware / cuda_support). Given, not looked up, so tests can
  // drive every mode with a host-memory stand-in.
  models::DeviceResident* resident = nullptr;
  bool mpi_cuda_aware = false;
  std::string mpi_cuda_support;
};

// The E floats carry counts (correct predictions, lag-1 batch sizes) as well as timings. A float holds every
// integer up to 2^24 exactly, and so does each partial sum of counts that add up to at most that, in any
// order.
constexpr int64_t kMaxExactFloatCount = int64_t{1} << 24;
// Throws std::invalid_argument naming `flag` when value is above kMaxExactFloatCount.
void check_float_exact(int64_t value, const std::string& flag);

// Throws std::invalid_argument for combinations that cannot work, naming the flags and the fix.
void check_step_engine_config(const StepEngineConfig& cfg);

class StepEngine {
 public:
  // params (host mirror) and sgd belong to the trainer and outlive the engine; extra = E above.
  StepEngine(const StepEngineConfig& cfg, models::Model& model, std::vector<float>& params, models::Sgd& sgd,
             size_t extra, Comm& comm);
  // "host", "host/node-shared", "device/staged" or "device/cuda-aware". Collective (all ranks construct it).
  const std::string& mode() const { return mode_; }
  // Gradient sums of this rank's n samples into buf[0, P) (buf zeroed by the caller).
  models::StepStats forward_backward(const float* x, const uint8_t* y, int n, float* buf);
  // Sums buf (P + E floats) over all ranks; afterwards the host buf's E floats hold the sums.
  void allreduce(float* buf, size_t len);
  // SGD with the reduced gradient sums (host buf in host mode, the device buffer otherwise).
  void sgd_step(const float* buf, int64_t global_batch, double lr);
  models::StepStats evaluate(const float* x, const uint8_t* y, int n);
  // Device -> host mirrors (params and sgd velocity), for checkpoints, checksums and saving; host -> device
  // after the mirrors changed (resume). No-ops in host mode; push is collective in host/node-shared mode.
  void pull_to_host();
  void push_to_device();
  // host/node-shared: when the last rank of this node reached the barrier that ended the last sgd_step, i.e.
  // when this node's ranks were all free to start the next step (steady_clock, shared by a node's processes).
  // nullopt before the first step, after evaluate() or pull_to_host() (the ranks no longer start together),
  // and in the other modes.
  std::optional<std::chrono::steady_clock::time_point> released_at() const { return released_at_; }

 private:
  models::Model& model_;
  std::vector<float>& params_;
  models::Sgd& sgd_;
  Comm& comm_;
  models::DeviceResident* resident_ = nullptr;
  std::unique_ptr<NodeWindow> node_;  // host/node-shared: [rank buffers | sum | params | velocity]
  size_t stride_ = 0;                 // floats per rank buffer in the window (cache-line multiple)
  size_t lo_ = 0, hi_ = 0;            // this rank's share of the last reduction
  std::optional<std::chrono::steady_clock::time_point> released_at_;
  void start_host(const StepEngineConfig& cfg);
  void allreduce_node(float* buf, size_t len);
  float* shared_params() const;
  float* shared_velocity() const;
  float* shared_sum() const;
  int64_t* arrivals() const;  // per node rank: steady_clock ticks at the last sgd_step's barrier
  void share_of(size_t len, size_t* lo, size_t* hi) const;
  bool cuda_aware_ = false;
  size_t P_ = 0, extra_ = 0;
  std::string mode_ = "host";
};

}  // namespace lbbsp::runtime
