// StepEngine in every mode, with a host-memory stand-in for the GPU (HostResident: the CPU model and
// optimizer behind the DeviceResident interface), so the orchestration (which floats go where, when, and
// through which MPI call) is checked without a GPU. Any rank count: one process under ctest, and under
// mpiexec -n 2 / 3 in tests/mpi/test_step_engine.sh, where the sums across ranks are checked too.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "models/cuda/cuda_models.hpp"
#include "models/model.hpp"
#include "models/optimizer.hpp"
#include "runtime/platform/comm.hpp"
#include "runtime/train/step_engine.hpp"

namespace {

using namespace lbbsp;

runtime::Comm& comm() {
  static runtime::Comm c(nullptr, nullptr);
  return c;
}

// The CPU model and models::Sgd behind DeviceResident; "device" memory is host memory, so even a plain MPI
// can reduce reduction_buffer(). Counts the copies of the gradient part across the "bus".
class HostResident : public models::DeviceResident {
 public:
  explicit HostResident(models::Model& model) : model_(model), P_(model.num_params()) {}
  void enable_resident(size_t extra, double momentum, double wd) override {
    buffer_.assign(P_ + extra, 0.0f);
    params_.assign(P_, 0.0f);
    sgd_ = std::make_unique<models::Sgd>(P_, momentum, wd);
  }
  void load_state(const float* p, const float* v) override {
    params_.assign(p, p + P_);
    if (v) sgd_->velocity().assign(v, v + P_);
  }
  void store_state(float* p, float* v) override {
    if (p) std::copy(params_.begin(), params_.end(), p);
    if (v) std::copy(sgd_->velocity().begin(), sgd_->velocity().end(), v);
  }
  models::StepStats forward_backward_resident(const float* x, const uint8_t* y, int n) override {
    std::fill(buffer_.begin(), buffer_.begin() + P_, 0.0f);
    return model_.forward_backward(params_.data(), x, y, n, buffer_.data());
  }
  models::StepStats evaluate_resident(const float* x, const uint8_t* y, int n) override {
    return model_.evaluate(params_.data(), x, y, n);
  }
  float* reduction_buffer() override { return buffer_.data(); }
  void buffer_to_host(size_t offset, size_t count, float* host) override {
    if (offset < P_) ++gradient_copies;
    std::copy(buffer_.begin() + offset, buffer_.begin() + offset + count, host);
  }
  void buffer_from_host(size_t offset, size_t count, const float* host) override {
    if (offset < P_) ++gradient_copies;
    std::copy(host, host + count, buffer_.begin() + offset);
  }
  void sgd_step(int64_t global_batch, double lr) override {
    sgd_->step(params_.data(), buffer_.data(), global_batch, lr);
  }
  int gradient_copies = 0;

 private:
  models::Model& model_;
  size_t P_;
  std::vector<float> params_, buffer_;
  std::unique_ptr<models::Sgd> sgd_;
};

models::ModelConfig mlp_config() {
  models::ModelConfig cfg;
  cfg.kind = "mlp";
  cfg.input = {1, 4, 5};
  cfg.classes = 3;
  cfg.hidden = {8};
  return cfg;
}

// Rank r's slice of step s: 3 + r samples that depend on (s, r) only.
void slice(int step, int rank, const models::ModelConfig& cfg, std::vector<float>* x,
           std::vector<uint8_t>* y) {
  const int n = 3 + rank;
  x->resize(size_t(n) * cfg.input.size());
  y->resize(n);
  for (size_t i = 0; i < x->size(); ++i) (*x)[i] = float((i * 7 + step * 13 + rank * 5) % 11) / 11.0f;
  for (int i = 0; i < n; ++i) (*y)[i] = uint8_t((i + step + rank) % cfg.classes);
}

struct RunResult {
  std::vector<float> params, velocity, tails;  // tails: the extra floats after each allreduce
  std::string mode;
  int gradient_copies = 0;
  bool released_after_each_step = true;  // host/node-shared: released_at() within each sgd_step call
};

// 4 training steps through a StepEngine; the extra floats carry (rank + 1, step) and must come back summed.
RunResult run(const std::string& gpu_params, const std::string& gpu_allreduce, bool mpi_cuda_aware,
              const std::string& host_allreduce = "mpi") {
  const models::ModelConfig cfg = mlp_config();
  auto model = models::make_model(cfg);
  const size_t P = model->num_params(), extra = 2;
  std::vector<float> params(P);
  model->init_params(params.data(), 3);
  models::Sgd sgd(P, 0.9, 1e-4);
  HostResident resident(*model);
  runtime::StepEngineConfig ec;
  ec.device = gpu_params.empty() ? runtime::Device::kCpu : runtime::Device::kCuda;
  ec.gpu_params =
      runtime::parse_enum<runtime::GpuParams>("--gpu-params", gpu_params.empty() ? "device" : gpu_params);
  ec.gpu_allreduce = runtime::parse_enum<runtime::GpuAllreduce>("--gpu-allreduce", gpu_allreduce);
  ec.host_allreduce = runtime::parse_enum<runtime::HostAllreduce>("--allreduce", host_allreduce);
  ec.momentum = 0.9;
  ec.weight_decay = 1e-4;
  ec.resident = &resident;
  ec.mpi_cuda_aware = mpi_cuda_aware;
  ec.mpi_cuda_support = "told by the test";
  runtime::StepEngine engine(ec, *model, params, sgd, extra, comm());
  RunResult out;
  out.mode = engine.mode();
  std::vector<float> buf(P + extra), x;
  std::vector<uint8_t> y;
  for (int step = 0; step < 4; ++step) {
    std::fill(buf.begin(), buf.end(), 0.0f);
    slice(step, comm().rank(), cfg, &x, &y);
    engine.forward_backward(x.data(), y.data(), int(y.size()), buf.data());
    buf[P] = float(comm().rank() + 1);
    buf[P + 1] = float(step);
    engine.allreduce(buf.data(), buf.size());
    out.tails.insert(out.tails.end(), buf.begin() + P, buf.end());
    const auto before = std::chrono::steady_clock::now();
    engine.sgd_step(buf.data(), 32, 0.05);
    const auto after = std::chrono::steady_clock::now();
    const auto released = engine.released_at();
    out.released_after_each_step &= released && *released >= before && *released <= after;
  }
  engine.pull_to_host();
  out.params = params;
  out.velocity = sgd.velocity();
  out.gradient_copies = resident.gradient_copies;
  return out;
}

TEST(StepEngine, ModesFollowTheConfigAndTheMpiLibrary) {
  EXPECT_EQ(run("", "auto", true).mode, "host");  // a CPU model ignores the GPU options
  EXPECT_EQ(run("host", "auto", true).mode, "host");
  EXPECT_EQ(run("device", "auto", false).mode, "device/staged");
  EXPECT_EQ(run("device", "staged", true).mode, "device/staged");
  EXPECT_EQ(run("device", "auto", true).mode, "device/cuda-aware");
  EXPECT_EQ(run("device", "cuda-aware", true).mode, "device/cuda-aware");
}

// Every mode takes the same SGD trajectory bit for bit (same kernels, same sums), and the extra floats come
// back as sums over the ranks.
TEST(StepEngine, EveryModeGivesTheSameTrajectory) {
  const RunResult host = run("host", "auto", false);
  const int R = comm().size();
  ASSERT_EQ(host.tails.size(), 8u);
  for (int step = 0; step < 4; ++step) {
    EXPECT_EQ(host.tails[2 * step], float(R * (R + 1) / 2)) << "step " << step;
    EXPECT_EQ(host.tails[2 * step + 1], float(R * step)) << "step " << step;
  }
  for (const auto& [gpu_params, allreduce, aware] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"device", "staged", false}, {"device", "cuda-aware", true}}) {
    SCOPED_TRACE(allreduce);
    const RunResult r = run(gpu_params, allreduce, aware);
    EXPECT_EQ(r.params, host.params);
    EXPECT_EQ(r.velocity, host.velocity);
    EXPECT_EQ(r.tails, host.tails);
  }
  // The parameters did move (the comparison above can fail).
  const models::ModelConfig cfg = mlp_config();
  auto model = models::make_model(cfg);
  std::vector<float> init(model->num_params());
  model->init_params(init.data(), 3);
  EXPECT_NE(host.params, init);
}

// Host/node-shared: the ranks of a node sum in shared memory in rank order and share one parameter copy. Same
// trajectory as MPI_Allreduce up to float summation order (bit for bit with 1 or 2 ranks, where a + b is all
// there is); the extra floats come back as exact sums.
TEST(StepEngine, NodeSharedModeGivesTheSameTrajectory) {
  const RunResult mpi = run("", "auto", false, "mpi");
  const RunResult node = run("", "auto", false, "node");
  EXPECT_EQ(mpi.mode, "host");
  EXPECT_EQ(node.mode, "host/node-shared");
  EXPECT_EQ(node.tails, mpi.tails);
  ASSERT_EQ(node.params.size(), mpi.params.size());
  if (comm().size() <= 2) {
    EXPECT_EQ(node.params, mpi.params);
    EXPECT_EQ(node.velocity, mpi.velocity);
  }
  double diff = 0, norm = 0;
  for (size_t i = 0; i < mpi.params.size(); ++i) {
    diff = std::max(diff, double(std::fabs(node.params[i] - mpi.params[i])));
    norm = std::max(norm, double(std::fabs(mpi.params[i])));
  }
  EXPECT_LE(diff, 1e-5 * norm);
  // Every rank got the node's release moment from each step's barrier: within its own sgd_step call.
  EXPECT_TRUE(node.released_after_each_step);
  EXPECT_FALSE(mpi.released_after_each_step);  // plain MPI has no such moment
  // auto takes the node mode for a CPU model exactly when some node runs several ranks.
  const bool shared = comm().size() > 1;  // the MPI tests start all ranks on this one machine
  EXPECT_EQ(run("", "auto", false, "auto").mode, shared ? "host/node-shared" : "host");
  // A CUDA model with host parameters keeps plain MPI unless asked.
  EXPECT_EQ(run("host", "auto", false, "auto").mode, "host");
  EXPECT_EQ(run("host", "auto", false, "node").mode, "host/node-shared");
}

// Staged copies the gradient out and back every step; cuda-aware never moves it.
TEST(StepEngine, OnlyTheStagedModeCopiesTheGradient) {
  EXPECT_EQ(run("device", "staged", false).gradient_copies, 2 * 4);
  EXPECT_EQ(run("device", "cuda-aware", true).gradient_copies, 0);
}

TEST(StepEngine, RefusesWhatCannotWork) {
  try {
    run("device", "cuda-aware", false);
    FAIL() << "cuda-aware with an MPI that cannot reduce GPU memory must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reduce GPU memory (told by the test)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(run("host", "cuda-aware", true), std::invalid_argument);
  EXPECT_THROW(run("gpu", "auto", true), std::invalid_argument);
  EXPECT_THROW(run("device", "nccl", true), std::invalid_argument);
  EXPECT_THROW(run("", "auto", false, "nccl"), std::invalid_argument);
  try {
    run("device", "auto", false, "node");
    FAIL() << "--allreduce node with parameters on the GPU must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-params host"), std::string::npos) << e.what();
  }
  // A cuda device without a resident face is a programming error.
  auto model = models::make_model(mlp_config());
  std::vector<float> params(model->num_params());
  models::Sgd sgd(params.size(), 0.9, 0.0);
  runtime::StepEngineConfig ec;
  ec.device = runtime::Device::kCuda;
  EXPECT_THROW(runtime::StepEngine(ec, *model, params, sgd, 0, comm()), std::logic_error);
}

}  // namespace
