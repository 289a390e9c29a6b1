#include "models/model.hpp"

#include <omp.h>
#include <strings.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "models/gemm.hpp"
#include "models/zoo.hpp"
#ifdef LBBSP_WITH_CUDA
#include "models/cuda/cuda_models.hpp"
#endif

namespace lbbsp::models {

size_t TensorInfo::size() const {
  size_t count = 1;
  for (int d : shape) count *= size_t(d);
  return count;
}

std::unique_ptr<Model> make_model(const ModelConfig& cfg) {
  if (cfg.device == Device::kCuda) {
#ifdef LBBSP_WITH_CUDA
    ModelConfig host = cfg;  // the CPU model validates cfg and gives the CUDA model its layout and init
    host.device = Device::kCpu;
    return make_cuda_model(cfg, make_model(host));
#else
    throw std::invalid_argument(
        "lbbsp was built without CUDA (configure with -DLBBSP_WITH_CUDA=ON on a machine with nvcc)");
#endif
  }
  const InputShape& in = cfg.input;
  if (in.channels <= 0 || in.height <= 0 || in.width <= 0)
    throw std::invalid_argument("ModelConfig::input: every dimension must be positive, got " +
                                std::to_string(in.channels) + "x" + std::to_string(in.height) + "x" +
                                std::to_string(in.width));
  if (cfg.classes < 2 || cfg.classes > 256)  // labels are uint8
    throw std::invalid_argument("ModelConfig::classes: must be in [2, 256], got " +
                                std::to_string(cfg.classes));
  if (cfg.kind == "logreg") {
    ModelConfig plain = cfg;
    plain.hidden.clear();
    return make_mlp(plain, "logreg");
  }
  if (cfg.kind == "mlp") {
    for (int width : cfg.hidden)
      if (width <= 0)
        throw std::invalid_argument("ModelConfig::hidden: widths must be positive, got " +
                                    std::to_string(width));
    return make_mlp(cfg, "mlp");
  }
  if (cfg.kind == "cnn") {
    if (in.height % 4 != 0 || in.width % 4 != 0)
      throw std::invalid_argument(
          "ModelConfig::input: the cnn needs height and width divisible by 4 (two 2x2 "
          "poolings), got " +
          std::to_string(in.height) + "x" + std::to_string(in.width));
    return make_cnn(cfg);
  }
  throw std::invalid_argument("ModelConfig::kind: unknown model '" + cfg.kind +
                              "' (expected logreg, mlp or cnn)");
}

namespace {
int g_threads = 0;  // 0: not set, use the OpenMP default
}  // namespace

// All kernel threads are OpenMP threads; the BLAS (Debian's libopenblas0-pthread has its own pthreads) is
// kept at one thread per call and models/gemm.cpp splits large GEMMs over the OpenMP threads itself. Two
// thread pools on the same cores (OpenBLAS workers spin-yield after each call, OpenMP workers spin after each
// region) made 2 threads slower than 1 (docs/threads.md).
void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("set_num_threads: need at least 1 thread, got " + std::to_string(n));
  omp_set_num_threads(n);
  blas_use_one_thread();
  g_threads = n;
}

int num_threads() {
  return g_threads > 0 ? g_threads : omp_get_max_threads();
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::atomic<int64_t> g_team_released_ns{INT64_MIN / 2};  // long ago
}  // namespace

void mark_team_released() {
  g_team_released_ns.store(now_ns(), std::memory_order_relaxed);
}

bool team_is_awake() {
  // OMP_WAIT_POLICY=passive: the threads sleep as soon as a region ends.
  static const bool passive = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    return policy && strcasecmp(policy, "passive") == 0;
  }();
  if (passive || omp_in_parallel() || omp_get_max_threads() < 2) return false;
  const int64_t since = now_ns() - g_team_released_ns.load(std::memory_order_relaxed);
  return since >= 0 && double(since) < kTeamAwakeMicroseconds * 1e3;
}

OneThreadScope::OneThreadScope(bool active) {
  if (!active) return;
  saved_ = omp_get_max_threads();
  omp_set_num_threads(1);
}

OneThreadScope::~OneThreadScope() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

}  // namespace lbbsp::models
