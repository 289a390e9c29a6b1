#include "models/softmax_xent.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace lbbsp::models {

void check_labels(const uint8_t* labels, int n, int classes) {
  for (int i = 0; i < n; ++i)
    if (labels[i] >= classes)
      throw std::out_of_range("label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) +
                              " is out of range for " + std::to_string(classes) + " classes");
}

// Serial on purpose: n * classes is tiny next to the GEMMs, and one thread keeps the loss sum order fixed.
StepStats softmax_xent(const float* logits, const uint8_t* labels, int n, int classes, float* dlogits) {
  StepStats stats;
  for (int i = 0; i < n; ++i) {
    const float* z = logits + size_t(i) * classes;
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;
    const float zmax = z[best];
    float sum = 0.0f;
    for (int c = 0; c < classes; ++c) sum += std::exp(z[c] - zmax);
    const int label = labels[i];
    stats.loss_sum += double(std::log(sum)) - double(z[label] - zmax);
    stats.correct += best == label;
    if (dlogits) {
      float* g = dlogits + size_t(i) * classes;
      const float inv = 1.0f / sum;
      for (int c = 0; c < classes; ++c) g[c] = std::exp(z[c] - zmax) * inv;
      g[label] -= 1.0f;
    }
  }
  return stats;
}

StepStats softmax_xent_ref(const float* logits, const uint8_t* labels, int n, int classes, float* dlogits) {
  StepStats stats;
  std::vector<double> p(classes);
  for (int i = 0; i < n; ++i) {
    const float* z = logits + size_t(i) * classes;
    double zmax = z[0];
    int best = 0;
    for (int c = 0; c < classes; ++c)
      if (z[c] > zmax) zmax = z[c], best = c;
    double sum = 0.0;
    for (int c = 0; c < classes; ++c) sum += p[c] = std::exp(double(z[c]) - zmax);
    stats.loss_sum += std::log(sum) - (double(z[labels[i]]) - zmax);
    stats.correct += best == labels[i];
    if (dlogits)
      for (int c = 0; c < classes; ++c)
        dlogits[size_t(i) * classes + c] = float(p[c] / sum - (c == labels[i] ? 1.0 : 0.0));
  }
  return stats;
}

}  // namespace lbbsp::models
