// Google Benchmark of every model kernel and of a full train step (forward_backward + Sgd::step) per model.
// Extra flag: --threads=N (default 1) sets our OpenMP threads, as the trainer's --threads does (the BLAS runs
// one thread per call: docs/threads.md). Train steps are named train_step/<model>/<batch>; items_per_second
// is samples/s, GFLOP/s uses Model::flops_per_sample (GEMM work of forward + backward).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "models/activation.hpp"
#include "models/conv.hpp"
#include "models/dense.hpp"
#include "models/gemm.hpp"
#include "models/model.hpp"
#include "models/optimizer.hpp"
#include "models/pool.hpp"
#include "models/simd.hpp"
#include "models/softmax_xent.hpp"
#include "runtime/platform/kernel_env.hpp"

namespace lbbsp::models {
namespace {

std::vector<float> random_floats(size_t count, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> random_labels(size_t count, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(count);
  for (uint8_t& y : v) y = uint8_t(rng() % classes);
  return v;
}

void set_rates(benchmark::State& state, int64_t samples_per_iter, double flops_per_iter) {
  state.SetItemsProcessed(state.iterations() * samples_per_iter);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iter * double(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// idle_us > 0: that long outside the timing before each step, the main thread polling as Open MPI's allreduce
// does: the other kernel threads have gone to sleep by then and the step's first parallel loop wakes them.
void train_step(benchmark::State& state, const std::string& kind, int idle_us) {
  const int batch = int(state.range(0));
  ModelConfig cfg;
  cfg.kind = kind;
  auto model = make_model(cfg);
  std::vector<float> params(model->num_params()), grad(params.size());
  model->init_params(params.data(), 1);
  const auto x = random_floats(size_t(batch) * cfg.input.size(), 2, 0.0f, 1.0f);
  const auto y = random_labels(batch, cfg.classes, 3);
  Sgd sgd(params.size(), 0.9, 5e-4);
  for (auto _ : state) {
    if (idle_us > 0) {
      state.PauseTiming();
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(idle_us);
      while (std::chrono::steady_clock::now() < until) {
      }
      state.ResumeTiming();
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    const StepStats s = model->forward_backward(params.data(), x.data(), y.data(), batch, grad.data());
    sgd.step(params.data(), grad.data(), batch, 0.01);
    benchmark::DoNotOptimize(s);
    benchmark::ClobberMemory();
  }
  set_rates(state, batch, model->flops_per_sample() * batch);
}

// Kernels at the shapes of the default models, batch 64.
constexpr int kBatch = 64;

void dense_forward_bench(benchmark::State& state) {
  const int in = 784, out = 256;
  const auto x = random_floats(size_t(kBatch) * in, 1), w = random_floats(size_t(out) * in, 2),
             b = random_floats(out, 3);
  std::vector<float> y(size_t(kBatch) * out);
  for (auto _ : state) {
    dense_forward(x.data(), w.data(), b.data(), y.data(), kBatch, in, out, true);
    benchmark::ClobberMemory();
  }
  set_rates(state, kBatch, 2.0 * in * out * kBatch);
}

void dense_backward_bench(benchmark::State& state) {
  const int in = 784, out = 256;
  const auto x = random_floats(size_t(kBatch) * in, 1), w = random_floats(size_t(out) * in, 2),
             dy = random_floats(size_t(kBatch) * out, 3);
  std::vector<float> dw(w.size()), db(out), dx(x.size());
  for (auto _ : state) {
    dense_backward(x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), kBatch, in, out);
    benchmark::ClobberMemory();
  }
  set_rates(state, kBatch, 4.0 * in * out * kBatch);
}

ConvShape conv_shape(int layer) {
  return layer == 1 ? ConvShape{kBatch, 28, 28, 1, 16, 5, true} : ConvShape{kBatch, 14, 14, 16, 32, 5, false};
}

void conv_forward_bench(benchmark::State& state) {
  const ConvShape s = conv_shape(int(state.range(0)));
  const auto x = random_floats(size_t(s.n) * s.input_size(), 1),
             w = random_floats(size_t(s.out_channels) * s.col_width(), 2);
  std::vector<float> y(size_t(s.n) * s.output_size());
  ConvWorkspace ws;
  for (auto _ : state) {
    conv2d_forward(s, x.data(), w.data(), y.data(), ws);
    benchmark::ClobberMemory();
  }
  set_rates(state, s.n, 2.0 * double(s.output_size()) * s.col_width() * s.n);
}

void conv_backward_bench(benchmark::State& state) {
  const ConvShape s = conv_shape(int(state.range(0)));
  const bool with_dx = state.range(0) != 1;  // as in the CNN: the first layer needs no input gradient
  const auto x = random_floats(size_t(s.n) * s.input_size(), 1),
             w = random_floats(size_t(s.out_channels) * s.col_width(), 2),
             dy = random_floats(size_t(s.n) * s.output_size(), 3);
  std::vector<float> dw(w.size()), dx(x.size());
  ConvWorkspace ws;
  for (auto _ : state) {
    conv2d_backward(s, x.data(), w.data(), dy.data(), dw.data(), with_dx ? dx.data() : nullptr, ws);
    benchmark::ClobberMemory();
  }
  set_rates(state, s.n, (with_dx ? 4.0 : 2.0) * double(s.output_size()) * s.col_width() * s.n);
}

void maxpool_forward_bench(benchmark::State& state) {
  const int h = 28, w = 28, c = 16;
  const auto x = random_floats(size_t(kBatch) * h * w * c, 1);
  std::vector<float> y(x.size() / 4);
  std::vector<uint8_t> idx(y.size());
  for (auto _ : state) {
    maxpool2x2_forward(x.data(), y.data(), idx.data(), kBatch, h, w, c);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetBytesProcessed(state.iterations() * int64_t(x.size() + y.size()) * 4);
}

void maxpool_backward_bench(benchmark::State& state) {
  const int h = 28, w = 28, c = 16;
  const auto dy = random_floats(size_t(kBatch) * h * w * c / 4, 1);
  const std::vector<uint8_t> idx(dy.size(), 1);
  std::vector<float> dx(dy.size() * 4);
  for (auto _ : state) {
    maxpool2x2_backward(dy.data(), idx.data(), dx.data(), kBatch, h, w, c);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetBytesProcessed(state.iterations() * int64_t(dx.size() + dy.size()) * 4);
}

void bias_relu_bench(benchmark::State& state) {
  const int rows = kBatch * 14 * 14, channels = 16;
  auto y = random_floats(size_t(rows) * channels, 1);
  const auto b = random_floats(channels, 2);
  for (auto _ : state) {
    bias_relu_forward(y.data(), b.data(), rows, channels, true);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetBytesProcessed(state.iterations() * int64_t(y.size()) * 8);
}

void relu_backward_bench(benchmark::State& state) {
  const size_t count = size_t(kBatch) * 14 * 14 * 16;
  const auto y = random_floats(count, 1);
  auto dy = random_floats(count, 2);
  for (auto _ : state) {
    relu_backward(y.data(), dy.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetBytesProcessed(state.iterations() * int64_t(count) * 12);
}

void bias_backward_bench(benchmark::State& state) {
  const int rows = kBatch * 14 * 14, channels = 16;
  const auto dy = random_floats(size_t(rows) * channels, 1);
  std::vector<float> db(channels);
  for (auto _ : state) {
    bias_backward(dy.data(), db.data(), rows, channels);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetBytesProcessed(state.iterations() * int64_t(dy.size()) * 4);
}

void softmax_xent_bench(benchmark::State& state) {
  const int classes = 10;
  const auto logits = random_floats(size_t(kBatch) * classes, 1, -5.0f, 5.0f);
  const auto labels = random_labels(kBatch, classes, 2);
  std::vector<float> g(logits.size());
  for (auto _ : state) {
    benchmark::DoNotOptimize(softmax_xent(logits.data(), labels.data(), kBatch, classes, g.data()));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void sgd_step_bench(benchmark::State& state) {
  const size_t count = 235146;  // the default MLP
  auto w = random_floats(count, 1);
  const auto g = random_floats(count, 2);
  Sgd sgd(count, 0.9, 5e-4);
  for (auto _ : state) {
    sgd.step(w.data(), g.data(), kBatch, 1e-6);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * int64_t(count) * 16);
}

// The core's practical FMA peak on the build's vector unit: 12 independent multiply-add chains in registers
// (enough to cover 2 pipes x 4-5 cycles of latency), nothing from memory. "of peak" in bench_vs_pytorch.sh
// uses it.
void fma_peak_bench(benchmark::State& state) {
#ifdef LBBSP_SIMD_LANES
  constexpr int kChains = 12, kRepeats = 4096;
  simd::Vec acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = simd::zero();
  const float a_value = 0.999f, b_value = 1e-3f;
  const simd::Vec a = simd::broadcast(&a_value), b = simd::broadcast(&b_value);
  for (auto _ : state) {
    for (int i = 0; i < kRepeats; ++i) {
      _Pragma("GCC unroll 12") for (int j = 0; j < kChains; ++j) acc[j] = simd::fmadd(acc[j], a, b);
    }
    benchmark::DoNotOptimize(acc);
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kChains * kRepeats * simd::kLanes * double(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
#else
  state.SkipWithError("portable build: no vector unit to measure");
#endif
}

// With one thread, rates use process CPU time (robust on a shared machine; it matches the PyTorch peer's
// process_time); with more, wall time (CPU time would add the threads up), and cpu_time is that sum.
void register_all(int threads) {
  benchmark::RegisterBenchmark("kernel/dense_forward_relu/64x784x256", dense_forward_bench);
  benchmark::RegisterBenchmark("kernel/dense_backward/64x784x256", dense_backward_bench);
  benchmark::RegisterBenchmark("kernel/conv_forward", conv_forward_bench)->ArgName("layer")->Arg(1)->Arg(2);
  benchmark::RegisterBenchmark("kernel/conv_backward", conv_backward_bench)->ArgName("layer")->Arg(1)->Arg(2);
  benchmark::RegisterBenchmark("kernel/maxpool_forward/64x28x28x16", maxpool_forward_bench);
  benchmark::RegisterBenchmark("kernel/maxpool_backward/64x28x28x16", maxpool_backward_bench);
  benchmark::RegisterBenchmark("kernel/bias_relu/64x14x14x16", bias_relu_bench);
  benchmark::RegisterBenchmark("kernel/relu_backward/64x14x14x16", relu_backward_bench);
  benchmark::RegisterBenchmark("kernel/bias_backward/64x14x14x16", bias_backward_bench);
  benchmark::RegisterBenchmark("kernel/softmax_xent/64x10", softmax_xent_bench);
  benchmark::RegisterBenchmark("kernel/sgd_step/235146", sgd_step_bench);
  benchmark::RegisterBenchmark("peak/fma", fma_peak_bench)->MeasureProcessCPUTime();
  for (const char* kind : {"logreg", "mlp", "cnn"}) {
    auto* b = benchmark::RegisterBenchmark((std::string("train_step/") + kind).c_str(), train_step,
                                           std::string(kind), 0);
    b->ArgName("batch")->Arg(32)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);
    b->MeasureProcessCPUTime();  // cpu_time: all threads together
    if (threads > 1) b->UseRealTime();
  }
  // A rank's batch changes every iteration: the same step over batches 1..512 (bench/batch_sweep.py), each
  // after 200 us of polling, as after an allreduce.
  for (const char* kind : {"logreg", "mlp", "cnn"}) {
    auto* b = benchmark::RegisterBenchmark((std::string("train_sweep/") + kind).c_str(), train_step,
                                           std::string(kind), 200);
    b->ArgName("batch")->Unit(benchmark::kMicrosecond)->MeasureProcessCPUTime();
    for (int batch : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512}) b->Arg(batch);
    b->UseRealTime();  // at every thread count: the sweep compares thread counts on one clock
  }
}

}  // namespace
}  // namespace lbbsp::models

int main(int argc, char** argv) {
  lbbsp::runtime::reexec_with_kernel_environment(argv);  // time the kernels as `lbbsp train` runs them
  int threads = 1;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {  // take --threads=N out before Google Benchmark parses the rest
    if (std::strncmp(argv[i], "--threads=", 10) == 0)
      threads = std::atoi(argv[i] + 10);
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  lbbsp::models::set_num_threads(threads);
  benchmark::AddCustomContext("lbbsp_threads", std::to_string(threads));
  benchmark::AddCustomContext("lbbsp_simd", lbbsp::models::simd::kName);
  benchmark::AddCustomContext("lbbsp_blas_core", lbbsp::models::blas_core());
  if (const char* spin = std::getenv("GOMP_SPINCOUNT")) benchmark::AddCustomContext("gomp_spincount", spin);
  lbbsp::models::register_all(threads);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
