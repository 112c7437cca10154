// Finite-difference gradient checks for every differentiable op (the checker is in gradcheck.h).
#include <gtest/gtest.h>

#include "galley/galley.h"
#include "gradcheck.h"

using galley::Shape;
using galley::Tensor;
using testutil::away_from_zero;
using testutil::distinct;
using testutil::gradcheck;
using testutil::rnd;

TEST(GradCheck, Add) {
  gradcheck("add", [](auto& v) { return v[0] + v[1]; }, {rnd({3, 4}, 1), rnd({3, 4}, 2)});
  gradcheck("add broadcast", [](auto& v) { return v[0] + v[1]; },
            {rnd({2, 3, 4}, 1), rnd({3, 1}, 2)});
  gradcheck("add row", [](auto& v) { return v[0] + v[1]; }, {rnd({5, 4}, 1), rnd({4}, 2)});
  gradcheck("add scalar", [](auto& v) { return v[0] + 3.f; }, {rnd({5}, 1)});
}

TEST(GradCheck, Sub) {
  gradcheck("sub", [](auto& v) { return v[0] - v[1]; }, {rnd({2, 3, 4}, 3), rnd({1, 3, 1}, 4)});
  gradcheck("rsub scalar", [](auto& v) { return 2.f - v[0]; }, {rnd({4}, 3)});
}

TEST(GradCheck, Mul) {
  gradcheck("mul", [](auto& v) { return v[0] * v[1]; }, {rnd({3, 4}, 5), rnd({3, 4}, 6)});
  gradcheck("mul broadcast", [](auto& v) { return v[0] * v[1]; },
            {rnd({4, 1, 3}, 5), rnd({2, 1}, 6)});
  gradcheck("mul scalar", [](auto& v) { return v[0] * 1.5f; }, {rnd({6}, 5)});
  gradcheck("div scalar", [](auto& v) { return v[0] / 1.5f; }, {rnd({6}, 5)});
  gradcheck("square", [](auto& v) { return v[0] * v[0]; }, {rnd({6}, 9)});
}

TEST(GradCheck, Div) {
  Tensor b = galley::rand({3, 4}) + 1.f;
  gradcheck("div", [](auto& v) { return v[0] / v[1]; }, {rnd({3, 4}, 7), b});
  Tensor c = galley::rand({4}) + 1.f;
  gradcheck("div broadcast", [](auto& v) { return v[0] / v[1]; }, {rnd({3, 4}, 7), c});
}

TEST(GradCheck, Unary) {
  gradcheck("neg", [](auto& v) { return -v[0]; }, {rnd({5}, 11)});
  gradcheck("exp", [](auto& v) { return galley::exp(v[0]); }, {rnd({5}, 12, 0.5f)});
  gradcheck("log", [](auto& v) { return galley::log(v[0]); }, {galley::rand({5}) + 1.f});
  gradcheck("pow", [](auto& v) { return galley::pow(v[0], 3.f); }, {rnd({5}, 13)});
  gradcheck("relu", [](auto& v) { return galley::relu(v[0]); }, {away_from_zero({4, 5}, 14)});
}

TEST(GradCheck, BiasRelu) {
  // x stays 0.1 away from 0 and the bias within +-0.03, so x + b never crosses the kink.
  gradcheck("bias_relu channels", [](auto& v) { return galley::bias_relu(v[0], v[1]); },
            {away_from_zero({2, 3, 4, 5}, 15), rnd({3}, 16, 0.01f)});
  gradcheck("bias_relu features", [](auto& v) { return galley::bias_relu(v[0], v[1], -1); },
            {away_from_zero({6, 7}, 17), rnd({7}, 18, 0.01f)});
}

TEST(GradCheck, MatmulAndLinear) {
  gradcheck("matmul", [](auto& v) { return galley::matmul(v[0], v[1]); },
            {rnd({3, 5}, 21), rnd({5, 4}, 22)});
  gradcheck("linear", [](auto& v) { return galley::linear(v[0], v[1], v[2]); },
            {rnd({4, 6}, 23), rnd({3, 6}, 24), rnd({3}, 25)});
  gradcheck("linear 3-d", [](auto& v) { return galley::linear(v[0], v[1]); },
            {rnd({2, 4, 6}, 26), rnd({3, 6}, 27)});
}

TEST(GradCheck, Conv2d) {
  struct Case {
    Shape x, w;
    galley::Conv2dOptions o;
    bool bias;
  };
  std::vector<Case> cases = {
      {{2, 3, 7, 7}, {4, 3, 3, 3}, {}, true},
      {{1, 2, 8, 9}, {3, 2, 3, 3}, {.stride = 2, .padding = 1}, true},
      {{1, 2, 9, 9}, {2, 2, 3, 3}, {.padding = 2, .dilation = 2}, false},
      {{2, 4, 6, 6}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}, true},
      {{2, 3, 5, 5}, {4, 3, 1, 1}, {}, true},
      {{1, 1, 6, 5}, {2, 1, 2, 3}, {.stride = 2}, true},
      // Enough channels and images for the direct path's forward, input and weight gradients
      // (where the build has it and there are at most two threads).
      {{2, 16, 5, 5}, {4, 16, 3, 3}, {.padding = 1}, true},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    auto o = c.o;
    std::vector<Tensor> in = {rnd(c.x, 30 + i), rnd(c.w, 40 + i, 0.5f)};
    if (c.bias) in.push_back(rnd({c.w[0]}, 50 + i));
    gradcheck(
        ("conv2d case " + std::to_string(i)).c_str(),
        [o](auto& v) { return galley::conv2d(v[0], v[1], v.size() > 2 ? v[2] : Tensor(), o); }, in);
  }
}

TEST(GradCheck, MaxPool2d) {
  gradcheck("max_pool2d 2/2", [](auto& v) { return galley::max_pool2d(v[0], {.kernel_size = 2}); },
            {distinct({2, 3, 6, 6}, 61)});
  gradcheck("max_pool2d 3/2 pad 1",
            [](auto& v) {
              return galley::max_pool2d(v[0], {.kernel_size = 3, .stride = 2, .padding = 1});
            },
            {distinct({1, 2, 7, 7}, 62)});
  gradcheck("max_pool2d 3/1",
            [](auto& v) { return galley::max_pool2d(v[0], {.kernel_size = 3, .stride = 1}); },
            {distinct({1, 2, 5, 6}, 63)});
}

TEST(GradCheck, ShapeOps) {
  gradcheck("flatten", [](auto& v) { return galley::flatten(v[0], 1) * 2.f; },
            {rnd({2, 3, 4}, 71)});
  gradcheck("reshape",
            [](auto& v) {
              return galley::reshape(v[0], {4, -1});
            },
            {rnd({2, 3, 4}, 72)});
}

TEST(GradCheck, Reductions) {
  gradcheck("sum", [](auto& v) { return galley::sum(v[0]); }, {rnd({3, 4}, 81)});
  gradcheck("mean", [](auto& v) { return galley::mean(v[0]); }, {rnd({3, 4}, 82)});
  gradcheck("sum dim", [](auto& v) { return galley::sum(v[0], 1); }, {rnd({3, 4, 2}, 83)});
  gradcheck("mean dim keepdim", [](auto& v) { return galley::mean(v[0], -1, true); },
            {rnd({3, 4, 2}, 84)});
}

TEST(GradCheck, Softmax) {
  gradcheck("softmax", [](auto& v) { return galley::softmax(v[0], 1); }, {rnd({3, 5}, 91)});
  gradcheck("softmax dim 1 of 3", [](auto& v) { return galley::softmax(v[0], 1); },
            {rnd({2, 4, 3}, 92)});
  gradcheck("log_softmax", [](auto& v) { return galley::log_softmax(v[0], -1); },
            {rnd({3, 5}, 93)});
}

TEST(GradCheck, CrossEntropy) {
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 3, 1, 4, 2, 3}, {6});
  for (auto red : {galley::Reduction::Mean, galley::Reduction::Sum, galley::Reduction::None}) {
    gradcheck("cross_entropy",
              [&](auto& v) { return galley::cross_entropy(v[0], labels, {.reduction = red}); },
              {rnd({6, 5}, 101)});
  }
  gradcheck("cross_entropy smoothing",
            [&](auto& v) { return galley::cross_entropy(v[0], labels, {.label_smoothing = 0.1f}); },
            {rnd({6, 5}, 102)});
  Tensor ignored = Tensor::from_vector(std::vector<int64_t>{0, -100, 1, 4, -100, 3}, {6});
  gradcheck("cross_entropy ignore_index",
            [&](auto& v) { return galley::cross_entropy(v[0], ignored); }, {rnd({6, 5}, 103)});
}

TEST(GradCheck, SimpleCnnComposite) {
  // The whole SimpleCNN-shaped chain on a small input: conv -> relu -> pool -> flatten -> linear ->
  // CE.
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 0}, {2});
  gradcheck(
      "conv-relu-pool-linear-ce",
      [&](auto& v) {
        auto h =
            galley::max_pool2d(galley::relu(galley::conv2d(v[0], v[1], v[2])), {.kernel_size = 2});
        return galley::cross_entropy(galley::linear(galley::flatten(h, 1), v[3], v[4]), labels);
      },
      {rnd({2, 3, 6, 6}, 111), rnd({4, 3, 3, 3}, 112, 0.3f), rnd({4}, 113, 0.1f),
       rnd({2, 16}, 114, 0.3f), rnd({2}, 115, 0.1f)},
      7, 1e-3f, 3e-2f);
}
