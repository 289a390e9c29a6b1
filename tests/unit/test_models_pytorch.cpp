// Our models against PyTorch (float64) on tiny cases: tests/fixtures/models_pytorch_reference.json, written
// by dev/peers/pytorch_reference.py from the same closed-form parameters and inputs as below. This pins
// the architecture itself (cross-correlation, padding, pooling, flatten order), which reference-vs-fast
// kernel tests and finite differences cannot.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/model.hpp"

namespace lbbsp::models {
namespace {

// The same formulas are in dev/peers/pytorch_reference.py.
double param_value(size_t i) {
  return 0.2 * std::sin(0.7 * double(i) + 0.1);
}
double input_value(size_t i) {
  return 0.5 + 0.5 * std::sin(0.1 * double(i) + 0.3);
}
int label_value(int s, int classes) {
  return (3 * s + 1) % classes;
}

nlohmann::json load_fixture() {
  const std::string path = std::string(LBBSP_SOURCE_DIR) + "/tests/fixtures/models_pytorch_reference.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

TEST(PyTorchReference, LossCorrectAndGradientsMatch) {
  const nlohmann::json fixture = load_fixture();
  ASSERT_EQ(fixture.at("cases").size(), 3u);
  for (const nlohmann::json& c : fixture.at("cases")) {
    ModelConfig cfg;
    cfg.kind = c.at("kind").get<std::string>();
    const auto dims = c.at("input").get<std::vector<int>>();
    cfg.input = {dims.at(0), dims.at(1), dims.at(2)};
    cfg.classes = c.at("classes").get<int>();
    cfg.hidden = c.at("hidden").get<std::vector<int>>();
    const int n = c.at("n").get<int>();
    auto model = make_model(cfg);
    ASSERT_EQ(model->num_params(), c.at("num_params").get<size_t>()) << cfg.kind;

    std::vector<float> params(model->num_params()), grad(params.size(), 0.0f),
        x(size_t(n) * cfg.input.size());
    std::vector<uint8_t> y(n);
    for (size_t i = 0; i < params.size(); ++i) params[i] = float(param_value(i));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(input_value(i));
    for (int s = 0; s < n; ++s) y[s] = uint8_t(label_value(s, cfg.classes));
    const StepStats stats = model->forward_backward(params.data(), x.data(), y.data(), n, grad.data());

    const double loss = c.at("loss_sum").get<double>();
    EXPECT_NEAR(stats.loss_sum, loss, 1e-5 * std::fabs(loss)) << cfg.kind;
    EXPECT_EQ(stats.correct, c.at("correct").get<int64_t>()) << cfg.kind;
    // float32 against float64: errors relative to the gradient's scale.
    const auto sample = c.at("grad_sample").get<std::vector<double>>();
    const auto stride = c.at("grad_stride").get<size_t>();
    double scale = 1e-3, abs_sum = 0.0;
    for (double v : sample) scale = std::max(scale, std::fabs(v));
    for (float g : grad) abs_sum += std::fabs(g);
    ASSERT_EQ(sample.size(), (grad.size() + stride - 1) / stride) << cfg.kind;
    for (size_t j = 0; j < sample.size(); ++j)
      EXPECT_NEAR(grad[j * stride], sample[j], 1e-4 * scale) << cfg.kind << " gradient entry " << j * stride;
    EXPECT_NEAR(abs_sum, c.at("grad_abs_sum").get<double>(), 1e-4 * abs_sum) << cfg.kind;
  }
}

}  // namespace
}  // namespace lbbsp::models
