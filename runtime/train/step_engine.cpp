#include "runtime/train/step_engine.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "models/cuda/cuda_models.hpp"  // DeviceResident (plain C++)

namespace lbbsp::runtime {

void check_float_exact(int64_t value, const std::string& flag) {
  if (value <= kMaxExactFloatCount) return;
  throw std::invalid_argument(flag + " " + std::to_string(value) + " is above " +
                              std::to_string(kMaxExactFloatCount) +
                              " (2^24): per-iteration counts and batch sizes travel in the float reduction "
                              "buffer, which holds integers exactly only up to 2^24; use a smaller value");
}

void check_step_engine_config(const StepEngineConfig& cfg) {
  if (cfg.device == Device::kCuda && cfg.gpu_params == GpuParams::kDevice &&
      cfg.host_allreduce == HostAllreduce::kNode)
    throw std::invalid_argument(
        "--allreduce node keeps the parameters in host memory shared by a node's ranks; with --device cuda "
        "add --gpu-params host, or leave --allreduce at auto");
  if (cfg.gpu_params == GpuParams::kHost && cfg.gpu_allreduce == GpuAllreduce::kCudaAware)
    throw std::invalid_argument(
        "--gpu-allreduce cuda-aware needs the gradient on the GPU: use it with --gpu-params device");
}

StepEngine::StepEngine(const StepEngineConfig& cfg, models::Model& model, std::vector<float>& params,
                       models::Sgd& sgd, size_t extra, Comm& comm)
    : model_(model), params_(params), sgd_(sgd), comm_(comm), P_(model.num_params()), extra_(extra) {
  check_step_engine_config(cfg);
  if (cfg.device != Device::kCuda || cfg.gpu_params == GpuParams::kHost) {
    start_host(cfg);
    return;
  }
  resident_ = cfg.resident;
  if (!resident_)
    throw std::logic_error("StepEngine: --device cuda with --gpu-params device needs a CUDA model");
  if (cfg.gpu_allreduce == GpuAllreduce::kCudaAware && !cfg.mpi_cuda_aware)
    throw std::invalid_argument("--gpu-allreduce cuda-aware: this MPI library cannot reduce GPU memory (" +
                                cfg.mpi_cuda_support +
                                "); use --gpu-allreduce staged (or auto), or an MPI built with CUDA support");
  cuda_aware_ = cfg.gpu_allreduce == GpuAllreduce::kCudaAware ||
                (cfg.gpu_allreduce == GpuAllreduce::kAuto && cfg.mpi_cuda_aware);
  mode_ = cuda_aware_ ? "device/cuda-aware" : "device/staged";
  resident_->enable_resident(extra, cfg.momentum, cfg.weight_decay);
  push_to_device();
}

namespace {
constexpr size_t kLine = 16;  // floats per cache line: shares and buffers start on one
size_t round_up(size_t n) {
  return (n + kLine - 1) / kLine * kLine;
}
}  // namespace

void StepEngine::start_host(const StepEngineConfig& cfg) {
  bool node = cfg.host_allreduce == HostAllreduce::kNode;
  if (cfg.host_allreduce == HostAllreduce::kAuto && cfg.device == Device::kCpu)
    node = comm_.max_local_size() > 1;  // same on every rank
  if (!node) return;
  stride_ = round_up(P_ + extra_);
  const int ranks = comm_.local_size();
  const size_t floats = stride_ * (ranks + 1) + 2 * round_up(P_) + round_up(2 * ranks);
  node_ = comm_.node_window(floats);
  if (!node_) {
    if (cfg.host_allreduce == HostAllreduce::kNode)
      throw std::runtime_error(
          "--allreduce node: MPI could not allocate memory shared by this node's ranks (" +
          std::to_string(floats * sizeof(float)) +
          " bytes; check the space in /dev/shm); use --allreduce mpi");
    if (comm_.is_root())
      std::fprintf(stderr, "lbbsp: warning: no shared memory for --allreduce node; using MPI_Allreduce\n");
    return;
  }
  mode_ = "host/node-shared";
  push_to_device();
}

float* StepEngine::shared_sum() const {
  return node_->data() + stride_ * node_->size();
}
float* StepEngine::shared_params() const {
  return shared_sum() + stride_;
}
float* StepEngine::shared_velocity() const {
  return shared_params() + round_up(P_);
}
int64_t* StepEngine::arrivals() const {
  return reinterpret_cast<int64_t*>(shared_velocity() + round_up(P_));  // 64-byte aligned
}

void StepEngine::share_of(size_t len, size_t* lo, size_t* hi) const {
  const size_t lines = (len + kLine - 1) / kLine, r = node_->rank(), R = node_->size();
  *lo = std::min(len, lines * r / R * kLine);
  *hi = std::min(len, lines * (r + 1) / R * kLine);
}

models::StepStats StepEngine::forward_backward(const float* x, const uint8_t* y, int n, float* buf) {
  if (node_) return model_.forward_backward(shared_params(), x, y, n, buf);
  if (!resident_) return model_.forward_backward(params_.data(), x, y, n, buf);
  return resident_->forward_backward_resident(x, y, n);
}

void StepEngine::allreduce(float* buf, size_t len) {
  if (node_) return allreduce_node(buf, len);
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

void StepEngine::allreduce_node(float* buf, size_t len) {
  if (len > stride_) throw std::logic_error("StepEngine::allreduce: buffer longer than at construction");
  const int R = node_->size();
  std::copy(buf, buf + len, node_->data() + stride_ * node_->rank());
  node_->sync();
  // My share of the node's sum, ranks added in order: the same bits whatever the timing.
  share_of(len, &lo_, &hi_);
  float* sum = shared_sum();
  const float* first = node_->data();
  std::copy(first + lo_, first + hi_, sum + lo_);
  for (int r = 1; r < R; ++r) {
    const float* other = node_->data() + stride_ * r;
    for (size_t i = lo_; i < hi_; ++i) sum[i] += other[i];
  }
  node_->sum_across_nodes(sum, len, lo_, hi_);
  node_->sync();
  std::copy(sum + P_, sum + len, buf + P_);  // the extra floats; the gradient stays in the window
}

void StepEngine::sgd_step(const float* buf, int64_t global_batch, double lr) {
  if (node_) {
    // Each rank updates its share of the one shared copy; after the barrier all ranks read the new one.
    const size_t lo = std::min(lo_, P_), hi = std::min(hi_, P_);
    sgd_.step_range(shared_params() + lo, shared_velocity() + lo, shared_sum() + lo, hi - lo, global_batch,
                    lr);
    using Clock = std::chrono::steady_clock;
    int64_t* arrived = arrivals();
    arrived[node_->rank()] = Clock::now().time_since_epoch().count();
    node_->sync();
    released_at_ = Clock::time_point(Clock::duration(*std::max_element(arrived, arrived + node_->size())));
    return;
  }
  if (!resident_) return sgd_.step(params_.data(), buf, global_batch, lr);
  resident_->sgd_step(global_batch, lr);
}

models::StepStats StepEngine::evaluate(const float* x, const uint8_t* y, int n) {
  if (node_) {
    released_at_.reset();  // the ranks no longer start the next step together
    return model_.evaluate(shared_params(), x, y, n);
  }
  if (!resident_) return model_.evaluate(params_.data(), x, y, n);
  return resident_->evaluate_resident(x, y, n);
}

void StepEngine::pull_to_host() {
  if (node_) {
    released_at_.reset();  // this rank starts the next step late (a checkpoint is being written)
    std::copy(shared_params(), shared_params() + P_, params_.begin());
    std::copy(shared_velocity(), shared_velocity() + P_, sgd_.velocity().begin());
    return;
  }
  if (resident_) resident_->store_state(params_.data(), sgd_.velocity().data());
}

void StepEngine::push_to_device() {
  if (node_) {
    // Every rank holds the same mirrors; each copies its share, and the barrier publishes them.
    size_t lo = 0, hi = 0;
    share_of(P_, &lo, &hi);
    std::copy(params_.begin() + lo, params_.begin() + hi, shared_params() + lo);
    std::copy(sgd_.velocity().begin() + lo, sgd_.velocity().begin() + hi, shared_velocity() + lo);
    node_->sync();
    return;
  }
  if (resident_) resident_->load_state(params_.data(), sgd_.velocity().data());
}

}  // namespace lbbsp::runtime
