// Time of one forward_backward on the GPU vs batch size, per model: the piecewise-linear curve the GPU
// balancers assume. Prints CSV (model,batch,seconds,samples_per_s) to stdout. Each time is the median of
// several calls of the full CudaModel step as the trainer sees it (copies in, kernels, gradient copy back).
//   bench_gpu [--models logreg,mlp,cnn] [--max-batch 4096] [--min-seconds 0.2] [--device LOCAL_RANK]
#include <cstdio>

#ifdef LBBSP_WITH_CUDA
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "models/cuda/cuda_models.hpp"
#include "models/model.hpp"

namespace {

using namespace lbbsp::models;

double median_step_seconds(Model& model, const std::vector<float>& params, const std::vector<float>& x,
                           const std::vector<uint8_t>& y, int batch, double min_seconds,
                           std::vector<float>& grad) {
  using clock = std::chrono::steady_clock;
  for (int i = 0; i < 2; ++i) model.forward_backward(params.data(), x.data(), y.data(), batch, grad.data());
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 5 ||
         (std::chrono::duration<double>(clock::now() - start).count() < min_seconds && times.size() < 1000)) {
    const auto t0 = clock::now();
    model.forward_backward(params.data(), x.data(), y.data(), batch, grad.data());
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = "logreg,mlp,cnn";
  int max_batch = 4096, device = 0;
  double min_seconds = 0.2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--models")
      models = value;
    else if (flag == "--max-batch")
      max_batch = std::atoi(value.c_str());
    else if (flag == "--min-seconds")
      min_seconds = std::atof(value.c_str());
    else if (flag == "--device")
      device = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "bench_gpu: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu: no CUDA GPU visible\n");
    return 1;
  }
  try {
    select_cuda_device(device);
    std::printf("model,batch,seconds,samples_per_s\n");
    std::stringstream list(models);
    for (std::string kind; std::getline(list, kind, ',');) {
      ModelConfig cfg;
      cfg.kind = kind;
      cfg.device = Device::kCuda;
      auto model = make_model(cfg);
      std::vector<float> params(model->num_params()), grad(model->num_params());
      model->init_params(params.data(), 1);
      std::mt19937_64 rng(2);
      std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
      std::vector<float> x(size_t(max_batch) * cfg.input.size());
      std::vector<uint8_t> y(static_cast<size_t>(max_batch));
      for (float& v : x) v = pixel(rng);
      for (size_t i = 0; i < y.size(); ++i) y[i] = uint8_t(rng() % cfg.classes);
      for (int batch = 1; batch <= max_batch; batch *= 2) {
        const double s = median_step_seconds(*model, params, x, y, batch, min_seconds, grad);
        std::printf("%s,%d,%.9g,%.6g\n", kind.c_str(), batch, s, batch / s);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}

#else

int main() {
  std::printf("bench_gpu: built without CUDA (configure with -DLBBSP_WITH_CUDA=ON on a machine with nvcc)\n");
  return 0;
}

#endif
