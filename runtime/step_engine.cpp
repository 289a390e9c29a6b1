#include "runtime/step_engine.hpp"

#include <stdexcept>

#include "models/cuda/cuda_models.hpp"  // DeviceResident (plain C++)

namespace lbbsp::runtime {

void check_step_engine_config(const StepEngineConfig& cfg) {
  if (cfg.gpu_params != "device" && cfg.gpu_params != "host")
    throw std::invalid_argument("--gpu-params: unknown value '" + cfg.gpu_params +
                                "' (expected device or host)");
  if (cfg.gpu_allreduce != "auto" && cfg.gpu_allreduce != "staged" && cfg.gpu_allreduce != "cuda-aware")
    throw std::invalid_argument("--gpu-allreduce: unknown value '" + cfg.gpu_allreduce +
                                "' (expected auto, staged or cuda-aware)");
  if (cfg.gpu_params == "host" && cfg.gpu_allreduce == "cuda-aware")
    throw std::invalid_argument(
        "--gpu-allreduce cuda-aware needs the gradient on the GPU: use it with --gpu-params device");
}

StepEngine::StepEngine(const StepEngineConfig& cfg, models::Model& model, std::vector<float>& params,
                       models::Sgd& sgd, size_t extra, Comm& comm)
    : model_(model), params_(params), sgd_(sgd), comm_(comm), P_(model.num_params()) {
  check_step_engine_config(cfg);
  if (cfg.device != "cuda" || cfg.gpu_params == "host") return;  // host mode
  resident_ = cfg.resident;
  if (!resident_)
    throw std::logic_error("StepEngine: --device cuda with --gpu-params device needs a CUDA model");
  if (cfg.gpu_allreduce == "cuda-aware" && !cfg.mpi_cuda_aware)
    throw std::invalid_argument("--gpu-allreduce cuda-aware: this MPI library cannot reduce GPU memory (" +
                                cfg.mpi_cuda_support +
                                "); use --gpu-allreduce staged (or auto), or an MPI built with CUDA support");
  cuda_aware_ = cfg.gpu_allreduce == "cuda-aware" || (cfg.gpu_allreduce == "auto" && cfg.mpi_cuda_aware);
  mode_ = cuda_aware_ ? "device/cuda-aware" : "device/staged";
  resident_->enable_resident(extra, cfg.momentum, cfg.weight_decay);
  push_to_device();
}

models::StepStats StepEngine::forward_backward(const float* x, const uint8_t* y, int n, float* buf) {
  if (!resident_) return model_.forward_backward(params_.data(), x, y, n, buf);
  return resident_->forward_backward_resident(x, y, n);
}

void StepEngine::allreduce(float* buf, size_t len) {
  if (!resident_) return comm_.allreduce_sum(buf, len);
  if (cuda_aware_) {
    // The small tail rides in the device buffer, so one MPI_Allreduce on GPU memory does everything.
    resident_->buffer_from_host(P_, len - P_, buf + P_);
    comm_.allreduce_sum(resident_->reduction_buffer(), len);
    resident_->buffer_to_host(P_, len - P_, buf + P_);
    return;
  }
  resident_->buffer_to_host(0, P_, buf);
  comm_.allreduce_sum(buf, len);
  resident_->buffer_from_host(0, P_, buf);
}

void StepEngine::sgd_step(const float* buf, int64_t global_batch, double lr) {
  if (!resident_) return sgd_.step(params_.data(), buf, global_batch, lr);
  resident_->sgd_step(global_batch, lr);
}

models::StepStats StepEngine::evaluate(const float* x, const uint8_t* y, int n) {
  if (!resident_) return model_.evaluate(params_.data(), x, y, n);
  return resident_->evaluate_resident(x, y, n);
}

void StepEngine::pull_to_host() {
  if (resident_) resident_->store_state(params_.data(), sgd_.velocity().data());
}

void StepEngine::push_to_device() {
  if (resident_) resident_->load_state(params_.data(), sgd_.velocity().data());
}

}  // namespace lbbsp::runtime
