// Constructors of the concrete models behind make_model (config already validated there).
#pragma once
#include <algorithm>
#include <memory>

#include "models/model.hpp"
#include "models/softmax_xent.hpp"

namespace lbbsp::models {

// A stack of dense layers with ReLU between them; with no hidden widths it is multinomial logistic
// regression.
std::unique_ptr<Model> make_mlp(const ModelConfig& cfg, std::string name);
// conv5x5(16)-ReLU-maxpool2, conv5x5(32)-ReLU-maxpool2, fc to classes; needs height and width divisible by 4.
std::unique_ptr<Model> make_cnn(const ModelConfig& cfg);

// Evaluation walks the samples in chunks of this many so workspaces stay batch-sized even for a whole test
// set.
constexpr int kEvalChunk = 256;

// forward(x_chunk, count) returns the logits of count samples; stats are summed chunk by chunk, in order.
template <typename Forward>
StepStats evaluate_in_chunks(const float* x, const uint8_t* y, int n, size_t sample_size, int classes,
                             Forward&& forward) {
  check_labels(y, n, classes);
  StepStats total;
  for (int s0 = 0; s0 < n; s0 += kEvalChunk) {
    const int count = std::min(kEvalChunk, n - s0);
    const StepStats part =
        softmax_xent(forward(x + size_t(s0) * sample_size, count), y + s0, count, classes, nullptr);
    total.loss_sum += part.loss_sum;
    total.correct += part.correct;
  }
  return total;
}

}  // namespace lbbsp::models
