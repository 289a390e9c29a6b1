#include <algorithm>
#include <cmath>

#include "models/activation.hpp"
#include "models/dense.hpp"
#include "models/init.hpp"
#include "models/softmax_xent.hpp"
#include "models/zoo.hpp"

namespace lbbsp::models {

namespace {

struct DenseLayer {
  int in = 0, out = 0;
  size_t weight = 0, bias = 0;  // offsets in the flat buffer
};

class Mlp final : public Model {
 public:
  Mlp(std::string name, int inputs, const std::vector<int>& hidden, int classes) : name_(std::move(name)) {
    std::vector<int> widths = hidden;
    widths.push_back(classes);
    int in = inputs;
    for (size_t l = 0; l < widths.size(); ++l) {
      const std::string prefix = "fc" + std::to_string(l + 1);
      DenseLayer layer{in, widths[l]};
      layer.weight = layout_.add(prefix + ".weight", {layer.out, layer.in});
      layer.bias = layout_.add(prefix + ".bias", {layer.out});
      layers_.push_back(layer);
      in = layer.out;
    }
    activations_.resize(layers_.size());
  }

  std::string name() const override { return name_; }
  size_t num_params() const override { return layout_.size(); }
  std::vector<TensorInfo> tensors() const override { return layout_.tensors(); }

  void init_params(float* params, uint64_t seed) const override {
    NormalRng rng(seed);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DenseLayer& d = layers_[l];
      // He init for layers feeding a ReLU, LeCun (1/fan_in) for the logits layer; biases start at zero.
      const double gain = l + 1 < layers_.size() ? 2.0 : 1.0;
      fill_normal(params + d.weight, size_t(d.out) * d.in, std::sqrt(gain / d.in), rng);
      std::fill(params + d.bias, params + d.bias + d.out, 0.0f);
    }
  }

  StepStats forward_backward(const float* params, const float* x, const uint8_t* y, int n,
                             float* grad) override {
    check_labels(y, n, classes());
    if (n == 0) return {};
    const OneThreadScope small_step(step_runs_on_one_thread(flops_per_sample() * n));
    const float* logits = forward(params, x, n);
    float* d = ensure_size(delta_, size_t(n) * max_width());
    float* d_next = ensure_size(delta_next_, size_t(n) * max_width());
    const StepStats stats = softmax_xent(logits, y, n, classes(), d);
    for (size_t l = layers_.size(); l-- > 0;) {
      const DenseLayer& L = layers_[l];
      if (l + 1 < layers_.size()) relu_backward(activations_[l].data(), d, size_t(n) * L.out);
      const float* input = l == 0 ? x : activations_[l - 1].data();
      dense_backward(input, params + L.weight, d, grad + L.weight, grad + L.bias, l == 0 ? nullptr : d_next,
                     n, L.in, L.out);
      std::swap(d, d_next);
    }
    return stats;
  }

  StepStats evaluate(const float* params, const float* x, const uint8_t* y, int n) override {
    return evaluate_in_chunks(x, y, n, size_t(layers_.front().in), classes(),
                              [&](const float* xs, int count) { return forward(params, xs, count); });
  }

  double flops_per_sample() const override {
    // Per layer: forward, weight gradient and (except the first) input gradient, each 2*in*out.
    double flops = 0.0;
    for (size_t l = 0; l < layers_.size(); ++l)
      flops += (l == 0 ? 2.0 : 3.0) * 2.0 * layers_[l].in * layers_[l].out;
    return flops;
  }

 private:
  int classes() const { return layers_.back().out; }
  int max_width() const {
    int w = 0;
    for (const DenseLayer& l : layers_) w = std::max({w, l.in, l.out});
    return w;
  }

  // Returns the logits; keeps every layer's (post-ReLU) output for the backward pass.
  const float* forward(const float* params, const float* x, int n) {
    const float* input = x;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const DenseLayer& L = layers_[l];
      float* out = ensure_size(activations_[l], size_t(n) * L.out);
      dense_forward(input, params + L.weight, params + L.bias, out, n, L.in, L.out, l + 1 < layers_.size());
      input = out;
    }
    return input;
  }

  std::string name_;
  ParamLayout layout_;
  std::vector<DenseLayer> layers_;
  std::vector<std::vector<float>> activations_;
  std::vector<float> delta_, delta_next_;
};

}  // namespace

std::unique_ptr<Model> make_mlp(const ModelConfig& cfg, std::string name) {
  return std::make_unique<Mlp>(std::move(name), cfg.input.size(), cfg.hidden, cfg.classes);
}

}  // namespace lbbsp::models
