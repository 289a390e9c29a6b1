// CUDA backend vs the CPU models: loss, correct count and gradient sums agree to 1e-4 relative on random
// data, evaluate agrees, results are deterministic, and device selection works. Every test that needs a GPU
// skips (GTEST_SKIP, reported as skipped by ctest) when none is visible.
//
// Inputs and parameters are quantised to a few bits (x in {0, 1/4, 1/2, 3/4}, weights to a power-of-two step
// about 16 times below their spread) so every pre-activation that feeds a decision (ReLU sign, max-pool
// winner) is an exact float sum on both devices whatever the summation order. Otherwise a near-tie decided
// differently by a rounding difference would move a whole term of the gradient and make a 1e-4 comparison
// flaky.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cuda/cuda_models.hpp"
#include "models/model.hpp"
#include "models/optimizer.hpp"
#include "runtime/train/run_options.hpp"

namespace {

using namespace lbbsp::models;

constexpr double kRelTol = 1e-4;

// Empty when a GPU is visible, else why not.
std::string no_gpu_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
           cudaGetErrorString(err) + ")";
  }
  if (count == 0) return "cudaGetDeviceCount returned 0 devices";
  return "";
}

#define SKIP_WITHOUT_GPU()                                                          \
  do {                                                                              \
    const std::string why_no_gpu = no_gpu_reason();                                 \
    if (!why_no_gpu.empty()) GTEST_SKIP() << "no CUDA GPU visible: " << why_no_gpu; \
  } while (0)

struct Shape {
  std::string label;
  ModelConfig cfg;
};

ModelConfig config(const std::string& kind, InputShape input = {1, 28, 28}, int classes = 10,
                   std::vector<int> hidden = {256, 128}) {
  ModelConfig cfg;
  cfg.kind = kind;
  cfg.input = input;
  cfg.classes = classes;
  cfg.hidden = std::move(hidden);
  return cfg;
}

// The three models at the Fashion-MNIST shape, plus odd shapes that exercise layouts (3 input channels,
// height != width, more hidden layers, other class counts).
std::vector<Shape> shapes() {
  return {{"logreg", config("logreg")},
          {"mlp", config("mlp")},
          {"cnn", config("cnn")},
          {"mlp_3_hidden", config("mlp", {1, 6, 5}, 7, {32, 16, 8})},
          {"cnn_3x8x12", config("cnn", {3, 8, 12}, 5)}};
}

float quantise(double v, double step) {
  return float(std::round(v / step) * step);
}

// Initialised parameters quantised per tensor; biases (zero at init) get small random quantised values so
// their gradients matter.
std::vector<float> test_params(const Model& m, uint64_t seed) {
  std::vector<float> p(m.num_params());
  m.init_params(p.data(), seed);
  std::mt19937_64 rng(seed ^ 0x5bd1e995);
  for (const TensorInfo& t : m.tensors()) {
    float* v = p.data() + t.offset;
    double sq = 0.0;
    for (size_t i = 0; i < t.size(); ++i) sq += double(v[i]) * v[i];
    const double spread = std::sqrt(sq / double(t.size()));
    if (spread == 0.0) {
      std::uniform_int_distribution<int> level(-16, 16);
      for (size_t i = 0; i < t.size(); ++i) v[i] = float(level(rng)) / 64.0f;
      continue;
    }
    const double step = std::ldexp(1.0, -(int(std::ceil(-std::log2(spread))) + 4));
    for (size_t i = 0; i < t.size(); ++i) v[i] = quantise(v[i], step);
  }
  return p;
}

struct Batch {
  std::vector<float> x;
  std::vector<uint8_t> y;
};

Batch test_batch(const ModelConfig& cfg, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> level(0, 3), label(0, cfg.classes - 1);
  Batch b;
  b.x.resize(size_t(n) * cfg.input.size());
  b.y.resize(size_t(n));
  for (float& v : b.x) v = float(level(rng)) * 0.25f;
  for (uint8_t& v : b.y) v = uint8_t(label(rng));
  return b;
}

ModelConfig on(const ModelConfig& cfg, const std::string& device) {
  ModelConfig c = cfg;
  c.device = lbbsp::runtime::parse_enum<lbbsp::models::Device>("device", device);  // throws on "tpu"
  return c;
}

// Per tensor: max |got - want| <= kRelTol * max |want| (the tensor's scale; single entries can be ~0).
void expect_grad_close(const Model& m, const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what) {
  for (const TensorInfo& t : m.tensors()) {
    double scale = 0.0, worst = 0.0;
    size_t worst_at = 0;
    for (size_t i = t.offset; i < t.offset + t.size(); ++i) {
      scale = std::max(scale, std::fabs(double(want[i])));
      const double err = std::fabs(double(got[i]) - double(want[i]));
      if (err > worst) worst = err, worst_at = i - t.offset;
    }
    EXPECT_LE(worst, kRelTol * scale) << what << ": tensor " << t.name << " differs most at element "
                                      << worst_at << " (got " << got[t.offset + worst_at] << ", want "
                                      << want[t.offset + worst_at] << ", tensor scale " << scale << ")";
  }
}

void expect_loss_close(const StepStats& got, const StepStats& want, int n, const std::string& what) {
  EXPECT_NEAR(got.loss_sum, want.loss_sum, kRelTol * std::max(1.0, std::fabs(want.loss_sum))) << what;
  // Logits are not exact sums, so allow one arg-max near-tie in large batches; small ones must match exactly.
  EXPECT_LE(std::abs(got.correct - want.correct), n >= 64 ? 1 : 0) << what << ": correct counts differ";
}

class GpuVsCpu : public ::testing::TestWithParam<int> {};

TEST_P(GpuVsCpu, LossAndGradientAgree) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  for (const Shape& shape : shapes()) {
    SCOPED_TRACE(shape.label + " n=" + std::to_string(n));
    auto cpu = make_model(on(shape.cfg, "cpu"));
    auto gpu = make_model(on(shape.cfg, "cuda"));
    const std::vector<float> params = test_params(*cpu, 11);
    const Batch b = test_batch(shape.cfg, n, 100 + n);
    std::vector<float> g_cpu(cpu->num_params(), 0.0f), g_gpu(gpu->num_params(), 0.0f);
    const StepStats s_cpu = cpu->forward_backward(params.data(), b.x.data(), b.y.data(), n, g_cpu.data());
    const StepStats s_gpu = gpu->forward_backward(params.data(), b.x.data(), b.y.data(), n, g_gpu.data());
    expect_loss_close(s_gpu, s_cpu, n, shape.label);
    expect_grad_close(*cpu, g_gpu, g_cpu, shape.label);
    if (n == 0) {
      EXPECT_EQ(s_gpu.loss_sum, 0.0);
      EXPECT_EQ(s_gpu.correct, 0);
      EXPECT_TRUE(std::all_of(g_gpu.begin(), g_gpu.end(), [](float v) { return v == 0.0f; }));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Batches, GpuVsCpu, ::testing::Values(0, 1, 7, 64),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// 500 samples cross the CNN's im2col chunk for conv2 (kCudaConvWorkspaceBytes / 313,600 B = 428 samples).
TEST(GpuModels, CnnBatchAcrossIm2colChunks) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = config("cnn");
  const int n = 500;
  auto cpu = make_model(cfg);
  auto gpu = make_model(on(cfg, "cuda"));
  const std::vector<float> params = test_params(*cpu, 5);
  const Batch b = test_batch(cfg, n, 6);
  std::vector<float> g_cpu(cpu->num_params(), 0.0f), g_gpu(gpu->num_params(), 0.0f);
  const StepStats s_cpu = cpu->forward_backward(params.data(), b.x.data(), b.y.data(), n, g_cpu.data());
  const StepStats s_gpu = gpu->forward_backward(params.data(), b.x.data(), b.y.data(), n, g_gpu.data());
  expect_loss_close(s_gpu, s_cpu, n, "cnn n=500");
  expect_grad_close(*cpu, g_gpu, g_cpu, "cnn n=500");
}

// The gradient is ADDED into grad, and repeated calls (buffers reused, batch sizes changing) are
// bit-identical.
TEST(GpuModels, AddsIntoGradAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : shapes()) {
    SCOPED_TRACE(shape.label);
    auto gpu = make_model(on(shape.cfg, "cuda"));
    const std::vector<float> params = test_params(*gpu, 21);
    const Batch b = test_batch(shape.cfg, 33, 22);
    const Batch other = test_batch(shape.cfg, 70, 23);
    std::vector<float> g0(gpu->num_params(), 0.0f), g1(gpu->num_params(), 0.0f), scratch(gpu->num_params());
    const StepStats s0 = gpu->forward_backward(params.data(), b.x.data(), b.y.data(), 33, g0.data());
    gpu->forward_backward(params.data(), other.x.data(), other.y.data(), 70, scratch.data());
    std::vector<float> base(gpu->num_params());
    for (size_t i = 0; i < base.size(); ++i) base[i] = float(int(i % 7) - 3) * 0.125f;
    g1 = base;
    const StepStats s1 = gpu->forward_backward(params.data(), b.x.data(), b.y.data(), 33, g1.data());
    EXPECT_EQ(s1.loss_sum, s0.loss_sum);
    EXPECT_EQ(s1.correct, s0.correct);
    for (size_t i = 0; i < g1.size(); ++i) ASSERT_EQ(g1[i], base[i] + g0[i]) << "parameter " << i;
  }
}

// 1500 samples: more than one GPU evaluation chunk (1024) and several CPU ones (256).
TEST(GpuModels, EvaluateAgrees) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : shapes()) {
    SCOPED_TRACE(shape.label);
    auto cpu = make_model(shape.cfg);
    auto gpu = make_model(on(shape.cfg, "cuda"));
    const std::vector<float> params = test_params(*cpu, 31);
    for (int n : {0, 1, 1500}) {
      const Batch b = test_batch(shape.cfg, n, 32 + n);
      const StepStats s_cpu = cpu->evaluate(params.data(), b.x.data(), b.y.data(), n);
      const StepStats s_gpu = gpu->evaluate(params.data(), b.x.data(), b.y.data(), n);
      expect_loss_close(s_gpu, s_cpu, n, shape.label + " evaluate n=" + std::to_string(n));
    }
    // evaluate must not disturb the buffers of a following forward_backward.
    const Batch b = test_batch(shape.cfg, 9, 40);
    std::vector<float> g_cpu(cpu->num_params(), 0.0f), g_gpu(gpu->num_params(), 0.0f);
    cpu->forward_backward(params.data(), b.x.data(), b.y.data(), 9, g_cpu.data());
    gpu->forward_backward(params.data(), b.x.data(), b.y.data(), 9, g_gpu.data());
    expect_grad_close(*cpu, g_gpu, g_cpu, shape.label + " after evaluate");
  }
}

TEST(GpuModels, SameInterfaceAsCpuModel) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : shapes()) {
    SCOPED_TRACE(shape.label);
    auto cpu = make_model(shape.cfg);
    auto gpu = make_model(on(shape.cfg, "cuda"));
    EXPECT_EQ(gpu->name(), cpu->name());
    EXPECT_EQ(gpu->num_params(), cpu->num_params());
    EXPECT_EQ(gpu->flops_per_sample(), cpu->flops_per_sample());
    const auto tc = cpu->tensors(), tg = gpu->tensors();
    ASSERT_EQ(tg.size(), tc.size());
    for (size_t i = 0; i < tc.size(); ++i) {
      EXPECT_EQ(tg[i].name, tc[i].name);
      EXPECT_EQ(tg[i].offset, tc[i].offset);
      EXPECT_EQ(tg[i].shape, tc[i].shape);
    }
    std::vector<float> pc(cpu->num_params()), pg(gpu->num_params());
    cpu->init_params(pc.data(), 77);
    gpu->init_params(pg.data(), 77);
    EXPECT_EQ(pg, pc);
  }
}

TEST(GpuModels, RejectsBadLabels) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_model(on(config("mlp"), "cuda"));
  std::vector<float> params(gpu->num_params()), grad(gpu->num_params()), x(2 * 784, 0.5f);
  const std::vector<uint8_t> y = {3, 10};
  EXPECT_THROW(gpu->forward_backward(params.data(), x.data(), y.data(), 2, grad.data()), std::out_of_range);
  EXPECT_THROW(gpu->evaluate(params.data(), x.data(), y.data(), 2), std::out_of_range);
}

// ---- Device-resident training (DeviceResident: parameters, velocity and gradient stay on the GPU) ----

DeviceResident& resident_of(Model& gpu) {
  DeviceResident* r = device_resident(gpu);
  if (!r) throw std::logic_error("a CUDA model has no DeviceResident face");
  return *r;
}

// The resident step runs the same kernels as the host-pointer one: identical gradient and statistics,
// the extra floats after the gradient untouched, and n = 0 writes a zero gradient.
TEST(GpuResident, ForwardBackwardMatchesHostInterface) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : shapes()) {
    SCOPED_TRACE(shape.label);
    auto host_iface = make_model(on(shape.cfg, "cuda"));
    auto gpu = make_model(on(shape.cfg, "cuda"));
    DeviceResident& r = resident_of(*gpu);
    const size_t P = gpu->num_params(), extra = 5;
    r.enable_resident(extra, 0.9, 0.0);
    const std::vector<float> params = test_params(*gpu, 41);
    r.load_state(params.data(), nullptr);
    const std::vector<float> tail = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
    r.buffer_from_host(P, extra, tail.data());
    for (int n : {37, 0, 5}) {
      const Batch b = test_batch(shape.cfg, n, 42 + n);
      std::vector<float> want(P, 0.0f), got(P + extra, -1.0f);
      const StepStats s_want =
          host_iface->forward_backward(params.data(), b.x.data(), b.y.data(), n, want.data());
      const StepStats s_got = r.forward_backward_resident(b.x.data(), b.y.data(), n);
      r.buffer_to_host(0, P + extra, got.data());
      EXPECT_EQ(s_got.loss_sum, s_want.loss_sum) << "n=" << n;
      EXPECT_EQ(s_got.correct, s_want.correct) << "n=" << n;
      for (size_t i = 0; i < P; ++i) ASSERT_EQ(got[i], want[i]) << "n=" << n << " parameter " << i;
      for (size_t i = 0; i < extra; ++i) EXPECT_EQ(got[P + i], tail[i]) << "extra float " << i;
    }
    // evaluate_resident uses the device parameters.
    const Batch e = test_batch(shape.cfg, 1100, 43);
    const StepStats ev_want = host_iface->evaluate(params.data(), e.x.data(), e.y.data(), 1100);
    const StepStats ev_got = r.evaluate_resident(e.x.data(), e.y.data(), 1100);
    EXPECT_EQ(ev_got.loss_sum, ev_want.loss_sum);
    EXPECT_EQ(ev_got.correct, ev_want.correct);
  }
}

// The optimizer kernel against models::Sgd::step, the CPU reference, over several steps with weight decay,
// changing learning rates and a nonzero starting velocity; store_state returns parameters and velocity.
TEST(GpuResident, SgdStepMatchesCpuOptimizer) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = config("mlp", {1, 6, 5}, 7, {32, 16, 8});
  auto gpu = make_model(on(cfg, "cuda"));
  DeviceResident& r = resident_of(*gpu);
  const size_t P = gpu->num_params();
  const double momentum = 0.9, wd = 5e-4;
  r.enable_resident(3, momentum, wd);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> params(P), velocity(P), grad(P);
  for (auto& v : params) v = normal(rng);
  for (auto& v : velocity) v = 0.1f * normal(rng);
  Sgd cpu(P, momentum, wd);
  cpu.velocity() = velocity;
  std::vector<float> cpu_params = params;
  r.load_state(params.data(), velocity.data());
  for (int step = 0; step < 5; ++step) {
    for (auto& v : grad) v = 64.0f * normal(rng);
    const double lr = 0.1 / (step + 1);
    cpu.step(cpu_params.data(), grad.data(), 64, lr);
    r.buffer_from_host(0, P, grad.data());
    r.sgd_step(64, lr);
  }
  std::vector<float> got_p(P), got_v(P);
  r.store_state(got_p.data(), got_v.data());
  for (size_t i = 0; i < P; ++i) {
    // Only fused multiply-adds can differ: a few ulps after 5 steps.
    ASSERT_NEAR(got_p[i], cpu_params[i], 1e-6 * std::max(1.0f, std::fabs(cpu_params[i])))
        << "parameter " << i;
    ASSERT_NEAR(got_v[i], cpu.velocity()[i], 1e-6 * std::max(1.0f, std::fabs(cpu.velocity()[i])))
        << "velocity " << i;
  }
}

// A few full steps (forward, backward, SGD) on the device agree with the CPU model and optimizer.
TEST(GpuResident, TrainingStepsTrackTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : shapes()) {
    SCOPED_TRACE(shape.label);
    auto cpu = make_model(shape.cfg);
    auto gpu = make_model(on(shape.cfg, "cuda"));
    DeviceResident& r = resident_of(*gpu);
    const size_t P = cpu->num_params();
    r.enable_resident(0, 0.9, 0.0);
    std::vector<float> params = test_params(*cpu, 51);
    r.load_state(params.data(), nullptr);
    Sgd sgd(P, 0.9, 0.0);
    for (int step = 0; step < 3; ++step) {
      const Batch b = test_batch(shape.cfg, 16, 52 + step);
      std::vector<float> g(P, 0.0f);
      const StepStats s_cpu = cpu->forward_backward(params.data(), b.x.data(), b.y.data(), 16, g.data());
      const StepStats s_gpu = r.forward_backward_resident(b.x.data(), b.y.data(), 16);
      expect_loss_close(s_gpu, s_cpu, 16, "step " + std::to_string(step));
      sgd.step(params.data(), g.data(), 16, 0.01);
      r.sgd_step(16, 0.01);
    }
    std::vector<float> got(P);
    r.store_state(got.data(), nullptr);
    expect_grad_close(*cpu, got, params, "parameters after 3 steps");
  }
}

TEST(GpuResident, MisuseIsRejected) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_model(on(config("logreg"), "cuda"));
  DeviceResident& r = resident_of(*gpu);
  std::vector<float> host(gpu->num_params() + 4);
  EXPECT_THROW(r.sgd_step(8, 0.1), std::logic_error);  // before enable_resident
  EXPECT_THROW(r.enable_resident(0, 1.0, 0.0), std::invalid_argument);
  EXPECT_THROW(r.enable_resident(0, 0.9, -1.0), std::invalid_argument);
  r.enable_resident(2, 0.9, 0.0);
  EXPECT_THROW(r.buffer_to_host(gpu->num_params(), 3, host.data()), std::out_of_range);
  EXPECT_THROW(r.buffer_from_host(gpu->num_params() + 3, 0, host.data()), std::out_of_range);
  EXPECT_NO_THROW(r.buffer_to_host(gpu->num_params(), 2, host.data()));
  EXPECT_THROW(r.sgd_step(0, 0.1), std::invalid_argument);
  auto cpu = make_model(config("logreg"));
  EXPECT_EQ(device_resident(*cpu), nullptr);
}

TEST(GpuDevice, SelectsLocalRankModuloDeviceCount) {
  SKIP_WITHOUT_GPU();
  const int count = cuda_device_count();
  ASSERT_GT(count, 0);
  for (int rank = 0; rank < 2 * count + 1; ++rank) {
    EXPECT_EQ(select_cuda_device(rank), rank % count);
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, rank % count);
  }
  EXPECT_THROW(select_cuda_device(-1), std::invalid_argument);
  select_cuda_device(0);
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  const size_t reported = cuda_free_bytes();
  EXPECT_GT(reported, 0u);
  EXPECT_LE(reported, total);
}

// The memory cap's per-sample size is honest: the model's growth from n to 2n samples stays within
// n * per_sample_bytes plus the fixed im2col workspace (which grows with the batch up to its cap) and
// allocation rounding.
TEST(GpuDevice, PerSampleBytesCoversTheGrowth) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : shapes()) {
    SCOPED_TRACE(shape.label);
    auto gpu = make_model(on(shape.cfg, "cuda"));
    const std::vector<float> params = test_params(*gpu, 1);
    std::vector<float> grad(gpu->num_params());
    const int n = 256;
    const Batch small = test_batch(shape.cfg, n, 2), large = test_batch(shape.cfg, 2 * n, 3);
    gpu->forward_backward(params.data(), small.x.data(), small.y.data(), n, grad.data());
    const size_t before = cuda_free_bytes();
    gpu->forward_backward(params.data(), large.x.data(), large.y.data(), 2 * n, grad.data());
    const size_t after = cuda_free_bytes();
    const size_t grown = before > after ? before - after : 0;
    EXPECT_LE(grown, size_t(n) * per_sample_bytes(shape.cfg) + kCudaConvWorkspaceBytes + (size_t(8) << 20))
        << "per_sample_bytes " << per_sample_bytes(shape.cfg);
  }
}

// Host-only: no GPU needed.
TEST(GpuDevice, PerSampleBytesIsPlausible) {
  EXPECT_GT(per_sample_bytes(config("logreg")), 784u * 4);
  EXPECT_GT(per_sample_bytes(config("mlp")), per_sample_bytes(config("logreg")));
  EXPECT_GT(per_sample_bytes(config("mlp", {1, 28, 28}, 10, {1024})), per_sample_bytes(config("mlp")));
  // The CNN keeps 16 and 32 channel maps: far more per sample than the MLP.
  EXPECT_GT(per_sample_bytes(config("cnn")), 10 * per_sample_bytes(config("mlp")));
  EXPECT_THROW(per_sample_bytes(config("resnet")), std::invalid_argument);
}

TEST(GpuDevice, UnknownDeviceIsRejected) {
  EXPECT_THROW(make_model(on(config("mlp"), "tpu")), std::invalid_argument);
}

}  // namespace
