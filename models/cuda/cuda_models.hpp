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

}  // namespace lbbsp::models
