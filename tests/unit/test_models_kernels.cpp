// Every fast kernel against its plain-loop reference, on odd shapes, n = 0 and n = 1.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include "models/activation.hpp"
#include "models/conv.hpp"
#include "models/dense.hpp"
#include "models/gemm.hpp"
#include "models/model.hpp"
#include "models/pool.hpp"
#include "models/softmax_xent.hpp"
#include "test_models_util.hpp"

namespace lbbsp::models {
namespace {

using testing::all_close;
using testing::random_floats;
using testing::random_labels;

struct DenseCase {
  int n, in, out;
};
const DenseCase kDenseCases[] = {{0, 5, 3}, {1, 1, 1}, {1, 7, 3}, {5, 13, 11}, {33, 17, 129}, {64, 784, 256}};

// gemm against a plain triple loop on 1 and 2 threads, every transpose, shapes large enough to be split by
// rows (m >= n) and by columns (m < n), with beta accumulating into C.
TEST(GemmKernel, SplitByRowsOrColumnsMatchesReference) {
  struct Shape {
    int m, n, k;
  };
  for (Shape sh : {Shape{300, 120, 160}, Shape{32, 256, 784}, Shape{31, 257, 600}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int lda = ta ? sh.m : sh.k, ldb = tb ? sh.k : sh.n;
        std::mt19937_64 rng(7);
        const auto a = random_floats(size_t(sh.m) * sh.k, rng), b = random_floats(size_t(sh.k) * sh.n, rng);
        const auto c0 = random_floats(size_t(sh.m) * sh.n, rng);
        std::vector<float> want = c0;
        for (int i = 0; i < sh.m; ++i)
          for (int j = 0; j < sh.n; ++j) {
            double sum = 0;
            for (int p = 0; p < sh.k; ++p)
              sum += double(ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
            want[i * sh.n + j] = float(0.5 * sum + 0.25 * c0[i * sh.n + j]);
          }
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          std::vector<float> c = c0;
          gemm(ta, tb, sh.m, sh.n, sh.k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, c.data(), sh.n);
          EXPECT_TRUE(all_close(c, want, 1e-4)) << sh.m << "x" << sh.n << "x" << sh.k << " ta " << ta
                                                << " tb " << tb << ", " << threads << " thread(s)";
        }
      }
    }
  }
  set_num_threads(1);
}

TEST(DenseKernel, ForwardMatchesReference) {
  std::mt19937_64 rng(1);
  for (const DenseCase& c : kDenseCases)
    for (bool relu : {false, true}) {
      const auto x = random_floats(size_t(c.n) * c.in, rng), w = random_floats(size_t(c.out) * c.in, rng),
                 b = random_floats(c.out, rng);
      std::vector<float> fast(size_t(c.n) * c.out, NAN), ref(fast.size(), NAN);
      dense_forward(x.data(), w.data(), b.data(), fast.data(), c.n, c.in, c.out, relu);
      dense_forward_ref(x.data(), w.data(), b.data(), ref.data(), c.n, c.in, c.out, relu);
      EXPECT_TRUE(all_close(fast, ref))
          << "n=" << c.n << " in=" << c.in << " out=" << c.out << " relu=" << relu;
    }
}

TEST(DenseKernel, BackwardMatchesReferenceAndAccumulates) {
  std::mt19937_64 rng(2);
  for (const DenseCase& c : kDenseCases)
    for (bool with_dx : {false, true}) {
      const auto x = random_floats(size_t(c.n) * c.in, rng), w = random_floats(size_t(c.out) * c.in, rng),
                 dy = random_floats(size_t(c.n) * c.out, rng);
      // Gradients start non-zero: the kernels must ADD into them.
      const auto dw0 = random_floats(w.size(), rng), db0 = random_floats(c.out, rng);
      std::vector<float> dw = dw0, db = db0, dx(size_t(c.n) * c.in, NAN);
      std::vector<float> dw_ref = dw0, db_ref = db0, dx_ref(dx.size(), NAN);
      dense_backward(x.data(), w.data(), dy.data(), dw.data(), db.data(), with_dx ? dx.data() : nullptr, c.n,
                     c.in, c.out);
      dense_backward_ref(x.data(), w.data(), dy.data(), dw_ref.data(), db_ref.data(),
                         with_dx ? dx_ref.data() : nullptr, c.n, c.in, c.out);
      EXPECT_TRUE(all_close(dw, dw_ref)) << "dw n=" << c.n << " in=" << c.in << " out=" << c.out;
      EXPECT_TRUE(all_close(db, db_ref)) << "db n=" << c.n;
      if (with_dx) {
        EXPECT_TRUE(all_close(dx, dx_ref)) << "dx n=" << c.n;
      }
      if (c.n == 0) {
        EXPECT_EQ(dw, dw0) << "n = 0 must leave the gradient alone";
      }
    }
}

TEST(ActivationKernel, BiasReluAndBackwardMatchReference) {
  std::mt19937_64 rng(3);
  for (auto [rows, channels] : {std::pair{0, 4}, {1, 1}, {7, 3}, {300, 130}, {2048, 32}}) {
    const auto b = random_floats(channels, rng);
    for (bool relu : {false, true}) {
      auto fast = random_floats(size_t(rows) * channels, rng), ref = fast;
      bias_relu_forward(fast.data(), b.data(), rows, channels, relu);
      bias_relu_forward_ref(ref.data(), b.data(), rows, channels, relu);
      EXPECT_EQ(fast, ref) << rows << "x" << channels;
    }
    auto y = random_floats(size_t(rows) * channels, rng);
    for (size_t i = 0; i < y.size(); i += 3) y[i] = 0.0f;  // exact zeros: ReLU passes no gradient there
    auto dy = random_floats(y.size(), rng), dy_ref = dy;
    relu_backward(y.data(), dy.data(), dy.size());
    relu_backward_ref(y.data(), dy_ref.data(), dy_ref.size());
    EXPECT_EQ(dy, dy_ref);
    auto db = random_floats(channels, rng), db_ref = db;
    bias_backward(dy.data(), db.data(), rows, channels);
    bias_backward_ref(dy.data(), db_ref.data(), rows, channels);
    EXPECT_TRUE(all_close(db, db_ref)) << rows << "x" << channels;
  }
}

TEST(PoolKernel, ForwardAndBackwardMatchReferenceWithTies) {
  std::mt19937_64 rng(4);
  for (auto [n, h, w, c] :
       {std::tuple{0, 4, 4, 3}, {1, 2, 2, 1}, {3, 6, 10, 5}, {2, 28, 28, 16}, {5, 14, 14, 32}}) {
    // Values from a small set so that windows contain ties (the first maximum must win in both versions).
    std::vector<float> x(size_t(n) * h * w * c);
    for (float& v : x) v = float(int(rng() % 5) - 2);
    const size_t out = size_t(n) * (h / 2) * (w / 2) * c;
    std::vector<float> y(out), y_ref(out);
    std::vector<uint8_t> idx(out), idx_ref(out);
    maxpool2x2_forward(x.data(), y.data(), idx.data(), n, h, w, c);
    maxpool2x2_forward_ref(x.data(), y_ref.data(), idx_ref.data(), n, h, w, c);
    EXPECT_EQ(y, y_ref);
    EXPECT_EQ(idx, idx_ref);
    const auto dy = random_floats(out, rng);
    std::vector<float> dx(x.size(), NAN), dx_ref(x.size(), NAN);
    maxpool2x2_backward(dy.data(), idx.data(), dx.data(), n, h, w, c);
    maxpool2x2_backward_ref(dy.data(), idx.data(), dx_ref.data(), n, h, w, c);
    EXPECT_EQ(dx, dx_ref);
  }
}

TEST(PoolKernel, PicksTheWindowMaximum) {
  // One 2x2 single-channel window, winner at the bottom-left cell.
  const std::vector<float> x = {1.0f, -3.0f, 7.0f, 2.0f};
  float y = 0.0f;
  uint8_t idx = 9;
  maxpool2x2_forward(x.data(), &y, &idx, 1, 2, 2, 1);
  EXPECT_EQ(y, 7.0f);
  EXPECT_EQ(idx, 2);
  std::vector<float> dx(4, NAN);
  const float dy = 0.5f;
  maxpool2x2_backward(&dy, &idx, dx.data(), 1, 2, 2, 1);
  EXPECT_EQ(dx, (std::vector<float>{0.0f, 0.0f, 0.5f, 0.0f}));
}

const ConvShape kConvCases[] = {
    {0, 4, 4, 1, 2, 5, true},       {1, 1, 1, 1, 1, 3, false},   {1, 5, 7, 3, 4, 5, true},
    {2, 6, 6, 2, 3, 3, false},      {3, 8, 8, 16, 32, 5, false}, {2, 28, 28, 1, 16, 5, true},
    {13, 14, 14, 16, 32, 5, false},  // several im2col chunks, the last one partial
    {3, 9, 7, 1, 16, 5, true},       // register-blocked direct path, width not a multiple of the block
    {2, 6, 10, 1, 16, 3, true},      // blocked forward, plain weight gradient (k = 3)
    {2, 5, 6, 1, 32, 5, false},      // plain direct path with many output channels
    {3, 7, 29, 16, 16, 5, false},    // vector path: rows of 29 in uneven tiles, dx on 16 channels
    {2, 5, 5, 8, 48, 3, false},      // vector path: 48 channels (one vector per tile on AVX-512), k = 3
    {70, 14, 14, 16, 32, 5, false},  // the CNN's second layer beyond one micro-batch
    {2, 9, 23, 3, 24, 5, false},     // AVX2: row tiles of one vector (24 = 3 x 8 channels), rows of 23
    {2, 6, 11, 8, 8, 3, false},      // AVX2: row tiles for k = 3, dx on 8 channels
};

// Both code paths of one build: the vector kernels (when the build has them) and the portable one.
const bool kPaths[] = {false, true};

std::string describe(const ConvShape& s, bool portable) {
  return "n=" + std::to_string(s.n) + " " + std::to_string(s.height) + "x" + std::to_string(s.width) + " c" +
         std::to_string(s.in_channels) + "->" + std::to_string(s.out_channels) + " k" +
         std::to_string(s.kernel) + " chw=" + std::to_string(s.input_chw) +
         " portable=" + std::to_string(portable);
}

TEST(ConvKernel, ForwardMatchesReference) {
  std::mt19937_64 rng(5);
  ConvWorkspace ws;
  for (bool portable : kPaths)
    for (const ConvShape& s : kConvCases) {
      ws.portable = portable;
      const auto x = random_floats(size_t(s.n) * s.input_size(), rng);
      const auto w = random_floats(size_t(s.out_channels) * s.col_width(), rng);
      std::vector<float> y(size_t(s.n) * s.output_size(), NAN), y_ref(y.size(), NAN);
      conv2d_forward(s, x.data(), w.data(), y.data(), ws);
      conv2d_forward_ref(s, x.data(), w.data(), y_ref.data());
      EXPECT_TRUE(all_close(y, y_ref)) << describe(s, portable);
    }
}

TEST(ConvKernel, BackwardMatchesReferenceAndAccumulates) {
  std::mt19937_64 rng(6);
  ConvWorkspace ws;
  for (bool portable : kPaths)
    for (const ConvShape& s : kConvCases)
      for (bool with_dx : {false, true}) {
        ws.portable = portable;
        const auto x = random_floats(size_t(s.n) * s.input_size(), rng);
        const auto w = random_floats(size_t(s.out_channels) * s.col_width(), rng);
        const auto dy = random_floats(size_t(s.n) * s.output_size(), rng);
        const auto dw0 = random_floats(w.size(), rng);
        std::vector<float> dw = dw0, dw_ref = dw0, dx(x.size(), NAN), dx_ref(x.size(), NAN);
        conv2d_backward(s, x.data(), w.data(), dy.data(), dw.data(), with_dx ? dx.data() : nullptr, ws);
        conv2d_backward_ref(s, x.data(), w.data(), dy.data(), dw_ref.data(),
                            with_dx ? dx_ref.data() : nullptr);
        EXPECT_TRUE(all_close(dw, dw_ref)) << "dw " << describe(s, portable);
        if (with_dx) {
          EXPECT_TRUE(all_close(dx, dx_ref)) << "dx " << describe(s, portable);
        }
      }
}

TEST(SoftmaxXentKernel, MatchesReference) {
  std::mt19937_64 rng(7);
  for (auto [n, classes] : {std::pair{0, 10}, {1, 2}, {1, 10}, {37, 3}, {256, 10}, {5, 256}}) {
    auto logits = random_floats(size_t(n) * classes, rng, -8.0f, 8.0f);
    const auto labels = random_labels(n, classes, rng);
    std::vector<float> g(logits.size(), NAN), g_ref(logits.size(), NAN);
    const StepStats fast = softmax_xent(logits.data(), labels.data(), n, classes, g.data());
    const StepStats ref = softmax_xent_ref(logits.data(), labels.data(), n, classes, g_ref.data());
    EXPECT_NEAR(fast.loss_sum, ref.loss_sum, 1e-5 * (1.0 + ref.loss_sum)) << n << "x" << classes;
    EXPECT_EQ(fast.correct, ref.correct);
    EXPECT_TRUE(all_close(g, g_ref, 1e-6));
    const StepStats eval = softmax_xent(logits.data(), labels.data(), n, classes, nullptr);
    EXPECT_EQ(eval.loss_sum, fast.loss_sum);
  }
}

TEST(SoftmaxXentKernel, HandComputedAndStableForHugeLogits) {
  // p = (1/4, 3/4): loss of label 0 is log 4, gradient (1/4 - 1, 3/4).
  const float logits[2] = {0.0f, std::log(3.0f)};
  const uint8_t label = 0;
  float g[2];
  const StepStats s = softmax_xent(logits, &label, 1, 2, g);
  EXPECT_NEAR(s.loss_sum, std::log(4.0), 1e-6);
  EXPECT_EQ(s.correct, 0);
  EXPECT_NEAR(g[0], -0.75f, 1e-6);
  EXPECT_NEAR(g[1], 0.75f, 1e-6);

  const float huge[3] = {1e4f, -1e4f, 9990.0f};
  const uint8_t label2 = 2;
  float g2[3];
  const StepStats s2 = softmax_xent(huge, &label2, 1, 3, g2);
  EXPECT_NEAR(s2.loss_sum, 10.0, 1e-3);
  EXPECT_EQ(s2.correct, 0);
  for (float v : g2) EXPECT_TRUE(std::isfinite(v));
}

TEST(SoftmaxXentKernel, RejectsOutOfRangeLabels) {
  const uint8_t labels[3] = {1, 9, 10};
  EXPECT_NO_THROW(check_labels(labels, 2, 10));
  try {
    check_labels(labels, 3, 10);
    FAIL() << "label 10 with 10 classes was accepted";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("label 10"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lbbsp::models
