// Model interface: pure compute over one flat float parameter buffer and one flat gradient buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/device.hpp"

namespace lbbsp::models {

// Shape of one input sample (channels, height, width); dense models use the flattened size.
struct InputShape {
  int channels = 1;
  int height = 28;
  int width = 28;
  int size() const { return channels * height * width; }
};

// One named tensor inside the flat parameter buffer (stable names, used by --save-params).
struct TensorInfo {
  std::string name;
  size_t offset = 0;  // in floats
  std::vector<int> shape;
  size_t size() const;
};

// Sums over the samples of a slice: callers add them across ranks before dividing by the global batch.
struct StepStats {
  double loss_sum = 0.0;
  int64_t correct = 0;
};

struct ModelConfig {
  std::string kind = "mlp";              // logreg | mlp | cnn
  InputShape input;                      // from the dataset
  int classes = 10;                      // from the dataset
  std::vector<int> hidden = {256, 128};  // MLP widths
  Device device = Device::kCpu;          // kCuda: the current CUDA device (models/cuda/cuda_models.hpp)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string name() const = 0;
  virtual size_t num_params() const = 0;
  virtual std::vector<TensorInfo> tensors() const = 0;
  // Deterministic initialisation for a seed (same on every rank).
  virtual void init_params(float* params, uint64_t seed) const = 0;
  // x: n samples of input.size() floats; y: n labels. ADDS the SUM over samples of the gradient to grad
  // (caller zeroes it). n may be 0. Returns the summed loss and correct count.
  virtual StepStats forward_backward(const float* params, const float* x, const uint8_t* y, int n,
                                     float* grad) = 0;
  // Forward only (evaluation).
  virtual StepStats evaluate(const float* params, const float* x, const uint8_t* y, int n) = 0;
  // FLOPs of one forward+backward sample (for GFLOP/s reports).
  virtual double flops_per_sample() const = 0;
};

// Throws std::invalid_argument naming the bad field (unknown kind, CNN on a non-image input, ...).
std::unique_ptr<Model> make_model(const ModelConfig& cfg);

// Threads used by our kernels and by the BLAS underneath (--threads).
void set_num_threads(int n);
int num_threads();

// Within its scope (when `active`) the calling thread's parallel loops run on it alone; the thread count is
// restored after.
class OneThreadScope {
 public:
  explicit OneThreadScope(bool active = true);
  ~OneThreadScope();
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  int saved_ = 0;
};

// After a parallel region the kernel threads spin a while before they sleep (about 50 us under lbbsp:
// GOMP_SPINCOUNT, runtime/platform/kernel_env.hpp), so a region started soon after finds them awake and costs
// a microsecond instead of a 30-100 us wake. gemm() and the CNN's step mark the end of their regions; a
// kernel that splits only when it is cheap (the optimizer's pass) asks team_is_awake(). Either answer gives
// the same bits: only element-wise work asks.
constexpr double kTeamAwakeMicroseconds = 20.0;
void mark_team_released();
bool team_is_awake();

// A training step of fewer flops runs on one thread: its first parallel loop wakes the other threads, asleep
// since the allreduce (30-100 us on a VM, docs/threads.md), and a step this small (about 300 us on one core)
// does not win that back. MLP: up to 33 samples; CNN: up to 2.
constexpr double kParallelMinStepFlops = double(1 << 25);
inline bool step_runs_on_one_thread(double flops) {
  return flops < kParallelMinStepFlops;
}

}  // namespace lbbsp::models
