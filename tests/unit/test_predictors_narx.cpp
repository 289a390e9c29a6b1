// NARX in parts: the network kernels (the AVX2+FMA versions against the scalar reference), the exogenous
// linear model on its own, and a state saved by today's format (narx/4) that must load, save back byte for
// byte and predict as it did when recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/state_io.hpp"
#include "predictors/narx_exo.hpp"
#include "predictors/narx_kernels.hpp"
#include "predictors/predictor.hpp"
#include "predictors/rng.hpp"

namespace {

using lbbsp::StateOf;
using lbbsp::StateReader;
using lbbsp::StateWriter;
using lbbsp::predictors::Rng;
namespace narx = lbbsp::predictors::narx;

// Weights and inputs of the scale the predictor feeds the kernels (inputs normalised and clipped to +-6).
struct Net {
  int n_in, h;
  std::vector<float> w, x;
  Net(int n_in_, int h_, uint64_t seed) : n_in(n_in_), h(h_), w(h_ * (n_in_ + 2) + 1), x(n_in_) {
    Rng rng(seed);
    for (float& v : w) v = static_cast<float>(rng.normal() / std::sqrt(static_cast<double>(n_in)));
    for (float& v : x) v = static_cast<float>(std::clamp(2.0 * rng.normal(), -6.0, 6.0));
  }
};

TEST(NarxKernels, FastTanhIsWithin1e4OfTanh) {
  for (float x = -8.0f; x <= 8.0f; x += 0.001f) ASSERT_NEAR(narx::fast_tanh(x), std::tanh(x), 1e-4) << x;
}

TEST(NarxKernels, DispatchIsTheScalarReferenceForOtherWidths) {
  for (int h : {1, 3, 5, 12}) {
    Net net(9, h, 7 + h);
    std::vector<float> h1(h), h2(h);
    const float a = narx::forward(net.w.data(), net.n_in, h, net.x.data(), h1.data());
    const float b = narx::scalar_forward(net.w.data(), net.n_in, h, net.x.data(), h2.data());
    EXPECT_EQ(a, b) << h;
    EXPECT_EQ(h1, h2) << h;
  }
}

// The SIMD kernels sum in another order (two accumulators, a tree for the output) and fuse multiply-adds:
// they agree with the scalar reference to float rounding, not bit for bit. Largest differences measured over
// these cases (AVX2 machine, GCC 12): 6e-7 on the hidden units, 3e-7 relative on the output and the
// gradients; the bound is 1e-5.
constexpr double kSimdTolerance = 1e-5;

TEST(NarxKernels, SimdForwardMatchesTheScalarReference) {
  if (!LBBSP_NARX_SIMD) GTEST_SKIP() << "built without AVX2+FMA";
  for (int h : {8, 16})
    for (int n_in : {1, 2, 7, 13, 16, 31}) {
      for (uint64_t seed = 1; seed <= 20; ++seed) {
        Net net(n_in, h, seed * 100 + n_in);
        std::vector<float> hs(h), hr(h);
        const float simd = narx::forward(net.w.data(), n_in, h, net.x.data(), hs.data());
        const float ref = narx::scalar_forward(net.w.data(), n_in, h, net.x.data(), hr.data());
        ASSERT_NEAR(simd, ref, kSimdTolerance * (1 + std::abs(ref))) << "h " << h << " n_in " << n_in;
        for (int j = 0; j < h; ++j) ASSERT_NEAR(hs[j], hr[j], kSimdTolerance) << "h " << h << " unit " << j;
      }
    }
}

TEST(NarxKernels, SimdGradientMatchesTheScalarReference) {
  if (!LBBSP_NARX_SIMD) GTEST_SKIP() << "built without AVX2+FMA";
  for (int h : {8, 16})
    for (int n_in : {1, 2, 7, 13, 31}) {
      Net net(n_in, h, 5 + n_in);
      std::vector<float> gs(net.w.size(), 0.0f), gr(net.w.size(), 0.0f), hid(h), dh(h);
      for (uint64_t sample = 0; sample < 8; ++sample) {  // a batch of 8, accumulated as train_step does
        Net s(n_in, h, 1000 + sample);
        const float target = static_cast<float>(0.5 * s.x[0]);
        narx::accumulate(net.w.data(), n_in, h, s.x.data(), target, 0.125f, gs.data(), hid.data(), dh.data());
        narx::scalar_accumulate(net.w.data(), n_in, h, s.x.data(), target, 0.125f, gr.data(), hid.data(),
                                dh.data());
      }
      double scale = 0;
      for (float g : gr) scale = std::max(scale, static_cast<double>(std::abs(g)));
      for (size_t k = 0; k < gr.size(); ++k)
        ASSERT_NEAR(gs[k], gr[k], kSimdTolerance * (1 + scale))
            << "h " << h << " n_in " << n_in << " at " << k;
    }
}

// ---- the exogenous linear model on its own ----

TEST(NarxExoLinearModel, LearnsALinearSpeedAndItsStateRoundTrips) {
  using lbbsp::predictors::ExoLinearModel;
  ExoLinearModel model(2, 0.98, 0.01);
  const double none[2] = {0.5, 0.3};
  EXPECT_EQ(model.forecast(none, 42.0, 0, 1e9), 42.0);  // no data yet: the fallback
  for (int t = 0; t < 200; ++t) {
    const double u[2] = {0.5 + 0.4 * std::sin(0.37 * t), 0.3};  // the second input never varies
    const double speed = 20 + 60 * u[0];
    model.learn(u, speed, model.forecast(u, 50.0, 0, 1e9));
  }
  const double u[2] = {0.8, 0.3};
  const double y = model.forecast(u, 50.0, 0, 1e9);
  EXPECT_NEAR(y, 68.0, 0.5);
  EXPECT_EQ(model.forecast(u, 50.0, 10, 60), 60.0);  // within the band it is given
  StateWriter w(StateOf::predictor, "exo");
  model.save(w);
  const std::string saved = w.str();  // StateReader keeps a reference to its input
  ExoLinearModel loaded(2, 0.98, 0.01), other_size(3, 0.98, 0.01);
  StateReader r(StateOf::predictor, saved, "exo");
  loaded.load(r);
  r.finish();
  EXPECT_EQ(loaded.forecast(u, 50.0, 0, 1e9), y);
  StateReader r3(StateOf::predictor, saved, "exo");
  EXPECT_THROW(other_size.load(r3), std::invalid_argument);
}

// ---- a narx/4 state saved before the split into files (tests/fixtures/predictors_narx4_state.hex) ----

// The series the fixture was recorded on: speed proportional to the first input plus a wobble, every 11th
// step missing. The state is "narx:dy=2,du=1,hidden=3,window=6,batch=2" with 2 inputs, seed 5, after steps
// 0-39 (observe, then predict the next step).
void fixture_step(int t, double& speed, std::vector<double>& exo) {
  const double cpu = (t / 5) % 2 ? 0.5 : 1.0;
  exo = {cpu, 0.2 + 0.1 * std::sin(0.7 * t)};
  speed = t % 11 == 10 ? std::nan("") : 80.0 * cpu + 3.0 * std::sin(0.3 * t);
}

std::string read_hex_fixture(const std::string& name) {
  std::ifstream in(std::string(LBBSP_SOURCE_DIR) + "/tests/fixtures/" + name);
  std::string bytes, line;
  while (std::getline(in, line))
    for (size_t i = 0; i + 1 < line.size(); i += 2)
      bytes += static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16));
  return bytes;
}

// Its predictions for steps 40-59 when it was saved (bit-identical after the split on the machine that
// recorded them; the tolerance leaves room for another compiler's rounding).
constexpr double kRecorded[] = {
    78.60045415869503,  78.737364296876251, 78.951593518294544, 78.951575806943751, 39.638826194073758,
    39.881342627526976, 40.129937408948216, 40.374564512870386, 40.596343982251014, 81.538561387885466,
    81.548689117199089, 81.465964831089721, 81.305933110928436, 81.096713037609419, 40.549259970615637,
    40.314841005869731, 40.062059478345674, 39.800439701468754, 39.548117845365006, 78.662385596376325,
};

TEST(NarxCheckpoint, StateOfTodayLoadsSavesBackAndPredictsAsRecorded) {
  const std::string state = read_hex_fixture("predictors_narx4_state.hex");
  ASSERT_EQ(state.size(), 1392u);
  auto p = lbbsp::predictors::make_predictor("narx:dy=2,du=1,hidden=3,window=6,batch=2", 2, 999);
  p->load_state(state);
  EXPECT_EQ(p->save_state(), state);
  double speed;
  std::vector<double> exo, next;
  for (int t = 40; t < 60; ++t) {
    fixture_step(t + 1, speed, next);
    fixture_step(t, speed, exo);
    p->observe(speed, exo);
    const double recorded = kRecorded[t - 40];
    EXPECT_NEAR(p->predict(next), recorded, 1e-12 * recorded) << "step " << t;
  }
}

}  // namespace
