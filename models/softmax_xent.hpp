// Softmax + cross-entropy on logits [n, classes], fused with its gradient.
#pragma once
#include <cstdint>

#include "models/model.hpp"

namespace lbbsp::models {

// Throws std::out_of_range naming the first label >= classes (and its sample index).
void check_labels(const uint8_t* labels, int n, int classes);

// Returns the SUM over samples of -log softmax(logits)[label] and the number of samples whose arg-max (first
// on ties) is the label. When dlogits is not null, WRITES softmax - onehot (the gradient of the summed loss).
StepStats softmax_xent(const float* logits, const uint8_t* labels, int n, int classes, float* dlogits);
// Reference: everything in double.
StepStats softmax_xent_ref(const float* logits, const uint8_t* labels, int n, int classes, float* dlogits);

}  // namespace lbbsp::models
