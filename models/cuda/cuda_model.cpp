// CudaModel: models::Model on a GPU with HOST pointers in the interface, so the trainer and the host-staged
// MPI allreduce work unchanged. Each call copies parameters, inputs and labels in, runs our kernels and
// cuBLAS on the model's own stream, and copies the gradient sum back to ADD it into the host grad. Its
// DeviceResident face keeps parameters, velocity and the gradient on the device instead (cuda_models.hpp).
// The layer structure is read from the CPU model's tensors(), so both share one parameter layout by
// construction.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "models/cuda/cuda_check.hpp"
#include "models/cuda/cuda_models.hpp"
#include "models/cuda/kernels.hpp"

namespace lbbsp::models {

namespace cuda {

namespace {

// A device allocation that grows to the largest size asked for and never shrinks.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);  // no throwing from a destructor
  }
  T* ensure(size_t count) {
    if (count > capacity_) {
      if (ptr_) LBBSP_CUDA_CHECK(cudaFree(ptr_));
      ptr_ = nullptr, capacity_ = 0;
      LBBSP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(count, 1) * sizeof(T)));
      capacity_ = count;
    }
    return ptr_;
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t capacity_ = 0;
};

// Same message as the CPU check_labels (models/softmax_xent.cpp), which lbbsp_cuda cannot link.
void check_labels(const uint8_t* labels, int n, int classes) {
  for (int i = 0; i < n; ++i)
    if (labels[i] >= classes)
      throw std::out_of_range("label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) +
                              " is out of range for " + std::to_string(classes) + " classes");
}

// Evaluation walks the samples in chunks of this many, so a whole test set does not grow the activations.
constexpr int kEvalChunk = 1024;

// Owns the host model (layout, init, FLOPs), the stream, the cuBLAS handle and the buffers every model needs;
// subclasses provide the forward pass (to logits) and the backward pass (from dlogits).
class CudaModel : public Model, public DeviceResident {
 public:
  CudaModel(std::unique_ptr<Model> host, int classes) : host_(std::move(host)), classes_(classes) {
    LBBSP_CUDA_CHECK(cudaGetDevice(&device_));
    LBBSP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LBBSP_CUBLAS_CHECK(cublasCreate(&cublas_));
    LBBSP_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // Plain FP32 (the default, stated here on purpose): TF32 tensor cores would round inputs to 10 mantissa
    // bits and break the agreement with the CPU.
    LBBSP_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    params_.ensure(host_->num_params());
    grad_.ensure(host_->num_params());
    totals_.ensure(1);
    host_grad_.resize(host_->num_params());
  }
  ~CudaModel() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return host_->name(); }
  size_t num_params() const override { return host_->num_params(); }
  std::vector<TensorInfo> tensors() const override { return host_->tensors(); }
  void init_params(float* params, uint64_t seed) const override { host_->init_params(params, seed); }
  double flops_per_sample() const override { return host_->flops_per_sample(); }

  StepStats forward_backward(const float* params, const float* x, const uint8_t* y, int n,
                             float* grad) override {
    check_labels(y, n, classes_);
    if (n == 0) return {};
    LBBSP_CUDA_CHECK(cudaSetDevice(device_));
    upload_params(params);
    run_forward_backward(x, y, n);
    LBBSP_CUDA_CHECK(cudaMemcpyAsync(host_grad_.data(), grad_.get(), num_params() * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
    const StepStats stats = download_totals();  // synchronises the stream
    for (size_t i = 0; i < host_grad_.size(); ++i) grad[i] += host_grad_[i];
    return stats;
  }

  StepStats evaluate(const float* params, const float* x, const uint8_t* y, int n) override {
    check_labels(y, n, classes_);
    if (n == 0) return {};
    LBBSP_CUDA_CHECK(cudaSetDevice(device_));
    upload_params(params);
    return run_evaluate(x, y, n);
  }

  // ---- DeviceResident ----
  void enable_resident(size_t extra, double momentum, double weight_decay) override {
    if (momentum < 0.0 || momentum >= 1.0)
      throw std::invalid_argument("enable_resident: momentum must be in [0, 1), got " +
                                  std::to_string(momentum));
    if (weight_decay < 0.0)
      throw std::invalid_argument("enable_resident: weight decay must not be negative, got " +
                                  std::to_string(weight_decay));
    LBBSP_CUDA_CHECK(cudaSetDevice(device_));
    momentum_ = momentum, weight_decay_ = weight_decay, buffer_len_ = num_params() + extra;
    grad_.ensure(buffer_len_);
    LBBSP_CUDA_CHECK(cudaMemsetAsync(grad_.get(), 0, buffer_len_ * sizeof(float), stream_));
    LBBSP_CUDA_CHECK(
        cudaMemsetAsync(velocity_.ensure(num_params()), 0, num_params() * sizeof(float), stream_));
    LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    resident_ = true;
  }
  void load_state(const float* params, const float* velocity) override {
    require_resident("load_state");
    upload_params(params);
    if (velocity)
      LBBSP_CUDA_CHECK(cudaMemcpyAsync(velocity_.get(), velocity, num_params() * sizeof(float),
                                       cudaMemcpyHostToDevice, stream_));
    else
      LBBSP_CUDA_CHECK(cudaMemsetAsync(velocity_.get(), 0, num_params() * sizeof(float), stream_));
    LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void store_state(float* params, float* velocity) override {
    require_resident("store_state");
    const size_t bytes = num_params() * sizeof(float);
    if (params)
      LBBSP_CUDA_CHECK(cudaMemcpyAsync(params, params_.get(), bytes, cudaMemcpyDeviceToHost, stream_));
    if (velocity)
      LBBSP_CUDA_CHECK(cudaMemcpyAsync(velocity, velocity_.get(), bytes, cudaMemcpyDeviceToHost, stream_));
    LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  StepStats forward_backward_resident(const float* x, const uint8_t* y, int n) override {
    require_resident("forward_backward_resident");
    check_labels(y, n, classes_);
    if (n == 0) {
      LBBSP_CUDA_CHECK(cudaMemsetAsync(grad_.get(), 0, num_params() * sizeof(float), stream_));
      LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return {};
    }
    run_forward_backward(x, y, n);
    return download_totals();
  }
  StepStats evaluate_resident(const float* x, const uint8_t* y, int n) override {
    require_resident("evaluate_resident");
    check_labels(y, n, classes_);
    if (n == 0) return {};
    return run_evaluate(x, y, n);
  }
  float* reduction_buffer() override {
    require_resident("reduction_buffer");
    return grad_.get();
  }
  void buffer_to_host(size_t offset, size_t count, float* host) override {
    check_range("buffer_to_host", offset, count);
    LBBSP_CUDA_CHECK(
        cudaMemcpyAsync(host, grad_.get() + offset, count * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void buffer_from_host(size_t offset, size_t count, const float* host) override {
    check_range("buffer_from_host", offset, count);
    LBBSP_CUDA_CHECK(
        cudaMemcpyAsync(grad_.get() + offset, host, count * sizeof(float), cudaMemcpyHostToDevice, stream_));
    LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void sgd_step(int64_t global_batch, double lr) override {
    require_resident("sgd_step");
    if (global_batch <= 0)
      throw std::invalid_argument("sgd_step: global batch must be positive, got " +
                                  std::to_string(global_batch));
    // The same float constants as models::Sgd::step.
    sgd_momentum_step(params_.get(), grad_.get(), velocity_.get(), num_params(),
                      float(1.0 / double(global_batch)), float(weight_decay_), float(momentum_), float(lr),
                      stream_);
    LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 protected:
  // Floats per input sample.
  virtual size_t host_input_size() const = 0;
  // Returns the device logits [n, classes] of the device inputs x; keeps what backward needs.
  virtual const float* forward(const float* x, int n) = 0;
  // Where softmax_xent writes the gradient of the summed loss w.r.t. the logits.
  virtual float* dlogits_buffer(int n) = 0;
  // ADDS the parameter gradient sums into grad_ (zeroed by the caller); may overwrite dlogits.
  virtual void backward(const float* x, int n, float* dlogits) = 0;

  const TensorInfo& tensor(const std::string& name, const std::vector<int>& shape) const {
    for (const TensorInfo& t : tensors_)
      if (t.name == name) {
        if (t.shape != shape)
          throw std::logic_error("CudaModel: tensor " + name + " has an unexpected shape");
        return t;
      }
    throw std::logic_error("CudaModel: the " + host_->name() + " model has no tensor " + name);
  }
  const float* param(const TensorInfo& t) const { return params_.get() + t.offset; }
  float* grad(const TensorInfo& t) const { return grad_.get() + t.offset; }

  std::unique_ptr<Model> host_;
  std::vector<TensorInfo> tensors_ = host_->tensors();
  int classes_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer<float> bias_ws_;  // bias_backward scratch

 private:
  // Upload the batch, zero the gradient sums and the totals, run forward, loss and backward (asynchronous).
  void run_forward_backward(const float* x, const uint8_t* y, int n) {
    LBBSP_CUDA_CHECK(cudaSetDevice(device_));
    const float* dx = upload_batch(x, y, n);
    LBBSP_CUDA_CHECK(cudaMemsetAsync(grad_.get(), 0, num_params() * sizeof(float), stream_));
    LBBSP_CUDA_CHECK(cudaMemsetAsync(totals_.get(), 0, sizeof(StepTotals), stream_));
    const float* logits = forward(dx, n);
    float* dlogits = dlogits_buffer(n);
    softmax_xent(logits, labels_.get(), n, classes_, dlogits, loss_.ensure(n), correct_.ensure(n), stream_);
    reduce_stats(loss_.get(), correct_.get(), n, totals_.get(), stream_);
    backward(dx, n, dlogits);
  }
  StepStats run_evaluate(const float* x, const uint8_t* y, int n) {
    LBBSP_CUDA_CHECK(cudaSetDevice(device_));
    LBBSP_CUDA_CHECK(cudaMemsetAsync(totals_.get(), 0, sizeof(StepTotals), stream_));
    const size_t sample = host_input_size();
    for (int s0 = 0; s0 < n; s0 += kEvalChunk) {
      const int count = std::min(kEvalChunk, n - s0);
      const float* dx = upload_batch(x + size_t(s0) * sample, y + s0, count);
      const float* logits = forward(dx, count);
      softmax_xent(logits, labels_.get(), count, classes_, nullptr, loss_.ensure(count),
                   correct_.ensure(count), stream_);
      reduce_stats(loss_.get(), correct_.get(), count, totals_.get(), stream_);
    }
    return download_totals();
  }
  void require_resident(const char* what) const {
    if (!resident_) throw std::logic_error(std::string(what) + ": call enable_resident first");
    LBBSP_CUDA_CHECK(cudaSetDevice(device_));
  }
  void check_range(const char* what, size_t offset, size_t count) const {
    require_resident(what);
    if (offset > buffer_len_ || count > buffer_len_ - offset)
      throw std::out_of_range(std::string(what) + ": floats [" + std::to_string(offset) + ", " +
                              std::to_string(offset + count) + ") outside the reduction buffer of " +
                              std::to_string(buffer_len_));
  }
  // 1 MB at most for these models: copying every call is cheaper than tracking changes.
  void upload_params(const float* params) {
    LBBSP_CUDA_CHECK(cudaMemcpyAsync(params_.get(), params, num_params() * sizeof(float),
                                     cudaMemcpyHostToDevice, stream_));
  }
  const float* upload_batch(const float* x, const uint8_t* y, int n) {
    const size_t floats = size_t(n) * host_input_size();
    float* dx = x_.ensure(floats);
    LBBSP_CUDA_CHECK(cudaMemcpyAsync(dx, x, floats * sizeof(float), cudaMemcpyHostToDevice, stream_));
    LBBSP_CUDA_CHECK(cudaMemcpyAsync(labels_.ensure(n), y, size_t(n), cudaMemcpyHostToDevice, stream_));
    return dx;
  }
  StepStats download_totals() {
    StepTotals totals{};
    LBBSP_CUDA_CHECK(
        cudaMemcpyAsync(&totals, totals_.get(), sizeof(totals), cudaMemcpyDeviceToHost, stream_));
    LBBSP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return {totals.loss_sum, int64_t(totals.correct)};
  }

  DeviceBuffer<float> params_, grad_, x_, velocity_;  // grad_: the reduction buffer when resident
  DeviceBuffer<uint8_t> labels_;
  DeviceBuffer<double> loss_;
  DeviceBuffer<int> correct_;
  DeviceBuffer<StepTotals> totals_;
  std::vector<float> host_grad_;
  bool resident_ = false;
  double momentum_ = 0, weight_decay_ = 0;
  size_t buffer_len_ = 0;
};

// Dense layers with ReLU between them (logreg: one layer). Same passes as models/mlp.cpp.
class CudaMlp final : public CudaModel {
 public:
  CudaMlp(std::unique_ptr<Model> host, const ModelConfig& cfg) : CudaModel(std::move(host), cfg.classes) {
    input_size_ = size_t(cfg.input.size());
    // Layers are fc1, fc2, ... in order, each weight [out, in] then bias [out] (see models/mlp.cpp).
    int in = cfg.input.size();
    for (size_t l = 0; 2 * l < tensors_.size(); ++l) {
      const std::string prefix = "fc" + std::to_string(l + 1);
      const int out = tensors_[2 * l].shape.empty() ? 0 : tensors_[2 * l].shape[0];
      layers_.push_back({in, out, tensor(prefix + ".weight", {out, in}), tensor(prefix + ".bias", {out})});
      max_width_ = std::max({max_width_, in, out});
      in = out;
    }
    if (layers_.empty() || layers_.back().out != classes_)
      throw std::logic_error("CudaMlp: the last layer of " + host_->name() + " does not produce the logits");
    activations_.resize(layers_.size());
    bias_ws_.ensure(bias_backward_workspace_floats(max_width_));
  }

 protected:
  size_t host_input_size() const override { return input_size_; }

  const float* forward(const float* x, int n) override {
    const float* input = x;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      float* out = activations_[l].ensure(size_t(n) * L.out);
      gemm(cublas_, false, true, n, L.out, L.in, 1.0f, input, L.in, param(L.weight), L.in, 0.0f, out, L.out);
      bias_relu_forward(out, param(L.bias), size_t(n), L.out, /*relu=*/l + 1 < layers_.size(), stream_);
      input = out;
    }
    return input;
  }

  float* dlogits_buffer(int n) override { return delta_.ensure(size_t(n) * max_width_); }

  void backward(const float* x, int n, float* dlogits) override {
    float* d = dlogits;  // = delta_
    float* d_next = delta_next_.ensure(size_t(n) * max_width_);
    for (size_t l = layers_.size(); l-- > 0;) {
      const Layer& L = layers_[l];
      // d: gradient w.r.t. layer l's output; through its ReLU (not the logits layer) to the pre-activation.
      if (l + 1 < layers_.size()) relu_backward(activations_[l].get(), d, size_t(n) * L.out, stream_);
      const float* input = l == 0 ? x : activations_[l - 1].get();
      // dW += d^T input, db += column sums of d, d_next = d W (the gradient w.r.t. this layer's input).
      gemm(cublas_, true, false, L.out, L.in, n, 1.0f, d, L.out, input, L.in, 1.0f, grad(L.weight), L.in);
      bias_backward(d, grad(L.bias), size_t(n), L.out, bias_ws_.get(), stream_);
      if (l > 0)
        gemm(cublas_, false, false, n, L.in, L.out, 1.0f, d, L.out, param(L.weight), L.in, 0.0f, d_next,
             L.in);
      std::swap(d, d_next);
    }
  }

 private:
  struct Layer {
    int in, out;
    TensorInfo weight, bias;
  };
  size_t input_size_ = 0;
  int max_width_ = 0;
  std::vector<Layer> layers_;
  std::vector<DeviceBuffer<float>> activations_;  // each layer's output (after ReLU for hidden layers)
  DeviceBuffer<float> delta_, delta_next_;
};

// conv5x5(16)-ReLU-maxpool2, conv5x5(32)-ReLU-maxpool2, fc. Same passes as models/cnn.cpp: convolutions have
// no bias, each block runs conv -> maxpool -> bias + ReLU (the same function: ReLU and the per-channel bias
// commute with max), feature maps are channels-last [n, h, w, c], the input is [n, c, h, w].
class CudaCnn final : public CudaModel {
 public:
  static constexpr int kChannels1 = 16, kChannels2 = 32, kKernel = 5;

  CudaCnn(std::unique_ptr<Model> host, const ModelConfig& cfg)
      : CudaModel(std::move(host), cfg.classes),
        conv1_{cfg.input.height, cfg.input.width, cfg.input.channels, kKernel, /*input_chw=*/true},
        conv2_{cfg.input.height / 2, cfg.input.width / 2, kChannels1, kKernel, /*input_chw=*/false},
        h_(cfg.input.height),
        w_(cfg.input.width),
        fc_in_(h_ / 4 * (w_ / 4) * kChannels2),
        w1_(tensor("conv1.weight", {kChannels1, kKernel, kKernel, cfg.input.channels})),
        b1_(tensor("conv1.bias", {kChannels1})),
        w2_(tensor("conv2.weight", {kChannels2, kKernel, kKernel, kChannels1})),
        b2_(tensor("conv2.bias", {kChannels2})),
        wf_(tensor("fc.weight", {classes_, fc_in_})),
        bf_(tensor("fc.bias", {classes_})) {
    bias_ws_.ensure(bias_backward_workspace_floats(std::max({kChannels1, kChannels2, classes_})));
  }

 protected:
  size_t host_input_size() const override { return conv1_.input_size(); }

  const float* forward(const float* x, int n) override {
    const size_t pooled1 = size_t(n) * (h_ / 2) * (w_ / 2), pooled2 = size_t(n) * (h_ / 4) * (w_ / 4);
    float* a1 = a1_.ensure(size_t(n) * h_ * w_ * kChannels1);
    float* p1 = p1_.ensure(pooled1 * kChannels1);
    float* a2 = a2_.ensure(pooled1 * kChannels2);  // conv2 runs on the pooled (h/2, w/2) map
    float* p2 = p2_.ensure(pooled2 * kChannels2);
    float* logits = logits_.ensure(size_t(n) * classes_);

    conv_forward(conv1_, kChannels1, x, param(w1_), a1, n);
    maxpool2x2_forward(a1, p1, idx1_.ensure(pooled1 * kChannels1), n, h_, w_, kChannels1, stream_);
    bias_relu_forward(p1, param(b1_), pooled1, kChannels1, true, stream_);
    conv_forward(conv2_, kChannels2, p1, param(w2_), a2, n);
    maxpool2x2_forward(a2, p2, idx2_.ensure(pooled2 * kChannels2), n, h_ / 2, w_ / 2, kChannels2, stream_);
    bias_relu_forward(p2, param(b2_), pooled2, kChannels2, true, stream_);
    // fc on p2 flattened per sample in (h, w, c) order, as fc.weight expects.
    gemm(cublas_, false, true, n, classes_, fc_in_, 1.0f, p2, fc_in_, param(wf_), fc_in_, 0.0f, logits,
         classes_);
    bias_relu_forward(logits, param(bf_), size_t(n), classes_, false, stream_);
    return logits;
  }

  float* dlogits_buffer(int n) override { return dlogits_.ensure(size_t(n) * classes_); }

  void backward(const float* x, int n, float* dlogits) override {
    const size_t pooled1 = size_t(n) * (h_ / 2) * (w_ / 2), pooled2 = size_t(n) * (h_ / 4) * (w_ / 4);
    float* dp2 = dp2_.ensure(pooled2 * kChannels2);
    float* dp1 = dp1_.ensure(pooled1 * kChannels1);

    // fc: dWf += dlogits^T p2, dbf += column sums, dp2 = dlogits Wf.
    gemm(cublas_, true, false, classes_, fc_in_, n, 1.0f, dlogits, classes_, p2_.get(), fc_in_, 1.0f,
         grad(wf_), fc_in_);
    bias_backward(dlogits, grad(bf_), size_t(n), classes_, bias_ws_.get(), stream_);
    gemm(cublas_, false, false, n, fc_in_, classes_, 1.0f, dlogits, classes_, param(wf_), fc_in_, 0.0f, dp2,
         fc_in_);

    // Block 2: through ReLU, bias, max-pool (into a2's memory: conv2's output is no longer needed), conv2.
    relu_backward(p2_.get(), dp2, pooled2 * kChannels2, stream_);
    bias_backward(dp2, grad(b2_), pooled2, kChannels2, bias_ws_.get(), stream_);
    float* da2 = a2_.get();
    maxpool2x2_backward(dp2, idx2_.get(), da2, n, h_ / 2, w_ / 2, kChannels2, stream_);
    conv_backward(conv2_, kChannels2, p1_.get(), param(w2_), da2, grad(w2_), dp1, n);

    // Block 1: the same, without an input gradient.
    relu_backward(p1_.get(), dp1, pooled1 * kChannels1, stream_);
    bias_backward(dp1, grad(b1_), pooled1, kChannels1, bias_ws_.get(), stream_);
    float* da1 = a1_.get();
    maxpool2x2_backward(dp1, idx1_.get(), da1, n, h_, w_, kChannels1, stream_);
    conv_backward(conv1_, kChannels1, x, param(w1_), da1, grad(w1_), nullptr, n);
  }

 private:
  // Samples per im2col chunk: the workspace stays within kCudaConvWorkspaceBytes for any batch.
  static int chunk_samples(const ConvGeometry& g) {
    const size_t per_sample = size_t(g.height) * g.width * g.col_width() * sizeof(float);
    return int(std::max<size_t>(1, kCudaConvWorkspaceBytes / per_sample));
  }

  // y [n, h, w, out_channels] = im2col(x) [n*h*w, col_width] * W^T, W = [out_channels, col_width].
  void conv_forward(const ConvGeometry& g, int out_channels, const float* x, const float* w, float* y,
                    int n) {
    const int chunk = chunk_samples(g), hw = g.height * g.width, cw = g.col_width();
    float* col = col_.ensure(size_t(std::min(chunk, n)) * hw * cw);
    for (int s0 = 0; s0 < n; s0 += chunk) {
      const int cs = std::min(chunk, n - s0);
      im2col(g, x + size_t(s0) * g.input_size(), cs, col, stream_);
      gemm(cublas_, false, true, cs * hw, out_channels, cw, 1.0f, col, cw, w, cw, 0.0f,
           y + size_t(s0) * hw * out_channels, out_channels);
    }
  }

  // dW += dy^T im2col(x); when dx is not null, dx = col2im(dy W) (the col buffer is reused for dy W).
  void conv_backward(const ConvGeometry& g, int out_channels, const float* x, const float* w, const float* dy,
                     float* dw, float* dx, int n) {
    const int chunk = chunk_samples(g), hw = g.height * g.width, cw = g.col_width();
    float* col = col_.ensure(size_t(std::min(chunk, n)) * hw * cw);
    for (int s0 = 0; s0 < n; s0 += chunk) {
      const int cs = std::min(chunk, n - s0);
      const float* dy_chunk = dy + size_t(s0) * hw * out_channels;
      im2col(g, x + size_t(s0) * g.input_size(), cs, col, stream_);
      gemm(cublas_, true, false, out_channels, cw, cs * hw, 1.0f, dy_chunk, out_channels, col, cw, 1.0f, dw,
           cw);
      if (!dx) continue;
      gemm(cublas_, false, false, cs * hw, cw, out_channels, 1.0f, dy_chunk, out_channels, w, cw, 0.0f, col,
           cw);
      col2im(g, col, cs, dx + size_t(s0) * g.input_size(), stream_);
    }
  }

  ConvGeometry conv1_, conv2_;
  int h_, w_, fc_in_;
  TensorInfo w1_, b1_, w2_, b2_, wf_, bf_;
  DeviceBuffer<float> a1_, p1_, a2_, p2_, logits_, dlogits_, dp2_, dp1_, col_;
  DeviceBuffer<uint8_t> idx1_, idx2_;
};

}  // namespace

}  // namespace cuda

std::unique_ptr<Model> make_cuda_model(const ModelConfig& cfg, std::unique_ptr<Model> host_model) {
  if (!host_model) throw std::invalid_argument("make_cuda_model: host_model is null");
  if (cfg.kind == "logreg" || cfg.kind == "mlp")
    return std::make_unique<cuda::CudaMlp>(std::move(host_model), cfg);
  if (cfg.kind == "cnn") return std::make_unique<cuda::CudaCnn>(std::move(host_model), cfg);
  throw std::invalid_argument("make_cuda_model: unknown model '" + cfg.kind +
                              "' (expected logreg, mlp or cnn)");
}

DeviceResident* device_resident(Model& model) {
  return dynamic_cast<DeviceResident*>(&model);
}

}  // namespace lbbsp::models
