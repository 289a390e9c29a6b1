// Each model's analytic gradient against central finite differences of its own loss.
#include <gtest/gtest.h>

#include <cmath>

#include "models/model.hpp"
#include "test_models_util.hpp"

namespace lbbsp::models {
namespace {

using testing::random_floats;
using testing::random_labels;

ModelConfig small_config(const std::string& kind) {
  ModelConfig cfg;
  cfg.kind = kind;
  cfg.classes = 3;
  cfg.input = kind == "cnn" ? InputShape{2, 8, 4} : InputShape{1, 4, 5};
  cfg.hidden = {7, 5};
  return cfg;
}

// Central differences of the summed loss of a float32 model: the step trades truncation error and kink
// crossings (large steps) against rounding noise (small steps); 1e-3 and 4e-4 both work at these sizes.
void check_gradient(const std::string& kind) {
  auto model = make_model(small_config(kind));
  const int n = 4;
  std::mt19937_64 rng(11);
  std::vector<float> params(model->num_params());
  model->init_params(params.data(), 5);
  for (float& p : params) p += 0.05f * float(int(rng() % 21) - 10) / 10.0f;  // non-zero biases too
  const auto x = random_floats(size_t(n) * small_config(kind).input.size(), rng, 0.0f, 1.0f);
  const auto y = random_labels(n, 3, rng);

  std::vector<float> grad(params.size(), 0.0f);
  model->forward_backward(params.data(), x.data(), y.data(), n, grad.data());

  // Relative error of the analytic gradient against a central difference with step eps.
  const auto error_at = [&](size_t i, double eps) {
    const float saved = params[i];
    params[i] = saved + float(eps);
    const double up = model->evaluate(params.data(), x.data(), y.data(), n).loss_sum;
    params[i] = saved - float(eps);
    const double down = model->evaluate(params.data(), x.data(), y.data(), n).loss_sum;
    params[i] = saved;
    const double numeric = (up - down) / (double(saved + float(eps)) - double(saved - float(eps)));
    return std::fabs(numeric - grad[i]) / std::max(1e-2, std::fabs(numeric) + std::fabs(grad[i]));
  };
  int checked = 0;
  for (const TensorInfo& t : model->tensors()) {
    // Every element of small tensors, a random sample of 40 from larger ones.
    const size_t picks = std::min<size_t>(t.size(), 40);
    for (size_t k = 0; k < picks; ++k, ++checked) {
      const size_t i = t.offset + (t.size() <= 40 ? k : rng() % t.size());
      // A step can cross a ReLU or max-pool kink; a correct gradient then still agrees at a smaller step.
      const double err = std::min(error_at(i, 1e-3), error_at(i, 4e-4));
      EXPECT_LT(err, 2e-2) << kind << " " << t.name << "[" << i - t.offset << "]: analytic " << grad[i];
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(GradCheck, LogisticRegression) {
  check_gradient("logreg");
}
TEST(GradCheck, Mlp) {
  check_gradient("mlp");
}
TEST(GradCheck, Cnn) {
  check_gradient("cnn");
}

}  // namespace
}  // namespace lbbsp::models
