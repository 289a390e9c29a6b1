// The vector convolution kernels with 16 lanes and the AVX-512 tile shapes, on any AVX2 machine: this test
// compiles models/conv_simd.cpp once more with LBBSP_SIMD_EMULATE_512 (tests/CMakeLists.txt), where a vector
// is two AVX2 registers. On an AVX-512 build it runs the real AVX-512 kernels. Against the plain reference
// loops.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "models/conv.hpp"
#include "models/conv_simd.hpp"
#include "models/simd.hpp"
#include "test_models_util.hpp"

namespace lbbsp::models {
namespace {

using testing::all_close;
using testing::random_floats;

const ConvShape kCases[] = {
    {2, 28, 28, 1, 16, 5, true},  // the CNN's first layer: one vector per tile, rows of 28 in two tiles of 14
    {3, 14, 14, 16, 32, 5, false},  // its second layer: two vectors per tile, dx on 16 channels
    {2, 5, 29, 16, 48, 3, false},   // 48 channels: three one-vector blocks; rows of 29 in uneven tiles
    {1, 3, 3, 32, 16, 3, false},    // a row narrower than any tile
    {0, 4, 4, 16, 16, 5, false},    // no samples
};

std::string describe(const ConvShape& s) {
  return "n=" + std::to_string(s.n) + " " + std::to_string(s.height) + "x" + std::to_string(s.width) + " c" +
         std::to_string(s.in_channels) + "->" + std::to_string(s.out_channels) + " k" +
         std::to_string(s.kernel);
}

TEST(ConvSimd512, ForwardAndBackwardMatchReference) {
  std::mt19937_64 rng(7);
  ConvWorkspace ws;
  for (const ConvShape& s : kCases) {
    const auto x = random_floats(size_t(s.n) * s.input_size(), rng);
    const auto w = random_floats(size_t(s.out_channels) * s.col_width(), rng);
    const auto dy = random_floats(size_t(s.n) * s.output_size(), rng);
    const auto dw0 = random_floats(w.size(), rng);
    std::vector<float> y(size_t(s.n) * s.output_size(), NAN), y_ref(y.size(), NAN);
    std::vector<float> dw = dw0, dw_ref = dw0, dx(x.size(), NAN), dx_ref(x.size(), NAN);
    conv2d_forward_ref(s, x.data(), w.data(), y_ref.data());
    conv2d_backward_ref(s, x.data(), w.data(), dy.data(), dw_ref.data(), dx_ref.data());
    const bool dx_ok = !s.input_chw;  // the first layer's [c, h, w] input takes no dx here
#ifdef LBBSP_SIMD_LANES
    static_assert(simd::kLanes == 16);
    ASSERT_TRUE(conv_simd_forward(s, x.data(), w.data(), y.data(), ws)) << describe(s);
    ASSERT_TRUE(
        conv_simd_backward(s, x.data(), w.data(), dy.data(), dw.data(), dx_ok ? dx.data() : nullptr, ws))
        << describe(s);
    EXPECT_TRUE(all_close(y, y_ref)) << "y " << describe(s);
    EXPECT_TRUE(all_close(dw, dw_ref)) << "dw " << describe(s);
    if (dx_ok) {
      EXPECT_TRUE(all_close(dx, dx_ref)) << "dx " << describe(s);
    }
#else  // a build without AVX2+FMA has no vector kernels: they must decline and leave the outputs alone
    EXPECT_FALSE(conv_simd_forward(s, x.data(), w.data(), y.data(), ws)) << describe(s);
    EXPECT_FALSE(conv_simd_backward(s, x.data(), w.data(), dy.data(), dw.data(), dx.data(), ws))
        << describe(s);
    EXPECT_EQ(dw, dw0);
#endif
  }
}

}  // namespace
}  // namespace lbbsp::models
