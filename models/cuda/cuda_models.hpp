// Public API of the CUDA backend (lbbsp_cuda). Plain C++: no CUDA headers, so the runtime and make_model can
// include it. Every function throws std::runtime_error naming file:line when a CUDA or cuBLAS call fails.
#pragma once
#include <cstddef>
#include <memory>

#include "models/model.hpp"

namespace lbbsp::models {

// Number of visible CUDA devices; 0 (never an exception) when there is no driver, no device, or
// CUDA_VISIBLE_DEVICES hides them all.
int cuda_device_count();

// Makes device (local_rank % device count) current for this thread and returns it. Call it before
// make_model: a CUDA model stays on the device that was current when it was made. Throws when no device is
// visible.
int select_cuda_device(int local_rank);

// Free memory of the current device, in bytes.
size_t cuda_free_bytes();

// Device memory that one more sample in a forward_backward batch costs (input, activations, pooling indices,
// activation gradients, label and loss slots), in bytes. The model also holds a fixed part: parameters,
// gradient, and at most kCudaConvWorkspaceBytes of im2col workspace for the CNN. Memory cap in samples:
// cuda_free_bytes() * 0.8 / per_sample_bytes(cfg).
size_t per_sample_bytes(const ModelConfig& cfg);
constexpr size_t kCudaConvWorkspaceBytes = size_t(128) << 20;

// The GPU twin of host_model (made by make_model with device "cpu" from the same cfg): same name, tensors,
// initialisation and FLOP count, taken from host_model; forward_backward and evaluate run on the current
// device. All pointers in the Model interface stay HOST pointers: parameters and inputs are copied in on each
// call, and the gradient sum is copied back and ADDED into the host grad.
std::unique_ptr<Model> make_cuda_model(const ModelConfig& cfg, std::unique_ptr<Model> host_model);

// Device-resident training, the other face of every CUDA model: parameters, SGD velocity and one reduction
// buffer [gradient sums (num_params) | `extra` floats the caller fills] stay on the GPU, so a step copies in
// only its samples, and the buffer can go straight to a CUDA-aware MPI_Allreduce (or be staged through the
// host with two copies). Do not mix with the host-pointer calls of Model: those overwrite the device
// parameters.
class DeviceResident {
 public:
  virtual ~DeviceResident() = default;
  // Allocates velocity and the reduction buffer; velocity starts at zero. Call once, before the rest.
  virtual void enable_resident(size_t extra, double momentum, double weight_decay) = 0;
  // Host -> device (velocity may be null: zero); device -> host (either pointer may be null). Synchronous.
  virtual void load_state(const float* params, const float* velocity) = 0;
  virtual void store_state(float* params, float* velocity) = 0;
  // WRITES the gradient sum of the n samples into the buffer's first num_params floats (zero when n is 0);
  // the extra floats are left as they are.
  virtual StepStats forward_backward_resident(const float* x, const uint8_t* y, int n) = 0;
  // Forward only, with the device parameters.
  virtual StepStats evaluate_resident(const float* x, const uint8_t* y, int n) = 0;
  // The reduction buffer (a DEVICE pointer) and synchronous copies of its floats [offset, offset + count).
  virtual float* reduction_buffer() = 0;
  virtual void buffer_to_host(size_t offset, size_t count, float* host) = 0;
  virtual void buffer_from_host(size_t offset, size_t count, const float* host) = 0;
  // models::Sgd::step on the device with the buffer's first num_params floats as the gradient sum over
  // global_batch samples.
  virtual void sgd_step(int64_t global_batch, double lr) = 0;
};

// The device-resident face of a model made for device "cuda"; nullptr for any other model.
DeviceResident* device_resident(Model& model);

}  // namespace lbbsp::models
