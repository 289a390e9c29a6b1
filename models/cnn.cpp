#include <algorithm>
#include <cmath>
#include <vector>

#include <omp.h>

#include "models/activation.hpp"
#include "models/conv.hpp"
#include "models/dense.hpp"
#include "models/init.hpp"
#include "models/pool.hpp"
#include "models/softmax_xent.hpp"
#include "models/zoo.hpp"

namespace lbbsp::models {

namespace {

constexpr int kChannels1 = 16, kChannels2 = 32, kKernel = 5;

// Feature maps are channels-last [n, h, w, c]; the input stays in the data layer's [n, c, h, w].
// ReLU and max-pooling commute, and the conv bias is per channel, so each block runs
// conv (no bias) -> maxpool -> bias + ReLU: the same function, with the epilogue on a quarter of the data.
class Cnn final : public Model {
 public:
  explicit Cnn(const ModelConfig& cfg) : in_(cfg.input), classes_(cfg.classes) {
    conv1_ = {0, in_.height, in_.width, in_.channels, kChannels1, kKernel, /*input_chw=*/true};
    conv2_ = {0, in_.height / 2, in_.width / 2, kChannels1, kChannels2, kKernel, /*input_chw=*/false};
    fc_in_ = (in_.height / 4) * (in_.width / 4) * kChannels2;
    w1_ = layout_.add("conv1.weight", {kChannels1, kKernel, kKernel, in_.channels});
    b1_ = layout_.add("conv1.bias", {kChannels1});
    w2_ = layout_.add("conv2.weight", {kChannels2, kKernel, kKernel, kChannels1});
    b2_ = layout_.add("conv2.bias", {kChannels2});
    wf_ = layout_.add("fc.weight", {classes_, fc_in_});  // input features in (h, w, c) order
    bf_ = layout_.add("fc.bias", {classes_});
  }

  std::string name() const override { return "cnn"; }
  size_t num_params() const override { return layout_.size(); }
  std::vector<TensorInfo> tensors() const override { return layout_.tensors(); }

  void init_params(float* params, uint64_t seed) const override {
    NormalRng rng(seed);
    std::fill(params, params + layout_.size(), 0.0f);  // biases
    fill_normal(params + w1_, size_t(kChannels1) * conv1_.col_width(), std::sqrt(2.0 / conv1_.col_width()),
                rng);
    fill_normal(params + w2_, size_t(kChannels2) * conv2_.col_width(), std::sqrt(2.0 / conv2_.col_width()),
                rng);
    fill_normal(params + wf_, size_t(classes_) * fc_in_, std::sqrt(1.0 / fc_in_), rng);
  }

  StepStats forward_backward(const float* params, const float* x, const uint8_t* y, int n,
                             float* grad) override {
    check_labels(y, n, classes_);
    const OneThreadScope small_step(step_runs_on_one_thread(flops_per_sample() * n));
    // Groups of at most kGroupSamples, one after another, bound the memory the per-micro-batch gradients
    // take.
    StepStats total;
    for (int s0 = 0; s0 < n; s0 += kGroupSamples) {
      const int count = std::min(kGroupSamples, n - s0);
      const StepStats part = group(params, x + size_t(s0) * in_.size(), y + s0, count, grad);
      total.loss_sum += part.loss_sum;
      total.correct += part.correct;
    }
    return total;
  }

  StepStats evaluate(const float* params, const float* x, const uint8_t* y, int n) override {
    if (scratch_.empty()) scratch_.resize(1);
    return evaluate_in_chunks(x, y, n, size_t(in_.size()), classes_, [&](const float* xs, int count) {
      return forward(params, xs, count, scratch_[0]);
    });
  }

  double flops_per_sample() const override {
    // GEMM work only: forward + weight gradient for both convs and the fc, input gradient for conv2 and fc.
    const double c1 = 2.0 * conv1_.height * conv1_.width * kChannels1 * conv1_.col_width();
    const double c2 = 2.0 * conv2_.height * conv2_.width * kChannels2 * conv2_.col_width();
    const double fc = 2.0 * fc_in_ * classes_;
    return 2.0 * c1 + 3.0 * c2 + 3.0 * fc;
  }

 private:
  // Micro-batches of up to 16 samples (their feature maps stay in a core's cache); a group has at least
  // kMinMicroBatches of them (or one per sample) so that up to that many threads each run whole ones.
  static constexpr int kMicroBatch = 16, kMinMicroBatches = 4;
  static constexpr int kGroupSamples = 64 * kMicroBatch;  // 64 gradients of the 28x28 CNN: 7 MiB

  // A function of the group's size alone, so the gradient does not depend on the threads.
  static int micro_batch_size(int n) {
    return std::clamp((n + kMinMicroBatches - 1) / kMinMicroBatches, 1, kMicroBatch);
  }

  // One thread's feature maps, their gradients and the convolutions' scratch, reused across calls.
  struct Scratch {
    std::vector<float> a1, p1, a2, p2, logits, dlogits, dp2, dp1;
    std::vector<uint8_t> idx1, idx2;
    ConvWorkspace conv;
  };

  // Up to kGroupSamples samples as micro-batches (micro_batch_size), each summing its gradient into a partial
  // of its own; the partials are then added in micro-batch order. So the result depends on n alone, not on
  // the threads. Each thread runs whole micro-batches on its own (no barrier inside the network; the kernels'
  // loops run on that one thread); a group of one micro-batch runs on one thread: splitting a single sample's
  // layers over threads cost more than it saved (2 threads at batch 1: 0.43x of one).
  StepStats group(const float* params, const float* x, const uint8_t* y, int n, float* grad) {
    const int size = micro_batch_size(n), batches = (n + size - 1) / size;
    const int team = std::min(omp_get_max_threads(), batches);
    const size_t params_count = layout_.size();
    float* partials = ensure_size(partials_, size_t(batches) * params_count);
    std::vector<StepStats>& stats = stats_;
    stats.assign(batches, StepStats{});
    if (scratch_.size() < size_t(team)) scratch_.resize(team);
    const auto run = [&](int b) {
      const int s0 = b * size, count = std::min(size, n - s0);
      float* partial = partials + size_t(b) * params_count;
      std::fill(partial, partial + params_count, 0.0f);
      stats[b] = micro_batch(params, x + size_t(s0) * in_.size(), y + s0, count, partial,
                             scratch_[omp_get_thread_num()]);
    };
    const OneThreadScope one_thread(team == 1);  // then the kernels' own loops stay on this thread too
#pragma omp parallel for num_threads(team) schedule(dynamic, 1) if (team > 1)
    for (int b = 0; b < batches; ++b) run(b);
    add_partials(partials, batches, grad);
    if (team > 1) mark_team_released();
    StepStats total;
    for (const StepStats& part : stats) total.loss_sum += part.loss_sum, total.correct += part.correct;
    return total;
  }

  // grad[i] += partial_0[i] + partial_1[i] + ... in micro-batch order.
  void add_partials(const float* partials, int batches, float* grad) const {
    const int64_t count = int64_t(layout_.size());
#pragma omp parallel for schedule(static) if (batches > 1 && count * batches > (1 << 16))
    for (int64_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (int b = 0; b < batches; ++b) sum += partials[size_t(b) * count + i];
      grad[i] += sum;
    }
  }

  ConvShape with_samples(ConvShape shape, int n) const {
    shape.n = n;
    return shape;
  }

  StepStats micro_batch(const float* params, const float* x, const uint8_t* y, int n, float* grad,
                        Scratch& s) {
    const float* logits = forward(params, x, n, s);
    const ConvShape conv1 = with_samples(conv1_, n), conv2 = with_samples(conv2_, n);
    const size_t pooled1 = size_t(n) * (in_.height / 2) * (in_.width / 2);  // pixels after pool 1
    const size_t pooled2 = size_t(n) * (in_.height / 4) * (in_.width / 4);
    float* dlogits = ensure_size(s.dlogits, size_t(n) * classes_);
    float* dp2 = ensure_size(s.dp2, pooled2 * kChannels2);
    float* dp1 = ensure_size(s.dp1, pooled1 * kChannels1);
    const StepStats stats = softmax_xent(logits, y, n, classes_, dlogits);

    dense_backward(s.p2.data(), params + wf_, dlogits, grad + wf_, grad + bf_, dp2, n, fc_in_, classes_);
    relu_backward(s.p2.data(), dp2, pooled2 * kChannels2);
    bias_backward(dp2, grad + b2_, int(pooled2), kChannels2);
    float* da2 = s.a2.data();  // conv2's output is no longer needed: reuse it for its gradient
    maxpool2x2_backward(dp2, s.idx2.data(), da2, n, conv2.height, conv2.width, kChannels2);
    conv2d_backward(conv2, s.p1.data(), params + w2_, da2, grad + w2_, dp1, s.conv);

    relu_backward(s.p1.data(), dp1, pooled1 * kChannels1);
    bias_backward(dp1, grad + b1_, int(pooled1), kChannels1);
    float* da1 = s.a1.data();
    maxpool2x2_backward(dp1, s.idx1.data(), da1, n, conv1.height, conv1.width, kChannels1);
    conv2d_backward(conv1, x, params + w1_, da1, grad + w1_, nullptr, s.conv);
    return stats;
  }

  const float* forward(const float* params, const float* x, int n, Scratch& s) const {
    const ConvShape conv1 = with_samples(conv1_, n), conv2 = with_samples(conv2_, n);
    const int h2 = in_.height / 2, w2 = in_.width / 2, h4 = in_.height / 4, w4 = in_.width / 4;
    const size_t pooled1 = size_t(n) * h2 * w2, pooled2 = size_t(n) * h4 * w4;
    float* a1 = ensure_size(s.a1, size_t(n) * conv1.output_size());
    float* p1 = ensure_size(s.p1, pooled1 * kChannels1);
    float* a2 = ensure_size(s.a2, size_t(n) * conv2.output_size());
    float* p2 = ensure_size(s.p2, pooled2 * kChannels2);
    float* logits = ensure_size(s.logits, size_t(n) * classes_);

    conv2d_forward(conv1, x, params + w1_, a1, s.conv);
    maxpool2x2_forward(a1, p1, ensure_size(s.idx1, pooled1 * kChannels1), n, in_.height, in_.width,
                       kChannels1);
    bias_relu_forward(p1, params + b1_, int(pooled1), kChannels1, true);
    conv2d_forward(conv2, p1, params + w2_, a2, s.conv);
    maxpool2x2_forward(a2, p2, ensure_size(s.idx2, pooled2 * kChannels2), n, h2, w2, kChannels2);
    bias_relu_forward(p2, params + b2_, int(pooled2), kChannels2, true);
    dense_forward(p2, params + wf_, params + bf_, logits, n, fc_in_, classes_, false);
    return logits;
  }

  InputShape in_;
  int classes_;
  int fc_in_ = 0;
  ConvShape conv1_, conv2_;
  ParamLayout layout_;
  size_t w1_ = 0, b1_ = 0, w2_ = 0, b2_ = 0, wf_ = 0, bf_ = 0;
  std::vector<Scratch> scratch_;  // one per thread
  std::vector<float> partials_;   // one gradient per micro-batch
  std::vector<StepStats> stats_;  // one per micro-batch
};

}  // namespace

std::unique_ptr<Model> make_cnn(const ModelConfig& cfg) {
  return std::make_unique<Cnn>(cfg);
}

}  // namespace lbbsp::models
