// Op semantics that the gradient and parity checks do not pin down: NaN propagation, window
// edges of the vectorised paths, ties.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "galley/galley.h"
#include "test_util.h"

using galley::Tensor;

namespace {
// Naive max pool with PyTorch's rules (NaN wins, first of equal maxima wins).
std::vector<float> reference_pool(const Tensor& x, int64_t k, int64_t s, int64_t p,
                                  std::vector<int64_t>* winners) {
  const int64_t n = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  std::vector<float> out;
  const float* px = x.data<float>();
  for (int64_t pl = 0; pl < n; ++pl)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        float best = -std::numeric_limits<float>::infinity();
        int64_t bi = -1;
        for (int64_t a = i * s - p; a < i * s - p + k; ++a)
          for (int64_t b = j * s - p; b < j * s - p + k; ++b) {
            if (a < 0 || a >= h || b < 0 || b >= w) continue;
            float v = px[pl * h * w + a * w + b];
            if (bi < 0 || v > best || (std::isnan(v) && !std::isnan(best)))
              best = v, bi = a * w + b;
          }
        out.push_back(best);
        winners->push_back(pl * h * w + bi);
      }
  return out;
}
}  // namespace

TEST(MaxPool, MatchesNaiveReferenceAcrossWidths) {
  // Widths around the 16-output vector step of the 2x2 path, odd sizes, and the generic path.
  for (int64_t w : {2, 3, 7, 15, 30, 31, 32, 33, 34, 65}) {
    for (auto [k, s, p] : {std::tuple<int64_t, int64_t, int64_t>{2, 2, 0}, {3, 2, 1}, {3, 1, 0}}) {
      if (w + 2 * p < k) continue;
      galley::Generator gen(w * 10 + k);
      Tensor x = galley::randn({2, 3, 5, w}, gen);
      std::vector<int64_t> winners;
      auto expected = reference_pool(x, k, s, p, &winners);
      x.set_requires_grad(true);
      Tensor y = galley::max_pool2d(x, {.kernel_size = k, .stride = s, .padding = p});
      ASSERT_EQ(y.to_vector(), expected) << "w=" << w << " k=" << k << " s=" << s;
      galley::sum(y).backward();
      std::vector<float> g(x.numel(), 0.f);
      for (int64_t i : winners) g[i] += 1.f;
      ASSERT_EQ(x.grad().to_vector(), g) << "w=" << w << " k=" << k << " s=" << s;
    }
  }
}

TEST(MaxPool, NanPropagatesFromAnyPositionOfTheWindow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int pos = 0; pos < 4; ++pos) {
    std::vector<float> v(2 * 36, 1.f);
    v[(pos / 2) * 36 / 6 + pos % 2] = nan;  // inside the first 2x2 window of the first plane
    Tensor x = Tensor::from_vector(v, {1, 2, 6, 6});
    auto y = galley::max_pool2d(x, {.kernel_size = 2}).to_vector();
    EXPECT_TRUE(std::isnan(y[0])) << "NaN at window position " << pos;
    EXPECT_EQ(y[1], 1.f);
  }
}

TEST(Relu, NanStaysNanAndNegativeZeroIsZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto y = galley::relu(Tensor::from_vector({nan, -0.f, -2.f, 3.f}, {4})).to_vector();
  EXPECT_TRUE(std::isnan(y[0]));  // as in PyTorch: a NaN is not hidden
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_EQ(y[3], 3.f);
}

TEST(CrossEntropy, AllRowsIgnoredGivesZeroLossAndGradient) {
  Tensor logits = galley::randn({3, 4});
  logits.set_requires_grad(true);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
  Tensor loss = galley::cross_entropy(logits, labels);
  EXPECT_EQ(loss.item(), 0.f);
  loss.backward();
  for (float g : logits.grad().to_vector()) EXPECT_EQ(g, 0.f);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  Tensor logits = Tensor::from_vector({1000.f, -1000.f, 0.f, 88.f, 89.f, 90.f}, {2, 3});
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 0}, {2});
  float loss = galley::cross_entropy(logits, labels, {.reduction = galley::Reduction::Sum}).item();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 2000.f + (2.f + std::log(1.f + std::exp(-1.f) + std::exp(-2.f))), 1e-2);
}

TEST(BiasRelu, EqualsReluOfTheSumForwardAndBackward) {
  galley::manual_seed(3);
  for (int64_t dim : {1, -1}) {
    Tensor x = galley::randn({3, 5, 4}).set_requires_grad();
    Tensor b = galley::randn({dim == 1 ? 5 : 4}).set_requires_grad();
    Tensor x2 = x.detach().clone().set_requires_grad(), b2 = b.detach().clone().set_requires_grad();
    Tensor fused = galley::bias_relu(x, b, dim);
    Tensor plain = galley::relu(x2 + (dim == 1 ? b2.reshape({5, 1}) : b2));
    EXPECT_EQ(fused.to_vector(), plain.to_vector());
    Tensor g = galley::randn({3, 5, 4});
    fused.backward(g);
    plain.backward(g);
    EXPECT_EQ(x.grad().to_vector(), x2.grad().to_vector());
    const auto gb = b.grad().to_vector(), gb2 = b2.grad().to_vector();
    for (size_t i = 0; i < gb.size(); ++i) EXPECT_NEAR(gb[i], gb2[i], 1e-5) << i;
  }
}

TEST(BiasRelu, FusedLayersEqualTheLayerThenRelu) {
  galley::manual_seed(4);
  galley::nn::Conv2D conv{3, 8, 3, {.padding = 1}},
      fused_conv{3, 8, 3, {.padding = 1, .relu = true}};
  fused_conv.load_state_dict(conv.state_dict());
  galley::nn::Linear fc{6, 5}, fused_fc{6, 5, galley::nn::LinearOptions{.relu = true}};
  fused_fc.load_state_dict(fc.state_dict());
  Tensor x = galley::randn({2, 3, 6, 6});
  EXPECT_EQ(fused_conv(x).to_vector(), galley::relu(conv(x)).to_vector());
  Tensor v = galley::randn({4, 6});
  EXPECT_EQ(fused_fc(v).to_vector(), galley::relu(fc(v)).to_vector());
}

TEST(BiasRelu, ABiasOfTheWrongSizeNamesBothShapes) {
  testutil::expect_contains(testutil::error_of([] {
                              galley::bias_relu(galley::randn({2, 3, 4}), galley::randn({4}));
                            }),
                            {"bias_relu", "[4]", "[2, 3, 4]"});
}

TEST(BiasRelu, NanStaysNanAndNegativeZeroIsZeroAsInRelu) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector({nan, -0.f, -1.f, 2.f}, {1, 4});
  auto y = galley::bias_relu(x, galley::zeros({4}), -1).to_vector();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_FALSE(std::signbit(y[1]));
  EXPECT_EQ(y[2], 0.f);
  EXPECT_EQ(y[3], 2.f);
}

// Outputs and gradients are allocated on the inputs' device; factories on the one they are
// given (cpu:0 by default) whatever ran before on the thread.
TEST(Devices, OpsAllocateOnTheirInputsDeviceAndFactoriesOnTheirOwn) {
  const galley::Device d1 = galley::Device::cpu(1);
  Tensor w = galley::randn({4, 18}).to(d1), x = galley::randn({2, 1, 6, 6}).to(d1);
  Tensor k = galley::randn({2, 1, 3, 3}).to(d1);
  w.set_requires_grad(true);
  k.set_requires_grad(true);
  Tensor h = galley::conv2d(x, k, Tensor(), {.padding = 1});
  EXPECT_EQ(h.device(), d1);
  Tensor f = galley::flatten(galley::max_pool2d(galley::relu(h), {.kernel_size = 2}), 1);
  Tensor logits = galley::linear(f, w);
  EXPECT_EQ(logits.device(), d1);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 3}, {2}).to(d1);
  Tensor loss = galley::cross_entropy(logits, labels);
  EXPECT_EQ(loss.device(), d1);
  EXPECT_EQ(galley::zeros({2}).device(), galley::Device::cpu(0));  // while d1's graph is alive
  loss.backward();
  EXPECT_EQ(w.grad().device(), d1);
  EXPECT_EQ(k.grad().device(), d1);
  EXPECT_EQ(galley::ones({2}).device(), galley::Device::cpu(0));
  galley::optim::Adam opt({w, k}, {.learning_rate = 1e-3});
  opt.step();
  EXPECT_EQ(w.device(), d1);
  EXPECT_EQ(Tensor::empty({1}).device(), galley::Device::cpu(0));
  try {
    galley::add(w, galley::zeros({4, 18}));
    FAIL() << "an op on cpu:1 and cpu:0 ran";
  } catch (const galley::Error& e) {
    EXPECT_NE(std::string(e.what()).find("(cpu:1 and cpu)"), std::string::npos) << e.what();
  }
}
