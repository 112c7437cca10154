// Op semantics that the gradient and parity checks do not pin down: NaN propagation, window
// edges of the vectorised paths, ties, the activations at their extremes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "galley/galley.h"
#include "kernels/dropout.h"
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

// The gradient is 0 where the output is <= 0 and passes elsewhere, a NaN output included, as
// PyTorch's threshold_backward (x.relu().backward(g) gives g at a NaN): in the plain op (its
// vector blocks and its scalar tail), the fused bias + ReLU and batch norm's ReLU.
TEST(Relu, GradientPassesAtANanAsInPyTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(35);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? -1.f - float(i) : float(i) * 0.5f;
  v[3] = nan, v[33] = nan, v[1] = 0.f;  // in a vector block and in the tail; 0 stops it
  std::vector<float> want(v.size());
  for (size_t i = 0; i < v.size(); ++i) want[i] = std::isnan(v[i]) || v[i] > 0.f ? 0.75f : 0.f;
  auto grad_of = [&](const std::function<Tensor(const Tensor&)>& f, galley::Shape shape) {
    Tensor x = Tensor::from_vector(v, shape).set_requires_grad(true);
    Tensor y = f(x);
    y.backward(galley::full(y.shape(), 0.75f));
    return x.grad().to_vector();
  };
  EXPECT_EQ(grad_of([](const Tensor& x) { return galley::relu(x); }, {35}), want);
  EXPECT_EQ(
      grad_of([](const Tensor& x) { return galley::bias_relu(x, galley::zeros({35})); }, {1, 35}),
      want);
  // Batch norm in eval mode with the identity's statistics: y = x, so the same signs; the ReLU's
  // mask recomputed from x (float32 planes), and read from y (bfloat16, whose values here are
  // exact, and [N, C] inputs).
  Tensor mean = galley::zeros({1}), var = galley::ones({1});
  for (galley::DType dt : {galley::DType::Float32, galley::DType::BFloat16})
    for (galley::Shape shape : {galley::Shape{1, 1, 35}, galley::Shape{35, 1}}) {
      Tensor x = Tensor::from_vector(v, shape).to(dt).set_requires_grad(true);
      Tensor y = galley::batch_norm(x, mean, var, galley::ones({1}), galley::zeros({1}),
                                    {.training = false, .eps = 0.0, .relu = true});
      y.backward(galley::full(y.shape(), 0.75f, dt));
      EXPECT_EQ(x.grad().to(galley::DType::Float32).to_vector(), want)
          << galley::dtype_name(dt) << " " << galley::shape_str(shape);
    }
}

// pow(x, p) takes PyTorch's special exponents by their own operations (sqrt, 1 / sqrt, products,
// reciprocals), which round differently from a general pow and differ from it at -0 and -inf;
// its gradient is g * (p * x^(p - 1)) with the same special forms. PyTorch 2.15's values and
// gradients (for a gradient of 0.75) at -inf, -0, 0, 1.7, 3.3, -2.9, inf.
TEST(Pow, SpecialExponentsMatchPyTorchBitForBit) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const std::vector<float> x{-inf, -0.f, 0.f, 1.7f, 3.3f, -2.9f, inf};
  struct Case {
    float p;
    std::vector<float> y, g;
  };
  const std::vector<Case> cases = {
      {0.5f,
       {nan, -0.f, 0.f, 1.3038405179977417f, 1.8165901899337769f, nan, inf},
       {nan, -inf, inf, 0.28761187195777893f, 0.20643071830272675f, nan, 0.f}},
      {-0.5f,
       {nan, -inf, inf, 0.7669649720191956f, 0.550481915473938f, nan, 0.f},
       {-0.f, -inf, -inf, -0.16918344795703888f, -0.06255476176738739f, nan, -0.f}},
      {2.f,
       {inf, 0.f, 0.f, 2.890000104904175f, 10.889999389648438f, 8.410000801086426f, inf},
       {-inf, -0.f, 0.f, 2.5500001907348633f, 4.949999809265137f, -4.350000381469727f, inf}},
      {3.f,
       {-inf, -0.f, 0.f, 4.913000106811523f, 35.93699645996094f, -24.38900375366211f, inf},
       {inf, 0.f, 0.f, 6.502500057220459f, 24.502498626708984f, 18.922502517700195f, inf}},
      {-1.f,
       {-0.f, -inf, inf, 0.5882352590560913f, 0.3030303120613098f, -0.3448275625705719f, 0.f},
       {-0.f, -inf, -inf, -0.25951558351516724f, -0.06887052953243256f, -0.08917953819036484f,
        -0.f}},
      {-2.f,
       {0.f, inf, inf, 0.34602075815200806f, 0.09182737022638321f, 0.11890605092048645f, 0.f},
       {0.f, inf, -inf, -0.3053123950958252f, -0.04173971340060234f, 0.061503130942583084f, -0.f}},
  };
  auto same = [](float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
  };
  for (const Case& c : cases) {
    Tensor t = Tensor::from_vector(x, {7}).set_requires_grad(true);
    Tensor y = galley::pow(t, c.p);
    y.backward(galley::full({7}, 0.75f));
    const std::vector<float> got = y.to_vector(), grad = t.grad().to_vector();
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_TRUE(same(got[i], c.y[i])) << "pow(" << x[i] << ", " << c.p << ") = " << got[i];
      EXPECT_TRUE(same(grad[i], c.g[i]))
          << "gradient at " << x[i] << ", p " << c.p << ": " << grad[i];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Activations

namespace {

struct Activation {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
};

const std::vector<Activation>& activations() {
  static const std::vector<Activation> all = {
      {"gelu", [](const Tensor& x) { return galley::gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return galley::gelu(x, galley::GeluApproximate::Tanh); }},
      {"silu", [](const Tensor& x) { return galley::silu(x); }},
      {"sigmoid", [](const Tensor& x) { return galley::sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return galley::tanh(x); }},
      {"leaky_relu", [](const Tensor& x) { return galley::leaky_relu(x); }},
  };
  return all;
}

const galley::DType kFloatTypes[] = {galley::DType::Float32, galley::DType::BFloat16,
                                     galley::DType::Float16};

// f(values) and its gradient against ones (not of a sum, whose NaN the loss guard refuses), in
// `dtype`, as float32 vectors.
std::pair<std::vector<float>, std::vector<float>> value_and_grad(const Activation& a,
                                                                 const std::vector<float>& values,
                                                                 galley::DType dtype) {
  Tensor x = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(dtype);
  x.set_requires_grad(true);
  Tensor y = a.f(x);
  y.backward(galley::ones_like(y));
  return {y.to(galley::DType::Float32).to_vector(),
          x.grad().to(galley::DType::Float32).to_vector()};
}

}  // namespace

TEST(Activations, NanStaysNanForwardAndBackward) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (galley::DType dtype : kFloatTypes)
    for (const Activation& a : activations()) {
      SCOPED_TRACE(std::string(a.name) + " in " + galley::dtype_name(dtype));
      auto [y, g] = value_and_grad(a, {nan, 1.5f, -1.5f}, dtype);
      EXPECT_TRUE(std::isnan(y[0]));
      EXPECT_FALSE(std::isnan(y[1]) || std::isnan(y[2]));
      // leaky_relu's gradient does not read its input's value, only whether it is > 0: the
      // slope for a NaN, as in PyTorch.
      if (std::string(a.name) == "leaky_relu")
        EXPECT_NEAR(g[0], 0.01f, 1e-4f);
      else
        EXPECT_TRUE(std::isnan(g[0]));
      EXPECT_FALSE(std::isnan(g[1]) || std::isnan(g[2]));
    }
}

// Finite inputs of any size give the limits, never NaN: e^-x overflowing in sigmoid and silu,
// erf and tanh saturating, x^2 and x^3 overflowing in gelu's tanh form (where PyTorch's backward
// returns NaN for |x| > 1.8e19; here the gradient is its limit).
TEST(Activations, LargeInputsSaturateWithoutNan) {
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> x = {-big, -1e30f, -1e20f, -1e4f, -100.f, -50.f,
                                50.f, 100.f,  1e4f,   1e20f, 1e30f,  big};
  struct Limits {
    const char* name;
    float neg, pos;            // f(x) / x at x -> -inf and +inf (leaky_relu: its slopes)
    float grad_neg, grad_pos;  // f'(x) there
    bool relative;             // f(x) ~ x * limit rather than f(x) ~ limit
  };
  const Limits limits[] = {
      {"gelu", 0.f, 1.f, 0.f, 1.f, true},   {"gelu_tanh", 0.f, 1.f, 0.f, 1.f, true},
      {"silu", 0.f, 1.f, 0.f, 1.f, true},   {"sigmoid", 0.f, 1.f, 0.f, 0.f, false},
      {"tanh", -1.f, 1.f, 0.f, 0.f, false}, {"leaky_relu", 0.01f, 1.f, 0.01f, 1.f, true},
  };
  for (galley::DType dtype : kFloatTypes)
    for (size_t k = 0; k < activations().size(); ++k) {
      const Activation& a = activations()[k];
      const Limits& l = limits[k];
      ASSERT_EQ(std::string(a.name), l.name);
      SCOPED_TRACE(std::string(a.name) + " in " + galley::dtype_name(dtype));
      // float16 holds up to 65504, bfloat16 up to 3.39e38: larger inputs round to infinities
      // there, tested below.
      const float largest = dtype == galley::DType::Float16    ? 100.f
                            : dtype == galley::DType::BFloat16 ? 1e30f
                                                               : big;
      std::vector<float> in;
      for (float v : x)
        if (std::abs(v) <= largest) in.push_back(v);
      auto [y, g] = value_and_grad(a, in, dtype);
      for (size_t i = 0; i < in.size(); ++i) {
        SCOPED_TRACE("x = " + std::to_string(in[i]));
        ASSERT_FALSE(std::isnan(y[i]) || std::isnan(g[i]));
        const float lim = in[i] < 0 ? l.neg : l.pos;
        const float want = l.relative ? in[i] * lim : lim;
        // Within the rounding of a 16-bit result (x * 0.01 rounds too); e^-50 is 2e-22, below
        // any tolerance.
        EXPECT_NEAR(y[i], want, 1e-2 * std::abs(want) + 1e-20);
        const float grad = in[i] < 0 ? l.grad_neg : l.grad_pos;
        EXPECT_NEAR(g[i], grad, 1e-2 * grad + 1e-6);  // 0.01 is not a bfloat16
      }
    }
}

// Infinities give what PyTorch gives: the limits where the formula reaches them, NaN where it
// multiplies inf by 0 (gelu, its tanh form and silu at -inf, and their gradients at +-inf).
TEST(Activations, InfinitiesGiveWhatPyTorchGives) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Want {
    const char* name;
    float y[2], g[2];  // at -inf and +inf
  };
  const Want wants[] = {
      {"gelu", {nan, inf}, {nan, nan}},  {"gelu_tanh", {nan, inf}, {nan, nan}},
      {"silu", {nan, inf}, {nan, nan}},  {"sigmoid", {0.f, 1.f}, {0.f, 0.f}},
      {"tanh", {-1.f, 1.f}, {0.f, 0.f}}, {"leaky_relu", {-inf, inf}, {0.01f, 1.f}}};
  auto same = [](float got, float want) {
    return std::isnan(want) ? std::isnan(got) : got == want;
  };
  for (size_t k = 0; k < activations().size(); ++k) {
    ASSERT_EQ(std::string(activations()[k].name), wants[k].name);
    SCOPED_TRACE(wants[k].name);
    auto [y, g] = value_and_grad(activations()[k], {-inf, inf}, galley::DType::Float32);
    for (int side = 0; side < 2; ++side) {
      EXPECT_TRUE(same(y[side], wants[k].y[side]))
          << "f(" << (side ? "" : "-") << "inf) = " << y[side];
      EXPECT_TRUE(same(g[side], wants[k].g[side]))
          << "f'(" << (side ? "" : "-") << "inf) = " << g[side];
    }
  }
}

TEST(Activations, LeakyReluAtZeroTakesTheSlope) {
  for (galley::DType dtype : kFloatTypes) {
    SCOPED_TRACE(galley::dtype_name(dtype));
    Tensor x = Tensor::from_vector({0.f, -0.f, 2.f, -2.f}, {4}).to(dtype);
    x.set_requires_grad(true);
    Tensor y = galley::leaky_relu(x, 0.25f);
    galley::sum(y).backward();
    const auto yv = y.to(galley::DType::Float32).to_vector();
    EXPECT_EQ(yv, (std::vector<float>{0.f, 0.f, 2.f, -0.5f}));
    EXPECT_TRUE(std::signbit(yv[1]));  // -0 * slope, as in PyTorch
    // x > 0 ? 1 : slope, so 0 and -0 take the slope, as PyTorch's leaky_relu_backward does.
    EXPECT_EQ(x.grad().to(galley::DType::Float32).to_vector(),
              (std::vector<float>{0.25f, 0.25f, 1.f, 0.25f}));
  }
}

TEST(Activations, ValuesAndSlopesAtZero) {
  struct At0 {
    const char* name;
    float y, g;
  };
  const At0 want[] = {{"gelu", 0.f, 0.5f}, {"gelu_tanh", 0.f, 0.5f},
                      {"silu", 0.f, 0.5f}, {"sigmoid", 0.5f, 0.25f},
                      {"tanh", 0.f, 1.f},  {"leaky_relu", 0.f, 0.01f}};
  for (galley::DType dtype : kFloatTypes)
    for (size_t k = 0; k < activations().size(); ++k) {
      SCOPED_TRACE(std::string(want[k].name) + " in " + galley::dtype_name(dtype));
      auto [y, g] = value_and_grad(activations()[k], {0.f}, dtype);
      EXPECT_EQ(y[0], want[k].y);
      EXPECT_NEAR(g[0], want[k].g, 1e-4);  // 0.01 is not a bfloat16
    }
}

// The CPU kernels run every element through the same vector code: an element's result does not
// depend on its position in the array (block tails, thread chunks) or on its neighbours.
TEST(Activations, AnElementsResultDoesNotDependOnItsPosition) {
  galley::Generator gen(5);
  const Tensor x = galley::randn({3001}, gen) * 3.f;
  const std::vector<float> xv = x.to_vector();
  for (const Activation& a : activations()) {
    SCOPED_TRACE(a.name);
    const std::vector<float> all = a.f(x).to_vector();
    for (int64_t i : {0, 1, 7, 255, 256, 257, 1000, 2999, 3000}) {
      const float alone = a.f(Tensor::from_vector({xv[i]}, {1})).item();
      EXPECT_EQ(std::memcmp(&alone, &all[i], sizeof(float)), 0)
          << "element " << i << ": " << alone << " alone, " << all[i] << " in the array";
    }
  }
}

TEST(Activations, BadArgumentsNameTheOp) {
  using testutil::error_of;
  using testutil::expect_contains;
  expect_contains(error_of([] { galley::leaky_relu(galley::zeros({2}), NAN); }),
                  {"leaky_relu", "negative_slope", "finite"});
  expect_contains(error_of([] { galley::gelu(galley::zeros({2}), galley::GeluApproximate(7)); }),
                  {"gelu", "approximate", "7"});
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2});
  expect_contains(error_of([&] { galley::silu(labels); }), {"silu", "int64"});
  expect_contains(error_of([&] { galley::sigmoid(labels); }), {"sigmoid", "int64"});
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

// ---------------------------------------------------------------------------------------------
// avg_pool2d, adaptive_avg_pool2d

namespace {
// The window of output i along an axis, with PyTorch's rules: [start, end) and its divisor.
struct Win {
  int64_t start, end, count;
};
Win fixed_window(int64_t i, int64_t in, int64_t k, int64_t s, int64_t p, bool include_pad) {
  int64_t a = i * s - p, b = std::min(a + k, in + p);
  const int64_t padded = b - a;
  a = std::max<int64_t>(a, 0), b = std::min(b, in);
  return {a, b, include_pad ? padded : b - a};
}
Win adaptive_window(int64_t i, int64_t in, int64_t out) {
  const int64_t a = static_cast<int64_t>(std::floor(double(i) * in / out));
  const int64_t b = static_cast<int64_t>(std::ceil(double(i + 1) * in / out));
  return {a, b, b - a};
}

// Naive pooling in double over per-axis windows; `grad` gets d sum(y) / dx.
template <typename RowWin, typename ColWin>
std::vector<float> reference_avg(const Tensor& x, int64_t oh, int64_t ow, RowWin rows, ColWin cols,
                                 std::vector<float>* grad) {
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const float* px = x.data<float>();
  std::vector<float> out;
  grad->assign(x.numel(), 0.f);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const Win r = rows(i), c = cols(j);
        double s = 0;
        for (int64_t a = r.start; a < r.end; ++a)
          for (int64_t b = c.start; b < c.end; ++b) s += px[pl * h * w + a * w + b];
        out.push_back(static_cast<float>(s / double(r.count * c.count)));
        for (int64_t a = r.start; a < r.end; ++a)
          for (int64_t b = c.start; b < c.end; ++b)
            (*grad)[pl * h * w + a * w + b] += 1.f / float(r.count * c.count);
      }
  return out;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.f + std::fabs(want[i]))) << what << " element " << i;
}

// avg_pool2d of a random [2, 3, h, w] input with kernel k, stride s and padding p against the
// naive reference, values and the gradient of their sum, at PyTorch's output sizes.
struct PoolCase {
  int64_t h, w, k, s, p;
};
void check_avg_pool(const PoolCase& g, bool include_pad, bool ceil_mode) {
  const std::string what = "h=" + std::to_string(g.h) + " w=" + std::to_string(g.w) +
                           " k=" + std::to_string(g.k) + " s=" + std::to_string(g.s) +
                           " p=" + std::to_string(g.p) + (include_pad ? " pad" : "") +
                           (ceil_mode ? " ceil" : "");
  auto size = [&](int64_t in) {
    const int64_t span = in + 2 * g.p - g.k;  // not below -(s - 1) under ceil_mode here
    int64_t o = (span + (ceil_mode ? g.s - 1 : 0)) / g.s + 1;
    if (ceil_mode && (o - 1) * g.s >= in + g.p) --o;
    return o;
  };
  const int64_t oh = size(g.h), ow = size(g.w);
  galley::Generator gen(g.h * 100 + g.w * 7 + g.k * 10 + g.p);
  Tensor x = galley::randn({2, 3, g.h, g.w}, gen);
  std::vector<float> grad;
  auto want = reference_avg(
      x, oh, ow, [&](int64_t i) { return fixed_window(i, g.h, g.k, g.s, g.p, include_pad); },
      [&](int64_t j) { return fixed_window(j, g.w, g.k, g.s, g.p, include_pad); }, &grad);
  x.set_requires_grad(true);
  Tensor y = galley::avg_pool2d(x, {.kernel_size = g.k,
                                    .stride = g.s,
                                    .padding = g.p,
                                    .count_include_pad = include_pad,
                                    .ceil_mode = ceil_mode});
  ASSERT_EQ(y.shape(), (galley::Shape{2, 3, oh, ow})) << what;
  expect_near_all(y.to_vector(), want, what);
  galley::sum(y).backward();
  expect_near_all(x.grad().to_vector(), grad, what + " gradient");
}
}  // namespace

TEST(AvgPool, MatchesNaiveReferenceForEveryGeometry) {
  for (PoolCase g : {PoolCase{6, 6, 2, 2, 0}, PoolCase{7, 8, 3, 2, 1}, PoolCase{5, 6, 3, 1, 1},
                     PoolCase{9, 7, 3, 3, 0}, PoolCase{8, 8, 4, 3, 2}, PoolCase{1, 5, 1, 1, 0},
                     PoolCase{5, 5, 5, 1, 2},
                     // wide rows: the vectorised rows of the common windows and their edges
                     PoolCase{4, 33, 2, 2, 0}, PoolCase{5, 37, 3, 2, 1}, PoolCase{3, 40, 3, 1, 1},
                     PoolCase{6, 31, 3, 3, 0}, PoolCase{3, 29, 3, 3, 1}, PoolCase{3, 70, 3, 2, 0}})
    for (bool include_pad : {true, false})
      for (bool ceil_mode : {false, true}) check_avg_pool(g, include_pad, ceil_mode);
}

// Under ceil_mode an axis shorter than the window still has one window, clipped to the input,
// as PyTorch's floor((in + 2p - k + s - 1) / s) + 1 gives; without it the input is too small.
TEST(AvgPool, CeilModeTakesAnAxisShorterThanTheWindow) {
  // PyTorch 2.15: avg_pool2d(x, 2, 2, ceil_mode=True) of a 1x1 plane [5] is [5]; of a 9x1 column
  // 0..8 it is [0.5, 2.5, 4.5, 6.5, 8.0].
  Tensor one = Tensor::from_vector(std::vector<float>{5.f}, {1, 1, 1, 1});
  Tensor y = galley::avg_pool2d(one, {.kernel_size = 2, .stride = 2, .ceil_mode = true});
  ASSERT_EQ(y.shape(), (galley::Shape{1, 1, 1, 1}));
  EXPECT_EQ(y.to_vector()[0], 5.f);
  galley::nn::AvgPool2D layer(
      galley::AvgPool2dOptions{.kernel_size = 2, .stride = 2, .ceil_mode = true});
  Tensor col = galley::arange(0, 9).reshape({1, 1, 9, 1});
  EXPECT_EQ(layer(col).to_vector(), (std::vector<float>{0.5f, 2.5f, 4.5f, 6.5f, 8.f}));
  EXPECT_THROW(galley::avg_pool2d(one, {.kernel_size = 2, .stride = 2}), galley::Error);
  // An empty plane or no channels is refused, as PyTorch refuses it (ceil_mode would give an
  // empty axis a window of nothing); only the batch may be empty.
  for (galley::Shape shape : {galley::Shape{1, 1, 0, 5}, galley::Shape{1, 0, 4, 4}}) {
    const Tensor empty = galley::zeros(shape);
    testutil::expect_contains(
        testutil::error_of([&] {
          galley::avg_pool2d(empty,
                             {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true});
        }),
        {"avg_pool2d", galley::shape_str(shape), "only the batch"});
    testutil::expect_contains(
        testutil::error_of([&] { galley::max_pool2d(empty, {.kernel_size = 2, .padding = 1}); }),
        {"max_pool2d", "empty plane"});
    testutil::expect_contains(testutil::error_of([&] {
                                galley::adaptive_avg_pool2d(empty, {1, 1});
                              }),
                              {"adaptive_avg_pool2d", "empty plane"});
  }
  EXPECT_EQ(galley::avg_pool2d(galley::zeros({0, 2, 4, 4}), {.kernel_size = 2}).shape(),
            (galley::Shape{0, 2, 2, 2}));
  for (PoolCase g : {PoolCase{1, 1, 2, 2, 0}, PoolCase{2, 3, 3, 2, 1}, PoolCase{1, 7, 3, 3, 0},
                     PoolCase{2, 2, 4, 3, 1}, PoolCase{3, 1, 4, 4, 2}})
    for (bool include_pad : {true, false}) check_avg_pool(g, include_pad, true);
}

TEST(AdaptiveAvgPool, MatchesNaiveReferenceForDivisibleAndOtherSizes) {
  struct G {
    int64_t h, w, oh, ow;
  };
  for (G g : {G{7, 9, 1, 1}, G{8, 8, 4, 4}, G{7, 10, 3, 4}, G{5, 5, 5, 5}, G{3, 2, 5, 3},
              G{13, 6, 7, 1}, G{64, 64, 1, 1}, G{1, 1, 1, 1}}) {
    const std::string what = std::to_string(g.h) + "x" + std::to_string(g.w) + " -> " +
                             std::to_string(g.oh) + "x" + std::to_string(g.ow);
    galley::Generator gen(g.h * 31 + g.oh);
    Tensor x = galley::randn({2, 3, g.h, g.w}, gen);
    std::vector<float> grad;
    auto want = reference_avg(
        x, g.oh, g.ow, [&](int64_t i) { return adaptive_window(i, g.h, g.oh); },
        [&](int64_t j) { return adaptive_window(j, g.w, g.ow); }, &grad);
    x.set_requires_grad(true);
    Tensor y = galley::adaptive_avg_pool2d(x, {g.oh, g.ow});
    ASSERT_EQ(y.shape(), (galley::Shape{2, 3, g.oh, g.ow})) << what;
    expect_near_all(y.to_vector(), want, what);
    galley::sum(y).backward();
    expect_near_all(x.grad().to_vector(), grad, what + " gradient");
  }
}

// A 16-bit pooling computes in float32 and rounds once: the bits of the float32 op on the
// widened input, rounded.
TEST(AvgPool, SixteenBitResultsAreTheFloat32ResultRoundedOnce) {
  for (galley::DType dt : {galley::DType::BFloat16, galley::DType::Float16}) {
    Tensor x = galley::randn({2, 3, 9, 11}).to(dt);
    Tensor wide = x.to(galley::DType::Float32);
    auto same_bits = [&](const Tensor& a, const Tensor& b, const char* what) {
      ASSERT_EQ(a.dtype(), dt) << what;
      EXPECT_EQ(a.to(galley::DType::Float32).to_vector(),
                b.to(dt).to(galley::DType::Float32).to_vector())
          << what;
    };
    const galley::AvgPool2dOptions o{.kernel_size = 3, .stride = 2, .padding = 1};
    same_bits(galley::avg_pool2d(x, o), galley::avg_pool2d(wide, o), "avg_pool2d");
    same_bits(galley::adaptive_avg_pool2d(x, {4, 3}), galley::adaptive_avg_pool2d(wide, {4, 3}),
              "adaptive");
    same_bits(galley::adaptive_avg_pool2d(x, {1, 1}), galley::adaptive_avg_pool2d(wide, {1, 1}),
              "global");
  }
}

TEST(AvgPool, GlobalPoolingIsTheMeanOfEachPlaneOnEveryThreadCount) {
  Tensor x = galley::randn({8, 64, 14, 14});
  const auto want = galley::mean(galley::flatten(x, 2), -1).to_vector();
  const int threads = galley::num_threads();
  for (int t : {1, 2, 4}) {
    galley::set_num_threads(t);
    expect_near_all(galley::adaptive_avg_pool2d(x, {1, 1}).to_vector(), want,
                    "threads " + std::to_string(t));
  }
  galley::set_num_threads(threads);
}

TEST(AvgPool, ErrorsNameTheOpAndTheShapes) {
  Tensor x = galley::randn({1, 2, 3, 3});
  testutil::expect_contains(
      testutil::error_of([&] { galley::avg_pool2d(x, {.kernel_size = 2, .padding = 2}); }),
      {"avg_pool2d", "padding 2", "half the kernel"});
  testutil::expect_contains(
      testutil::error_of([&] { galley::avg_pool2d(x, {.kernel_size = 5, .padding = 0}); }),
      {"avg_pool2d", "[1, 2, 3, 3]", "5x5"});
  testutil::expect_contains(testutil::error_of([&] {
                              galley::avg_pool2d(galley::randn({2, 3, 3}), {});
                            }),
                            {"avg_pool2d", "[N, C, H, W]", "[2, 3, 3]"});
  testutil::expect_contains(testutil::error_of([&] {
                              galley::adaptive_avg_pool2d(x, {0, 2});
                            }),
                            {"adaptive_avg_pool2d", "[0, 2]"});
  testutil::expect_contains(testutil::error_of([] { galley::nn::AvgPool2D(2, 1, 3); }),
                            {"AvgPool2D", "padding 3"});
}

TEST(AvgPool, LayersCallTheOpsAndHaveNoState) {
  Tensor x = galley::randn({2, 3, 8, 8});
  galley::nn::AvgPool2D pool(3, 2, 1);
  galley::nn::AdaptiveAvgPool2D gap(1);
  EXPECT_EQ(pool(x).to_vector(),
            galley::avg_pool2d(x, {.kernel_size = 3, .stride = 2, .padding = 1}).to_vector());
  EXPECT_EQ(gap(x).to_vector(), galley::adaptive_avg_pool2d(x, {1, 1}).to_vector());
  EXPECT_EQ(galley::nn::AdaptiveAvgPool2D(2, 3)(x).shape(), (galley::Shape{2, 3, 2, 3}));
  EXPECT_TRUE(pool.state_dict().empty());
  EXPECT_TRUE(gap.state_dict().empty());
  testutil::expect_contains(
      testutil::error_of([&] {
        pool(galley::randn({3, 8, 8}));
      }),
      {"AvgPool2D(kernel=3, stride=2, padding=1)", "avg_pool2d", "[3, 8, 8]"});
}

// ---------------------------------------------------------------------------------------------
// dropout

namespace {
// 1 where y is nonzero (x has no zeros).
std::vector<int> kept(const Tensor& y) {
  std::vector<int> m;
  for (float v : y.to(galley::DType::Float32).to_vector()) m.push_back(v != 0.f);
  return m;
}
}  // namespace

// The Random123 known-answer vector of Philox-4x32-10 at counter 0, key 0.
TEST(Dropout, PhiloxMatchesTheReferenceImplementation) {
  const galley::kernels::Philox4 r = galley::kernels::philox4x32_10(0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Dropout, EvalAndZeroProbabilityAreTheIdentity) {
  Tensor x = galley::randn({4, 5});
  x.set_requires_grad(true);
  Tensor e = galley::dropout(x, 0.5f, false);
  EXPECT_EQ(e.raw_data(), x.raw_data());
  EXPECT_EQ(e.to_vector(), x.to_vector());
  Tensor z = galley::dropout(x, 0.f, true);
  EXPECT_EQ(z.to_vector(), x.to_vector());
  galley::sum(z).backward();
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>(20, 1.f));

  galley::nn::Dropout layer(0.5f);
  layer.eval();
  EXPECT_EQ(layer(x).to_vector(), x.to_vector());
  layer.train();
  EXPECT_NE(layer(x).to_vector(), x.to_vector());
}

TEST(Dropout, ProbabilityOneGivesZerosAndZeroGradients) {
  for (galley::DType dt :
       {galley::DType::Float32, galley::DType::BFloat16, galley::DType::Float16}) {
    Tensor x = galley::randn({1000}).to(dt);
    x.set_requires_grad(true);
    Tensor y = galley::dropout(x, 1.f);
    EXPECT_EQ(y.dtype(), dt);
    for (float v : y.to(galley::DType::Float32).to_vector()) ASSERT_EQ(v, 0.f);
    galley::sum(y).backward();
    for (float v : x.grad().to(galley::DType::Float32).to_vector()) ASSERT_EQ(v, 0.f);
  }
}

// Over 1M elements the kept fraction of p = 0.3 has a standard deviation of 4.6e-4; 5 of them
// bound it, and each of Philox's four words (elements i % 4) on its own (9.2e-4 each).
TEST(Dropout, KeptFractionAndMeanMatchTheProbability) {
  const int64_t n = 1 << 20;
  galley::Generator gen(2024);
  Tensor x = galley::ones({n});
  const std::vector<float> y = galley::dropout(x, 0.3f, true, gen).to_vector();
  const float scale = 1.f / 0.7f;
  int64_t kept_all = 0, kept_word[4] = {0, 0, 0, 0};
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(y[i] == 0.f || y[i] == scale) << i << ": " << y[i];
    const bool k = y[i] != 0.f;
    kept_all += k, kept_word[i % 4] += k, sum += y[i];
  }
  EXPECT_NEAR(double(kept_all) / n, 0.7, 5 * 4.6e-4);
  for (int w = 0; w < 4; ++w) EXPECT_NEAR(double(kept_word[w]) / (n / 4), 0.7, 5 * 9.2e-4) << w;
  EXPECT_NEAR(sum / n, 1.0, 5 * 4.6e-4 * scale);  // inverted dropout keeps the mean
}

TEST(Dropout, SameSeedSameMaskInEveryDtypeAndNewMasksAfterwards) {
  Tensor x = galley::uniform({3, 1000}, 1.f, 2.f);
  galley::Generator a(7), b(7);
  const auto first = kept(galley::dropout(x, 0.4f, true, a));
  EXPECT_EQ(kept(galley::dropout(x, 0.4f, true, b)), first);
  EXPECT_NE(kept(galley::dropout(x, 0.4f, true, a)), first);  // the next call draws anew
  for (galley::DType dt : {galley::DType::BFloat16, galley::DType::Float16}) {
    galley::Generator c(7);
    Tensor y = galley::dropout(x.to(dt), 0.4f, true, c);
    EXPECT_EQ(kept(y), first) << galley::dtype_name(dt);
    // Computed in float32, rounded once.
    galley::Generator d(7);
    Tensor wide = galley::dropout(x.to(dt).to(galley::DType::Float32), 0.4f, true, d);
    EXPECT_EQ(y.to(galley::DType::Float32).to_vector(),
              wide.to(dt).to(galley::DType::Float32).to_vector());
  }
  galley::nn::Dropout l1(0.4f, 99), l2(0.4f, 99);
  EXPECT_EQ(kept(l1(x)), kept(l2(x)));
  EXPECT_EQ(kept(l1(x)), kept(l2(x)));
}

TEST(Dropout, GradientIsTheMaskTimesTheScale) {
  for (galley::DType dt :
       {galley::DType::Float32, galley::DType::BFloat16, galley::DType::Float16}) {
    Tensor x = galley::uniform({5, 333}, 1.f, 2.f).to(dt);
    x.set_requires_grad(true);
    galley::Generator gen(3);
    Tensor y = galley::dropout(x, 0.25f, true, gen);
    Tensor w = galley::randn({5, 333}).to(dt);
    galley::sum(y * w).backward();
    ASSERT_EQ(x.grad().dtype(), dt);
    const auto m = kept(y);
    const auto g = x.grad().to(galley::DType::Float32).to_vector();
    const auto wv = w.to(galley::DType::Float32).to_vector();
    for (size_t i = 0; i < g.size(); ++i) {
      const float want = Tensor::from_vector(std::vector<float>{wv[i] * (m[i] / 0.75f)}, {1})
                             .to(dt)
                             .to(galley::DType::Float32)
                             .to_vector()[0];
      ASSERT_EQ(g[i], want) << galley::dtype_name(dt) << " element " << i;
    }
  }
}

TEST(Dropout, ErrorsNameTheOpAndTheProbability) {
  Tensor x = galley::uniform({6, 8}, 1.f, 2.f);
  testutil::expect_contains(testutil::error_of([&] { galley::dropout(x, 1.5f); }),
                            {"dropout", "1.5", "[6, 8]"});
  testutil::expect_contains(testutil::error_of([] { galley::nn::Dropout(-0.1f); }),
                            {"Dropout", "-0.1"});
}

TEST(Dropout, LayerHasNoStateAndTakesItsStream) {
  galley::nn::Sequential model(std::make_shared<galley::nn::Linear>(4, 4),
                               std::make_shared<galley::nn::Dropout>(0.5f, 11));
  const auto sd = model.state_dict();
  EXPECT_EQ(sd.size(), 2u);  // the Linear's weight and bias only, as PyTorch's
  EXPECT_TRUE(sd.count("0.weight") && sd.count("0.bias"));
  model.load_state_dict(sd);
  Tensor x = galley::uniform({8, 64}, 1.f, 2.f);
  galley::nn::Dropout own(0.5f, 11), streamed(0.5f, 11);
  streamed.set_random_stream(1);
  const auto m0 = kept(own(x));
  EXPECT_NE(kept(streamed(x)), m0);
  streamed.set_random_stream(0);  // stream 0 restarts from the seed alone
  EXPECT_EQ(kept(streamed(x)), m0);
  EXPECT_EQ(std::string(streamed.repr()), "Dropout(p=0.5)");
}

TEST(Dropout, TheCpuAndTheGpuDrawTheSameMask) {
  REQUIRE_GPU();
  const galley::Device gpu = galley::Device::cuda(0);
  for (galley::DType dt :
       {galley::DType::Float32, galley::DType::BFloat16, galley::DType::Float16}) {
    Tensor x = galley::uniform({(1 << 20) + 3}, 1.f, 2.f).to(dt);
    galley::Generator a(42), b(42);
    Tensor yc = galley::dropout(x, 0.3f, true, a);
    Tensor xg = x.to(gpu);
    xg.set_requires_grad(true);
    Tensor yg = galley::dropout(xg, 0.3f, true, b);
    EXPECT_EQ(yg.device(), gpu);
    EXPECT_EQ(yg.to(galley::Device::cpu()).to(galley::DType::Float32).to_vector(),
              yc.to(galley::DType::Float32).to_vector())
        << galley::dtype_name(dt);
    galley::sum(yg).backward();
    EXPECT_EQ(xg.grad().device(), gpu);
    EXPECT_EQ(kept(xg.grad().to(galley::Device::cpu())), kept(yc));
  }
}

// The GPU sums every window in the CPU's order and divides the same way, and its backward
// gathers in the CPU's scatter order: the same bits, except the global mean's (a warp's tree).
TEST(AvgPool, TheCpuAndTheGpuGiveTheSameBits) {
  REQUIRE_GPU();
  const galley::Device gpu = galley::Device::cuda(0);
  using Pool = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<const char*, Pool>> pools = {
      {"k3s2p1_exclude_ceil",
       [](const Tensor& x) {
         return galley::avg_pool2d(x, {.kernel_size = 3,
                                       .stride = 2,
                                       .padding = 1,
                                       .count_include_pad = false,
                                       .ceil_mode = true});
       }},
      {"k2s2", [](const Tensor& x) { return galley::avg_pool2d(x, {.kernel_size = 2}); }},
      {"adaptive_3x4",
       [](const Tensor& x) {
         return galley::adaptive_avg_pool2d(x, {3, 4});
       }},
      {"global", [](const Tensor& x) {
         return galley::adaptive_avg_pool2d(x, {1, 1});
       }}};
  for (galley::DType dt : {galley::DType::Float32, galley::DType::BFloat16, galley::DType::Float16})
    for (const auto& [name, pool] : pools) {
      const std::string what = std::string(name) + " " + galley::dtype_name(dt);
      Tensor xc = galley::randn({4, 8, 13, 11}).to(dt);
      Tensor xg = xc.to(gpu);
      xc.set_requires_grad(true);
      xg.set_requires_grad(true);
      Tensor yc = pool(xc), yg = pool(xg);
      ASSERT_EQ(yg.device(), gpu);
      Tensor w = galley::randn(yc.shape()).to(dt);
      galley::sum(yc * w).backward();
      galley::sum(yg * w.to(gpu)).backward();
      const auto f = [](const Tensor& t) {
        return t.to(galley::Device::cpu()).to(galley::DType::Float32).to_vector();
      };
      if (std::string(name) == "global")
        expect_near_all(f(yg), f(yc), what);
      else
        EXPECT_EQ(f(yg), f(yc)) << what;
      EXPECT_EQ(f(xg.grad()), f(xc.grad())) << what << " gradient";
    }
}

// The key is drawn on the host when the op runs: a capture would freeze one mask into the graph.
TEST(Dropout, TrainingInsideAGraphCaptureIsAnError) {
  REQUIRE_GPU();
  const galley::Device gpu = galley::Device::cuda(0);
  Tensor x = galley::ones({1024}).to(gpu);
  galley::dropout(x, 0.5f);
  galley::cuda::Graph graph;
  testutil::expect_contains(
      testutil::error_of([&] { graph.capture(gpu, [&] { galley::dropout(x, 0.5f); }); }),
      {"dropout", "capturing a CUDA graph", "cuda:0"});
  galley::cuda::Graph eval;
  Tensor y;
  // Evaluation mode is the identity, which a graph may hold.
  eval.capture(gpu, [&] { y = galley::add(galley::dropout(x, 0.5f, false), 1.f); });
  EXPECT_TRUE(eval.captured());
}

// Ops over a dimension of size 0, in every float dtype, as PyTorch gives them: a convolution of
// an empty batch is empty with zero weight and bias gradients; one of inputs without channels
// (and a linear layer without input features) is its bias, whose gradient is then the sum of
// the output gradient; one without output channels is empty with a zero input gradient; a
// product over an empty inner dimension is zero; a mean over nothing NaN and a sum 0.
TEST(EmptyDimensions, ConvLinearMatmulAndReductionsGiveWhatPyTorchGives) {
  auto gen = galley::Generator(5);
  auto all = [](const Tensor& t, float v) {
    for (float e : t.to(galley::DType::Float32).to_vector())
      if (e != v) return false;
    return true;
  };
  for (galley::DType dt : kFloatTypes) {
    SCOPED_TRACE(galley::dtype_name(dt));
    auto leaf = [&](const galley::Shape& s) {
      return galley::randn(s, gen).to(dt).set_requires_grad(true);
    };
    {  // an empty batch
      Tensor x = leaf({0, 3, 8, 8}), w = leaf({4, 3, 3, 3}), b = leaf({4});
      Tensor y = galley::conv2d(x, w, b, {.padding = 1});
      EXPECT_EQ(y.shape(), (galley::Shape{0, 4, 8, 8}));
      galley::sum(y).backward();
      EXPECT_EQ(x.grad().shape(), x.shape());
      EXPECT_TRUE(all(w.grad(), 0.f));
      EXPECT_TRUE(all(b.grad(), 0.f));
    }
    {  // inputs without channels: the bias everywhere
      Tensor x = leaf({2, 0, 5, 5}), w = leaf({4, 0, 3, 3}), b = leaf({4});
      Tensor y = galley::conv2d(x, w, b);
      ASSERT_EQ(y.shape(), (galley::Shape{2, 4, 3, 3}));
      const auto vy = y.to(galley::DType::Float32).to_vector();
      const auto vb = b.to(galley::DType::Float32).to_vector();
      for (size_t i = 0; i < vy.size(); ++i) ASSERT_EQ(vy[i], vb[(i / 9) % 4]) << i;
      galley::sum(y).backward();
      EXPECT_TRUE(all(b.grad(), 18.f));  // 2 images x 3 x 3 positions
      EXPECT_EQ(w.grad().shape(), w.shape());
    }
    {  // no output channels: empty, and no gradient reaches the input
      Tensor x = leaf({2, 3, 5, 5}), w = leaf({0, 3, 3, 3});
      Tensor y = galley::conv2d(x, w);
      EXPECT_EQ(y.shape(), (galley::Shape{2, 0, 3, 3}));
      galley::sum(y).backward();
      EXPECT_TRUE(all(x.grad(), 0.f));
    }
    {  // a linear layer without input features: its bias on every row
      Tensor x = leaf({4, 0}), w = leaf({3, 0}), b = leaf({3});
      Tensor y = galley::linear(x, w, b);
      ASSERT_EQ(y.shape(), (galley::Shape{4, 3}));
      const auto vy = y.to(galley::DType::Float32).to_vector();
      const auto vb = b.to(galley::DType::Float32).to_vector();
      for (size_t i = 0; i < vy.size(); ++i) ASSERT_EQ(vy[i], vb[i % 3]) << i;
      galley::sum(y).backward();
      EXPECT_TRUE(all(b.grad(), 4.f));
      EXPECT_EQ(x.grad().shape(), x.shape());
      EXPECT_EQ(w.grad().shape(), w.shape());
    }
    EXPECT_TRUE(all(galley::matmul(leaf({3, 0}), leaf({0, 5})), 0.f));
    Tensor empty = galley::randn({3, 0}, gen).to(dt);
    for (float v : galley::mean(empty, 1).to(galley::DType::Float32).to_vector())
      EXPECT_TRUE(std::isnan(v));
    EXPECT_TRUE(all(galley::sum(empty, 1), 0.f));
  }
}

// Sizes and options near 2^62 give errors naming the op, never a crash or a hang: a length or
// split sizes whose sums would wrap, a shape whose element or byte count does not fit 64 bits
// (an OutOfMemoryError, as any allocation too large for the machine), an allocation past half
// the address space, a convolution whose output size would overflow (its span exactly int64's
// largest value, or past it), and a convolution kernel without taps.
TEST(HugeSizes, AreErrorsNotCrashes) {
  const int64_t big = int64_t(1) << 62;
  testutil::expect_contains(
      testutil::error_of([] { galley::narrow(galley::ones({5}), 0, 2, INT64_MAX); }),
      {"narrow", "exceeds dimension 0"});
  testutil::expect_contains(testutil::error_of([] {
                              galley::split(galley::ones({5}), {INT64_MAX, INT64_MAX, 7}, 0);
                            }),
                            {"split", "add up to more than the size 5"});
  // More bytes than an address space holds, more than half of one, or than the machine has:
  // out of memory.
  for (const auto& [shape, dtype] :
       {std::pair{galley::Shape{int64_t(1) << 31, int64_t(1) << 31}, galley::DType::Float32},
        std::pair{galley::Shape{(int64_t(1) << 61) + 1}, galley::DType::Float32},
        std::pair{galley::Shape{int64_t(3) << 60}, galley::DType::UInt8}}) {
    SCOPED_TRACE(galley::shape_str(shape));
    EXPECT_THROW(galley::Tensor::empty(shape, dtype), galley::OutOfMemoryError);
  }
  for (const galley::Shape& shape : {galley::Shape{big, 4}, galley::Shape{big, big, 2}})
    testutil::expect_contains(testutil::error_of([&] { galley::Tensor::empty(shape); }),
                              {galley::shape_str(shape), "more elements than a 64-bit count"});
  EXPECT_EQ(galley::Tensor::empty({0, big, big}).numel(), 0);  // no elements: no overflow
  testutil::expect_contains(testutil::error_of([&] {
                              galley::conv2d(galley::ones({1, 1, 2, 2}), galley::ones({1, 1, 2, 2}),
                                             {}, {.stride = 1, .padding = big});
                            }),
                            {"conv2d", "overflow"});
  testutil::expect_contains(testutil::error_of([&] {
                              galley::conv2d(galley::ones({1, 1, 1, 1}), galley::ones({1, 1, 2, 2}),
                                             {}, {.stride = 1, .padding = big});
                            }),
                            {"conv2d", "overflow"});
  testutil::expect_contains(
      testutil::error_of([] {
        galley::conv2d(galley::ones({1, 1, 4, 4}), galley::ones({1, 1, 0, 0}));
      }),
      {"conv2d", "empty kernel"});
  testutil::expect_contains(testutil::error_of([&] {
                              galley::ones({4}).reshape({big, 4, -1});
                            }),
                            {"reshape", "cannot view"});
}

// Values PyTorch gives at the edges of ops' domains: a class masked out with a -inf logit leaves
// the cross-entropy finite (without smoothing the loss is the negative log-likelihood alone,
// which the unused smoothing term's infinity must not reach); x^0 has a zero gradient at 0 and
// NaN; BatchNorm of an empty batch is empty, leaves the running statistics, and gives the weight
// and bias zero gradients.
TEST(DomainEdges, MaskedLogitsPowZeroAndEmptyBatchNormAsPyTorch) {
  Tensor logits = Tensor::from_vector({-INFINITY, 0.f, 1.f}, {1, 3}).set_requires_grad(true);
  Tensor loss = galley::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{1}, {1}));
  EXPECT_NEAR(loss.item(), 1.3132617f, 1e-6f);  // PyTorch's
  loss.backward();
  const auto g = logits.grad().to_vector();
  EXPECT_EQ(g[0], 0.f);
  EXPECT_NEAR(g[1], -0.7310586f, 1e-6f);
  EXPECT_NEAR(g[2], 0.7310586f, 1e-6f);

  Tensor x = Tensor::from_vector({0.f, 4.f, NAN}, {3}).set_requires_grad(true);
  galley::sum(galley::pow(x, 0.f)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{0.f, 0.f, 0.f}));

  for (galley::DType dt : kFloatTypes) {
    SCOPED_TRACE(galley::dtype_name(dt));
    Tensor e = galley::randn({0, 3, 2, 2}).to(dt).set_requires_grad(true);
    Tensor w = galley::ones({3}).to(dt).set_requires_grad(true);
    Tensor b = galley::zeros({3}).to(dt).set_requires_grad(true);
    Tensor rm = Tensor::from_vector({0.5f, -1.f, 2.f}, {3}), rv = galley::ones({3});
    Tensor y = galley::batch_norm(e, rm, rv, w, b, {.training = true, .relu = true});
    EXPECT_EQ(y.shape(), e.shape());
    EXPECT_EQ(rm.to_vector(), (std::vector<float>{0.5f, -1.f, 2.f}));
    galley::sum(y).backward();
    EXPECT_EQ(w.grad().to(galley::DType::Float32).to_vector(), std::vector<float>(3, 0.f));
    EXPECT_EQ(b.grad().to(galley::DType::Float32).to_vector(), std::vector<float>(3, 0.f));
    EXPECT_EQ(e.grad().shape(), e.shape());
  }
  galley::nn::BatchNorm2D bn(3);
  bn(galley::randn({0, 3, 4, 4}));
  EXPECT_EQ(bn.state_dict().at("num_batches_tracked").to_vector<int64_t>()[0], 1);  // as PyTorch's
}

// Long sums keep their small terms: 2e7 ones sum to 2e7 along a dimension (a float32 running sum
// stops at 2^24), and the gradient of a bias broadcast over ten million rows is their sum.
TEST(Reductions, LongSumsAlongADimensionAndBroadcastGradientsAreExact) {
  const Tensor ones = galley::ones({1, 20000000});
  EXPECT_EQ(galley::sum(ones, 1).item(), 2e7f);
  EXPECT_EQ(galley::mean(ones, 1).item(), 1.f);
  const Tensor tenths = galley::full({2, 3000000}, 0.1f);
  for (float v : galley::sum(tenths, 1).to_vector())
    EXPECT_NEAR(v, 3e5f, 0.05f);  // the double sum of 3e6 float(0.1)s, rounded once
  const Tensor columns = galley::full({3000000, 2}, 0.1f);
  for (float v : galley::sum(columns, 0).to_vector()) EXPECT_NEAR(v, 3e5f, 0.05f);
  Tensor b = galley::zeros({2}).set_requires_grad(true);
  galley::add(galley::zeros({10000000, 2}), b).backward(galley::full({10000000, 2}, 0.1f));
  for (float v : b.grad().to_vector()) EXPECT_NEAR(v, 1e6f, 0.1f);
  // A bias broadcast along the last dimension (each row reduced to one element).
  Tensor c = galley::zeros({2, 1}).set_requires_grad(true);
  galley::add(galley::zeros({2, 10000000}), c).backward(galley::full({2, 10000000}, 0.1f));
  for (float v : c.grad().to_vector()) EXPECT_NEAR(v, 1e6f, 0.1f);
}

// A mean divides (as PyTorch's): 7 / 3 rounds to 2.33333325, 7 * float(1 / 3) to 2.33333349.
TEST(Reductions, AMeanIsTheSumDividedByTheCount) {
  const Tensor x = Tensor::from_vector({1.f, 2.f, 4.f}, {3});
  EXPECT_EQ(galley::mean(x).item(), 7.f / 3.f);
  EXPECT_EQ(galley::mean(x.view({1, 3}), 1).item(), 7.f / 3.f);
  EXPECT_EQ(galley::mean(x.view({3, 1}), 0).item(), 7.f / 3.f);
  // Over a dimension with others inside it, and the backward: g / 3, not g * float(1 / 3).
  Tensor y = Tensor::from_vector({1, 1, 2, 2, 4, 4}, {3, 2}).set_requires_grad(true);
  Tensor m = galley::mean(y, 0);
  EXPECT_EQ(m.to_vector(), (std::vector<float>{7.f / 3.f, 7.f / 3.f}));
  m.backward(Tensor::from_vector({7.f, 7.f}, {2}));
  EXPECT_EQ(y.grad().to_vector(), std::vector<float>(6, 7.f / 3.f));
  Tensor z = Tensor::from_vector({1, 2, 4}, {3}).set_requires_grad(true);
  (galley::mean(z) * 7.f).backward();
  EXPECT_EQ(z.grad().to_vector(), std::vector<float>(3, 7.f / 3.f));
}

// Division by a scalar is a division: 1e-30 / 1e-39 is 1e9 (1e-30 * (1 / 1e-39) overflows),
// 0 / 1e-39 is 0, and 7 / 3 has division's bits.
TEST(ScalarOps, DivisionByAScalarDividesInEveryDtype) {
  const Tensor x = Tensor::from_vector({1e-30f, 0.f, 2.f, 7.f}, {4});
  const std::vector<float> got = (x / 1e-39f).to_vector();
  EXPECT_FLOAT_EQ(got[0], 1e-30f / 1e-39f);
  EXPECT_EQ(got[1], 0.f);
  EXPECT_EQ(got[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ((x / 3.f).to_vector()[3], 7.f / 3.f);
  for (galley::DType d : {galley::DType::BFloat16, galley::DType::Float16}) {
    // The quotient computed in float32 and rounded once.
    const Tensor y = Tensor::from_vector({7.f, -5.f, 0.5f}, {3}).to(d);
    EXPECT_EQ((y / 3.f).to(galley::DType::Float32).to_vector(),
              (galley::div(y.to(galley::DType::Float32), 3.f))
                  .to(d)
                  .to(galley::DType::Float32)
                  .to_vector());
  }
  Tensor a = Tensor::from_vector({1.f, 2.f}, {2}).set_requires_grad(true);
  Tensor q = a / 3.f;
  EXPECT_EQ(q.grad_fn_name(), "div_scalar");
  galley::sum(q).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{1.f / 3.f, 1.f / 3.f}));
}

// Scaling keeps the sign of zero: -(+0) is -0, -0 * 2 is -0 (1 / those is -inf, as in PyTorch).
TEST(ScalarOps, NegationAndScalingKeepTheSignOfZero) {
  const Tensor z = Tensor::from_vector({0.f, -0.f, 1.f}, {3});
  for (const Tensor& t : {galley::neg(z), -z, z * -1.f}) {
    const std::vector<float> v = t.to_vector();
    EXPECT_TRUE(std::signbit(v[0]));
    EXPECT_FALSE(std::signbit(v[1]));
    EXPECT_EQ(v[2], -1.f);
  }
  const std::vector<float> twice = (z * 2.f).to_vector();
  EXPECT_FALSE(std::signbit(twice[0]));
  EXPECT_TRUE(std::signbit(twice[1]));
  // The gradients too: d(-x) of a zero gradient is -0.
  Tensor x = Tensor::from_vector({1.f}, {1}).set_requires_grad(true);
  galley::neg(x).backward(Tensor::from_vector({0.f}, {1}));
  EXPECT_TRUE(std::signbit(x.grad().to_vector()[0]));
}
