// Model contract: factory checks, parameter layout, deterministic init, sum-not-mean gradients, determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>

#include "models/init.hpp"
#include "models/model.hpp"
#include "models/simd.hpp"
#include "test_models_util.hpp"

namespace lbbsp::models {
namespace {

using testing::all_close;
using testing::random_floats;
using testing::random_labels;

ModelConfig config(const std::string& kind, InputShape input = {1, 28, 28}) {
  ModelConfig cfg;
  cfg.kind = kind;
  cfg.input = input;
  return cfg;
}

// A model, its initialised parameters and a random MNIST-like batch.
struct Fixture {
  explicit Fixture(const ModelConfig& cfg, int n, uint64_t seed = 3) : model(make_model(cfg)), n(n) {
    params.resize(model->num_params());
    model->init_params(params.data(), seed);
    std::mt19937_64 rng(seed + 100);
    x = random_floats(size_t(n) * cfg.input.size(), rng, 0.0f, 1.0f);
    y = random_labels(n, cfg.classes, rng);
  }
  // Gradient sum and stats over samples [begin, begin + count).
  std::pair<std::vector<float>, StepStats> grad(int begin, int count) {
    std::vector<float> g(params.size(), 0.0f);
    const StepStats s = model->forward_backward(params.data(), x.data() + size_t(begin) * (x.size() / n),
                                                y.data() + begin, count, g.data());
    return {g, s};
  }
  std::unique_ptr<Model> model;
  int n;
  std::vector<float> params, x;
  std::vector<uint8_t> y;
};

const char* const kKinds[] = {"logreg", "mlp", "cnn"};

TEST(ModelFactory, ParameterCountsAndLayout) {
  EXPECT_EQ(make_model(config("logreg"))->num_params(), 784u * 10 + 10);
  EXPECT_EQ(make_model(config("mlp"))->num_params(), 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(make_model(config("cnn"))->num_params(), 16u * 25 + 16 + 32 * 400 + 32 + 10 * 1568 + 10);
  for (const char* kind : kKinds) {
    auto model = make_model(config(kind));
    EXPECT_EQ(model->name(), kind);
    size_t next = 0;
    std::set<std::string> names;
    for (const TensorInfo& t : model->tensors()) {
      EXPECT_EQ(t.offset, next) << kind << " " << t.name << ": tensors must tile the buffer in order";
      next += t.size();
      EXPECT_TRUE(names.insert(t.name).second) << "duplicate tensor name " << t.name;
    }
    EXPECT_EQ(next, model->num_params()) << kind;
    EXPECT_GT(model->flops_per_sample(), 0.0);
  }
  ModelConfig wide = config("mlp", {3, 8, 8});
  wide.hidden = {5};
  wide.classes = 4;
  EXPECT_EQ(make_model(wide)->num_params(), 192u * 5 + 5 + 5 * 4 + 4);
  EXPECT_EQ((TensorInfo{"t", 0, {2, 3, 4}}).size(), 24u);
}

// The exception type and a message fragment naming the problem.
template <typename Exception>
void expect_throw_naming(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming '" << fragment << "'";
  } catch (const Exception& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(ModelFactory, RejectsBadConfigs) {
  expect_throw_naming<std::invalid_argument>([] { make_model(config("resnet")); }, "resnet");
  expect_throw_naming<std::invalid_argument>(
      [] {
        make_model(config("cnn", {1, 30, 28}));
      },
      "divisible by 4");
  expect_throw_naming<std::invalid_argument>([] { make_model(config("mlp", {0, 28, 28})); }, "input");
  ModelConfig zero_width = config("mlp");
  zero_width.hidden = {64, 0};
  expect_throw_naming<std::invalid_argument>([&] { make_model(zero_width); }, "hidden");
  ModelConfig one_class = config("logreg");
  one_class.classes = 1;
  expect_throw_naming<std::invalid_argument>([&] { make_model(one_class); }, "classes");
  EXPECT_NO_THROW(make_model(config("cnn", {3, 32, 12})));
}

TEST(ModelInit, DeterministicPerSeedWithHeScale) {
  for (const char* kind : kKinds) {
    auto model = make_model(config(kind));
    std::vector<float> a(model->num_params()), b(a.size()), c(a.size());
    model->init_params(a.data(), 42);
    model->init_params(b.data(), 42);
    model->init_params(c.data(), 43);
    EXPECT_EQ(a, b) << kind;
    EXPECT_NE(a, c) << kind;
  }
  // fc1 of the default MLP: He normal, std sqrt(2 / 784); biases zero.
  auto mlp = make_model(config("mlp"));
  std::vector<float> p(mlp->num_params());
  mlp->init_params(p.data(), 1);
  const TensorInfo w = mlp->tensors()[0], bias = mlp->tensors()[1];
  double sum = 0, sq = 0;
  for (size_t i = 0; i < w.size(); ++i)
    sum += p[w.offset + i], sq += double(p[w.offset + i]) * p[w.offset + i];
  const double mean = sum / double(w.size()), sd = std::sqrt(sq / double(w.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(sd, std::sqrt(2.0 / 784.0), 0.01 * std::sqrt(2.0 / 784.0));
  for (size_t i = 0; i < bias.size(); ++i) EXPECT_EQ(p[bias.offset + i], 0.0f);
}

TEST(ModelInit, BoxMullerIsPinned) {
  // Our generator is specified (mt19937_64 + Box-Muller), so these values hold on every platform.
  NormalRng rng(2024);
  std::vector<double> v(4);
  for (double& x : v) x = rng.next();
  std::mt19937_64 engine(2024);
  const double u1 = 1.0 - double(engine() >> 11) * 0x1.0p-53, u2 = double(engine() >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  EXPECT_DOUBLE_EQ(v[0], r * std::cos(2.0 * M_PI * u2));
  EXPECT_DOUBLE_EQ(v[1], r * std::sin(2.0 * M_PI * u2));
  NormalRng many(7);
  double sum = 0, sq = 0;
  const int count = 200000;
  for (int i = 0; i < count; ++i) {
    const double x = many.next();
    sum += x, sq += x * x;
  }
  EXPECT_NEAR(sum / count, 0.0, 0.01);
  EXPECT_NEAR(sq / count, 1.0, 0.01);
}

TEST(ModelStep, EmptySliceIsANoOp) {
  for (const char* kind : kKinds) {
    Fixture f(config(kind), 1);
    std::vector<float> g(f.params.size(), 0.5f);
    const StepStats s = f.model->forward_backward(f.params.data(), nullptr, nullptr, 0, g.data());
    EXPECT_EQ(s.loss_sum, 0.0);
    EXPECT_EQ(s.correct, 0);
    EXPECT_EQ(g, std::vector<float>(f.params.size(), 0.5f)) << kind;
    EXPECT_EQ(f.model->evaluate(f.params.data(), nullptr, nullptr, 0).correct, 0);
  }
}

TEST(ModelStep, GradientIsASumOverSamples) {
  // grad(A u B) == grad(A) + grad(B): the invariant that lets ranks add slice gradients of any size.
  for (const char* kind : kKinds) {
    Fixture f(config(kind), 11);
    auto [whole, s_whole] = f.grad(0, 11);
    auto [a, s_a] = f.grad(0, 4);
    auto [b, s_b] = f.grad(4, 7);
    std::vector<float> parts(a.size());
    for (size_t i = 0; i < a.size(); ++i) parts[i] = a[i] + b[i];
    EXPECT_TRUE(all_close(parts, whole, 1e-5)) << kind;
    EXPECT_NEAR(s_a.loss_sum + s_b.loss_sum, s_whole.loss_sum, 1e-5 * s_whole.loss_sum) << kind;
    EXPECT_EQ(s_a.correct + s_b.correct, s_whole.correct) << kind;
    // A sum, not a mean: the one-sample gradients add up to the whole-batch one too.
    std::vector<float> singles(a.size(), 0.0f);
    for (int i = 0; i < 11; ++i)
      f.model->forward_backward(f.params.data(), f.x.data() + i * (f.x.size() / 11), f.y.data() + i, 1,
                                singles.data());
    EXPECT_TRUE(all_close(singles, whole, 1e-5)) << kind;
    // evaluate agrees with the training forward pass.
    const StepStats e = f.model->evaluate(f.params.data(), f.x.data(), f.y.data(), 11);
    EXPECT_NEAR(e.loss_sum, s_whole.loss_sum, 1e-6 * s_whole.loss_sum);
    EXPECT_EQ(e.correct, s_whole.correct);
  }
}

// Same thread count => same bits (what the distributed invariant needs: a rank's slice result is
// reproducible). Different thread counts may differ in the last bits: OpenBLAS's split of a GEMM changes its
// kernel tails.
TEST(ModelStep, BitIdenticalForTheSameThreadCount) {
  for (const char* kind : kKinds) {
    Fixture f(config(kind), 70);  // large enough for the parallel paths and several conv chunks
    set_num_threads(1);
    auto [g1, s1] = f.grad(0, 70);
    auto [g1_again, s1_again] = f.grad(0, 70);
    Fixture other(config(kind), 70);
    auto [g_other, s_other] = other.grad(0, 70);
    set_num_threads(2);
    EXPECT_EQ(num_threads(), 2);
    auto [g2, s2] = f.grad(0, 70);
    auto [g2_again, s2_again] = f.grad(0, 70);
    EXPECT_EQ(g1, g1_again) << kind;
    EXPECT_EQ(s1.loss_sum, s1_again.loss_sum) << kind;
    EXPECT_EQ(g1, g_other) << kind;
    EXPECT_EQ(s1.loss_sum, s_other.loss_sum) << kind;
    EXPECT_EQ(g2, g2_again) << kind;
    // Across thread counts only closeness holds, and only in norm: a last-bit change can flip a max-pool or
    // ReLU decision and reroute one pixel's gradient.
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < g1.size(); ++i) diff += std::pow(g1[i] - g2[i], 2), norm += std::pow(g1[i], 2);
    EXPECT_LT(std::sqrt(diff), 1e-3 * std::sqrt(norm)) << kind;
    EXPECT_NEAR(s1.loss_sum, s2.loss_sum, 1e-6 * s1.loss_sum) << kind;
  }
  EXPECT_THROW(set_num_threads(0), std::invalid_argument);
}

// The CNN's vector convolutions sum every output element on one thread in a fixed order
// (models/conv_simd.cpp), its fc layer is below gemm's split size at 28x28, and its micro-batches' gradients
// are added in a fixed order: its gradient is the same bits for 1 thread, 2, 3 and 8 (70 samples = 5
// micro-batches, each thread running whole ones; at 8 threads five run one each). (A portable build's im2col
// GEMMs are split by rows: there only closeness in norm holds.)
TEST(ModelStep, CnnGradientDoesNotDependOnTheThreadCount) {
  Fixture f(config("cnn"), 70);
  set_num_threads(1);
  auto [g1, s1] = f.grad(0, 70);
  for (int threads : {2, 3, 8}) {
    set_num_threads(threads);
    auto [g, s] = f.grad(0, 70);
#ifdef LBBSP_SIMD_LANES
    EXPECT_EQ(g, g1) << threads << " threads";
    EXPECT_EQ(s.loss_sum, s1.loss_sum) << threads << " threads";
#else
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < g1.size(); ++i) diff += std::pow(g1[i] - g[i], 2), norm += std::pow(g1[i], 2);
    EXPECT_LT(std::sqrt(diff), 1e-3 * std::sqrt(norm)) << threads << " threads";
#endif
  }
  set_num_threads(1);
}

// The gradient of the fixture's first n samples at `threads` threads (left set).
auto grad_at_threads(Fixture& f, int n, int threads) {
  set_num_threads(threads);
  return f.grad(0, n);
}

// One sample is one micro-batch: it runs on one thread (its layers are not split over the others), gives the
// bits of a 1-thread run, and leaves the thread count as it was.
TEST(ModelStep, CnnSingleSampleRunsOnOneThreadAndKeepsTheThreadCount) {
  Fixture f(config("cnn"), 1);
  auto [g1, s1] = grad_at_threads(f, 1, 1);
  auto [g2, s2] = grad_at_threads(f, 1, 2);
  EXPECT_EQ(omp_get_max_threads(), 2);
  set_num_threads(1);
#ifdef LBBSP_SIMD_LANES
  EXPECT_EQ(g2, g1);
  EXPECT_EQ(s2.loss_sum, s1.loss_sum);
#endif
}

// A slice above the CNN's group size (1,024 samples) runs as several groups of micro-batches, one after
// another: still the same bits for any thread count.
TEST(ModelStep, CnnLargeSliceDoesNotDependOnTheThreadCount) {
  Fixture f(config("cnn"), 1100);
  auto [g1, s1] = grad_at_threads(f, 1100, 1);
  auto [g2, s2] = grad_at_threads(f, 1100, 2);
  set_num_threads(1);
#ifdef LBBSP_SIMD_LANES
  EXPECT_EQ(g2, g1);
  EXPECT_EQ(s2.loss_sum, s1.loss_sum);
#else
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < g1.size(); ++i) diff += std::pow(g1[i] - g2[i], 2), norm += std::pow(g1[i], 2);
  EXPECT_LT(std::sqrt(diff), 1e-3 * std::sqrt(norm));
#endif
}

TEST(ModelStep, EvaluateSumsOverChunks) {
  // 600 samples: evaluation runs in several internal chunks; the sums must match the per-slice sums.
  for (const char* kind : kKinds) {
    Fixture f(config(kind, {1, 8, 8}), 600);
    const StepStats whole = f.model->evaluate(f.params.data(), f.x.data(), f.y.data(), 600);
    StepStats parts;
    for (int s0 = 0; s0 < 600; s0 += 100) {
      const StepStats p = f.model->evaluate(f.params.data(), f.x.data() + s0 * 64, f.y.data() + s0, 100);
      parts.loss_sum += p.loss_sum;
      parts.correct += p.correct;
    }
    EXPECT_NEAR(whole.loss_sum, parts.loss_sum, 1e-6 * parts.loss_sum)
        << kind;  // GEMM rounding varies with M
    EXPECT_EQ(whole.correct, parts.correct) << kind;
  }
}

TEST(ModelStep, MemorisesASmallBatch) {
  // Plain gradient steps must fit 16 random samples (catches sign and scale errors end to end).
  for (const char* kind : kKinds) {
    Fixture f(config(kind, {1, 8, 8}), 16);
    const double before = f.model->evaluate(f.params.data(), f.x.data(), f.y.data(), 16).loss_sum;
    for (int it = 0; it < 40; ++it) {
      auto [g, s] = f.grad(0, 16);
      for (size_t i = 0; i < g.size(); ++i) f.params[i] -= 0.5f * g[i] / 16.0f;
    }
    const double after = f.model->evaluate(f.params.data(), f.x.data(), f.y.data(), 16).loss_sum;
    EXPECT_LT(after, 0.5 * before) << kind;
  }
}

TEST(ModelStep, RejectsBadLabelsBeforeTouchingTheGradient) {
  for (const char* kind : kKinds) {
    Fixture f(config(kind), 3);
    f.y[2] = 10;
    std::vector<float> g(f.params.size(), 0.0f);
    try {
      f.model->forward_backward(f.params.data(), f.x.data(), f.y.data(), 3, g.data());
      ADD_FAILURE() << kind << ": label 10 accepted";
    } catch (const std::out_of_range& e) {
      EXPECT_NE(std::string(e.what()).find("label 10"), std::string::npos) << e.what();
    }
    EXPECT_EQ(g, std::vector<float>(g.size(), 0.0f));
    EXPECT_THROW(f.model->evaluate(f.params.data(), f.x.data(), f.y.data(), 3), std::out_of_range);
  }
}

}  // namespace
}  // namespace lbbsp::models
