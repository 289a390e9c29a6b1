// StepEngine: where a rank's parameters live and how one step's reduction buffer travels. The trainer's
// buffer is [gradient sums P | E floats of loss, per-rank slots and batch sizes]; the engine fills the
// gradient part, reduces the whole buffer over all ranks, and applies SGD, in one of three modes:
//   host                 parameters and SGD on the host (CPU models; or a CUDA model that copies parameters
//   in
//                        and the gradient out on every step: --gpu-params host)
//   device/staged        parameters, velocity and gradient stay on the GPU; only the gradient crosses to the
//                        host for a plain MPI_Allreduce and back (2 copies of P floats per step)
//   device/cuda-aware    the same, and MPI_Allreduce reduces the device buffer itself (MPI built with CUDA)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "models/optimizer.hpp"
#include "runtime/comm.hpp"

namespace lbbsp::models {
class DeviceResident;
}

namespace lbbsp::runtime {

struct StepEngineConfig {
  std::string device = "cpu";          // cpu | cuda
  std::string gpu_params = "device";   // device | host (cuda only)
  std::string gpu_allreduce = "auto";  // auto | staged | cuda-aware (cuda with gpu_params device only)
  double momentum = 0.9, weight_decay = 0.0;
  // The model's device-resident face (models::device_resident; nullptr for CPU models) and what the MPI
  // library says about GPU memory (Comm::cuda_aware / cuda_support). Given, not looked up, so tests can
  // drive every mode with a host-memory stand-in.
  models::DeviceResident* resident = nullptr;
  bool mpi_cuda_aware = false;
  std::string mpi_cuda_support;
};

// Throws std::invalid_argument naming --gpu-params / --gpu-allreduce and the values they take.
void check_step_engine_config(const StepEngineConfig& cfg);

class StepEngine {
 public:
  // params (host mirror) and sgd belong to the trainer and outlive the engine; extra = E above.
  StepEngine(const StepEngineConfig& cfg, models::Model& model, std::vector<float>& params, models::Sgd& sgd,
             size_t extra, Comm& comm);
  // "host", "device/staged" or "device/cuda-aware".
  const std::string& mode() const { return mode_; }
  // Gradient sums of this rank's n samples into buf[0, P) (buf zeroed by the caller).
  models::StepStats forward_backward(const float* x, const uint8_t* y, int n, float* buf);
  // Sums buf (P + E floats) over all ranks; afterwards the host buf's E floats hold the sums.
  void allreduce(float* buf, size_t len);
  // SGD with the reduced gradient sums (host buf in host mode, the device buffer otherwise).
  void sgd_step(const float* buf, int64_t global_batch, double lr);
  models::StepStats evaluate(const float* x, const uint8_t* y, int n);
  // Device -> host mirrors (params and sgd velocity), for checkpoints, checksums and saving; host -> device
  // after the mirrors changed (resume). No-ops in host mode.
  void pull_to_host();
  void push_to_device();

 private:
  models::Model& model_;
  std::vector<float>& params_;
  models::Sgd& sgd_;
  Comm& comm_;
  models::DeviceResident* resident_ = nullptr;
  bool cuda_aware_ = false;
  size_t P_ = 0;
  std::string mode_ = "host";
};

}  // namespace lbbsp::runtime
