// Optimizers and schedules against PyTorch's update rules, written out here in double precision.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace {

using galley::Shape;
using galley::Tensor;
using galley::optim::Adam;
using galley::optim::AdamOptions;
using galley::optim::AdamW;
using galley::optim::SGD;
using galley::optim::SGDOptions;

using testutil::error_of;

using testutil::expect_contains;

Tensor leaf(const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  Tensor t = Tensor::from_vector(f, {static_cast<int64_t>(f.size())});
  t.set_requires_grad();
  return t;
}

void set_grad(Tensor& p, const std::vector<double>& g) {
  std::vector<float> f(g.begin(), g.end());
  p.set_grad(Tensor::from_vector(f, p.shape()));
}

void expect_close(const Tensor& t, const std::vector<double>& want, const std::string& what) {
  std::vector<float> got = t.to_vector();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6 + 1e-5 * std::fabs(want[i])) << what << ", element " << i;
}

// Gradients that change from step to step (including a zero and a sign flip).
std::vector<double> grad_at(int step) {
  return {0.1 * step, -0.3, 0.5 / step, step % 2 ? 1.0 : -0.02, 0.0};
}
const std::vector<double> kInit{0.5, -1.0, 2.0, 0.25, -0.75};

// torch.optim.Adam / AdamW, element by element in double precision.
struct RefAdam {
  AdamOptions o;
  bool decoupled;
  std::vector<double> p, m, v, vmax;
  int t = 0;

  RefAdam(AdamOptions opt, bool dec, std::vector<double> init)
      : o(opt), decoupled(dec), p(init), m(init.size()), v(init.size()), vmax(init.size()) {}

  void step(const std::vector<double>& grad) {
    ++t;
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    const double wd = o.weight_decay.value_or(decoupled ? 1e-2 : 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = o.maximize ? -grad[i] : grad[i];
      if (decoupled) {
        p[i] *= 1 - o.learning_rate * wd;
      } else {
        g += wd * p[i];
      }
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      double vv = v[i];
      if (o.amsgrad) {
        vmax[i] = std::max(vmax[i], v[i]);
        vv = vmax[i];
      }
      const double denom = std::sqrt(vv) / std::sqrt(bc2) + o.eps;
      p[i] -= o.learning_rate / bc1 * m[i] / denom;
    }
  }
};

// torch.optim.SGD, element by element in double precision.
struct RefSGD {
  SGDOptions o;
  std::vector<double> p, buf;
  bool first = true;

  RefSGD(SGDOptions opt, std::vector<double> init) : o(opt), p(init), buf(init.size()) {}

  void step(const std::vector<double>& grad) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = (o.maximize ? -grad[i] : grad[i]) + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = first ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.learning_rate * d;
    }
    first = false;
  }
};

void run_adam_against_reference(AdamOptions o, bool decoupled, int steps) {
  Tensor p = leaf(kInit);
  std::unique_ptr<Adam> opt = decoupled ? std::make_unique<AdamW>(std::vector<Tensor>{p}, o)
                                        : std::make_unique<Adam>(std::vector<Tensor>{p}, o);
  RefAdam ref(o, decoupled, kInit);
  for (int s = 1; s <= steps; ++s) {
    set_grad(p, grad_at(s));
    opt->step();
    ref.step(grad_at(s));
    expect_close(p, ref.p, "step " + std::to_string(s));
    EXPECT_EQ(opt->state(p).step, s);
  }
  expect_close(opt->state(p).exp_avg, ref.m, "exp_avg");
  expect_close(opt->state(p).exp_avg_sq, ref.v, "exp_avg_sq");
  if (o.amsgrad) expect_close(opt->state(p).max_exp_avg_sq, ref.vmax, "max_exp_avg_sq");
}

// ---------------------------------------------------------------------------------------------
// Adam

TEST(Adam, FirstStepClosedForm) {
  // After one step m_hat = g and v_hat = g^2, so p1 = p0 - lr * g / (|g| + eps).
  Tensor p = leaf({1.0, -2.0, 0.5, 3.0});
  const std::vector<double> g{0.2, -0.4, 1e-3, 0.0};
  set_grad(p, g);
  Adam opt({p}, {.learning_rate = 0.1});
  opt.step();
  std::vector<double> want{1.0, -2.0, 0.5, 3.0};
  for (size_t i = 0; i < g.size(); ++i) want[i] -= 0.1 * g[i] / (std::fabs(g[i]) + 1e-8);
  expect_close(p, want, "first step");
  EXPECT_EQ(opt.state(p).step, 1);
}

// 1 - beta in double, then rounded (as PyTorch's Python scalars): in float32, 1 - float(0.99999)
// is 1.00136e-5, and the first step moved p to -0.99932 instead of -1.
TEST(Adam, OneMinusBetaIsTakenInDouble) {
  Tensor p = leaf({0.0});
  set_grad(p, {1.0});
  Adam opt({p}, {.learning_rate = 1.0, .beta2 = 0.99999});
  opt.step();
  EXPECT_EQ(opt.state(p).exp_avg_sq.to_vector()[0], static_cast<float>(1.0 - 0.99999));
  EXPECT_NEAR(p.to_vector()[0], -1.f, 1e-6f);
}

// A weight decay of zero adds nothing: an infinite parameter stays infinite (0 * inf is NaN).
TEST(Optimizer, AZeroWeightDecayLeavesAnInfiniteParameterInfinite) {
  Tensor a = leaf({INFINITY}), b = leaf({-INFINITY}), c = leaf({INFINITY});
  for (Tensor* t : {&a, &b, &c}) set_grad(*t, {1.0});
  SGD sgd({a}, {.learning_rate = 0.1, .momentum = 0.9});
  Adam adam({b}, {.learning_rate = 0.1});
  AdamW adamw({c}, {.learning_rate = 0.1, .weight_decay = 0.0});
  for (int i = 0; i < 2; ++i) sgd.step(), adam.step(), adamw.step();
  EXPECT_EQ(a.to_vector()[0], INFINITY);
  EXPECT_EQ(b.to_vector()[0], -INFINITY);
  EXPECT_EQ(c.to_vector()[0], INFINITY);
  EXPECT_FALSE(std::isnan(sgd.state_dict().tensors.at("state.0.momentum_buffer").to_vector()[0]));
}

TEST(Adam, MatchesPyTorchFormula) {
  run_adam_against_reference({.learning_rate = 0.01}, false, 6);
}

TEST(Adam, CustomBetasAndEps) {
  run_adam_against_reference({.learning_rate = 0.05, .beta1 = 0.5, .beta2 = 0.9, .eps = 1e-3},
                             false, 6);
}

TEST(Adam, L2WeightDecay) {
  run_adam_against_reference({.learning_rate = 0.01, .weight_decay = 0.1}, false, 6);
}

TEST(Adam, AmsGrad) {
  // beta2 = 0.9 and shrinking gradients make v fall, so the running maximum matters.
  run_adam_against_reference({.learning_rate = 0.01, .beta2 = 0.9, .amsgrad = true}, false, 6);
  run_adam_against_reference(
      {.learning_rate = 0.01, .beta2 = 0.9, .weight_decay = 0.05, .amsgrad = true}, false, 6);
}

TEST(Adam, AmsGradDiffersWhenSecondMomentFalls) {
  AdamOptions o{.learning_rate = 0.1, .beta2 = 0.9};
  AdamOptions oa = o;
  oa.amsgrad = true;
  Tensor a = leaf({1.0}), b = leaf({1.0});
  Adam plain({a}, o), ams({b}, oa);
  for (double g : {1.0, 0.01, 0.01}) {
    set_grad(a, {g});
    set_grad(b, {g});
    plain.step();
    ams.step();
  }
  EXPECT_GT(std::fabs(a.item() - b.item()), 1e-4);
}

TEST(AdamW, MatchesPyTorchFormula) {
  run_adam_against_reference({.learning_rate = 0.01, .weight_decay = 0.1}, true, 6);
  run_adam_against_reference({.learning_rate = 0.01, .weight_decay = 0.1, .amsgrad = true}, true,
                             6);
}

TEST(AdamW, DefaultWeightDecay) {
  Tensor p = leaf({1.0});
  AdamW opt({p});
  EXPECT_DOUBLE_EQ(*opt.options().weight_decay, 1e-2);
  EXPECT_DOUBLE_EQ(opt.options().learning_rate, 1e-3);
  // Other options given, the weight decay left out: still AdamW's default, as
  // torch.optim.AdamW(lr=3e-4) has; given, it is taken (zero included). Adam's default is 0.
  EXPECT_DOUBLE_EQ(*AdamW({p}, {.learning_rate = 3e-4}).options().weight_decay, 1e-2);
  EXPECT_DOUBLE_EQ(*AdamW({p}, {.learning_rate = 3e-4, .amsgrad = true}).options().weight_decay,
                   1e-2);
  EXPECT_DOUBLE_EQ(*AdamW({p}, {.weight_decay = 0.0}).options().weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(*AdamW({p}, {.weight_decay = 0.3}).options().weight_decay, 0.3);
  EXPECT_DOUBLE_EQ(*Adam({p}, {.learning_rate = 3e-4}).options().weight_decay, 0.0);
  EXPECT_EQ(AdamW({p}).name(), "AdamW");
  // The default decays: one step with a zero gradient shrinks p by lr * 1e-2.
  set_grad(p, {0.0});
  AdamW({p}, {.learning_rate = 0.5}).step();
  EXPECT_NEAR(p.item(), 1.0 - 0.5 * 1e-2, 1e-7);
}

// maximize: the update takes the negated gradient before the weight decay (torch.optim's).
TEST(Adam, Maximize) {
  run_adam_against_reference({.learning_rate = 0.01, .maximize = true}, false, 6);
  run_adam_against_reference(
      {.learning_rate = 0.01, .beta2 = 0.9, .weight_decay = 0.1, .amsgrad = true, .maximize = true},
      false, 6);
  run_adam_against_reference({.learning_rate = 0.01, .maximize = true}, true, 6);
  run_adam_against_reference({.learning_rate = 0.01, .weight_decay = 0.1, .maximize = true}, true,
                             6);
  // One step climbs: p moves along the gradient.
  Tensor p = leaf({1.0, 1.0});
  set_grad(p, {0.5, -0.5});
  Adam({p}, {.learning_rate = 0.1, .maximize = true}).step();
  expect_close(p, {1.1, 0.9}, "ascent");
}

TEST(AdamW, DecoupledDecayDiffersFromL2) {
  AdamOptions o{.learning_rate = 0.1, .weight_decay = 0.5};
  Tensor a = leaf({2.0, -1.0}), b = leaf({2.0, -1.0});
  Adam l2({a}, o);
  AdamW dec({b}, o);
  set_grad(a, {0.1, 0.1});
  set_grad(b, {0.1, 0.1});
  l2.step();
  dec.step();
  // Adam: g' = 0.1 + 0.5 p, so the first step is -lr * sign(g'); AdamW shrinks p by lr*wd
  // first and then steps by -lr * sign(g).
  expect_close(a, {2.0 - 0.1, -1.0 + 0.1}, "adam l2");
  expect_close(b, {2.0 * 0.95 - 0.1, -1.0 * 0.95 - 0.1}, "adamw");
}

TEST(Adam, ZeroEps) {
  Tensor p = leaf({1.0});
  Adam opt({p}, {.learning_rate = 0.1, .eps = 0.0});
  set_grad(p, {0.5});
  opt.step();
  EXPECT_NEAR(p.item(), 0.9, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// SGD

void run_sgd_against_reference(SGDOptions o, int steps) {
  Tensor p = leaf(kInit);
  SGD opt({p}, o);
  RefSGD ref(o, kInit);
  for (int s = 1; s <= steps; ++s) {
    set_grad(p, grad_at(s));
    opt.step();
    ref.step(grad_at(s));
    expect_close(p, ref.p, "step " + std::to_string(s));
  }
}

TEST(SGD, Plain) {
  Tensor p = leaf({1.0, -2.0});
  SGD opt({p}, {.learning_rate = 0.5});
  set_grad(p, {0.2, -0.4});
  opt.step();
  expect_close(p, {0.9, -1.8}, "step 1");
  set_grad(p, {1.0, 1.0});
  opt.step();
  expect_close(p, {0.4, -2.3}, "step 2");
  run_sgd_against_reference({.learning_rate = 0.1}, 5);
}

TEST(SGD, MomentumByHand) {
  // buf1 = g1; buf2 = 0.9 buf1 + g2; p -= lr * buf.
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1, .momentum = 0.9});
  set_grad(p, {1.0});
  opt.step();
  expect_close(p, {0.9}, "step 1");
  set_grad(p, {0.5});
  opt.step();
  expect_close(p, {0.9 - 0.1 * (0.9 + 0.5)}, "step 2");
  set_grad(p, {0.0});
  opt.step();
  expect_close(p, {0.76 - 0.1 * (0.9 * 1.4)}, "step 3");
}

TEST(SGD, Momentum) {
  run_sgd_against_reference({.learning_rate = 0.1, .momentum = 0.9}, 6);
}

TEST(SGD, Dampening) {
  // The first step takes the raw gradient; dampening applies from the second on.
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0, .momentum = 0.5, .dampening = 0.25});
  set_grad(p, {1.0});
  opt.step();
  expect_close(p, {0.0}, "step 1");
  set_grad(p, {1.0});
  opt.step();
  expect_close(p, {0.0 - (0.5 * 1.0 + 0.75 * 1.0)}, "step 2");
  run_sgd_against_reference({.learning_rate = 0.1, .momentum = 0.9, .dampening = 0.3}, 6);
}

TEST(SGD, Nesterov) {
  // d = g + momentum * buf.
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1, .momentum = 0.9, .nesterov = true});
  set_grad(p, {1.0});
  opt.step();
  expect_close(p, {1.0 - 0.1 * (1.0 + 0.9 * 1.0)}, "step 1");
  set_grad(p, {0.5});
  opt.step();
  const double buf2 = 0.9 * 1.0 + 0.5;
  expect_close(p, {0.81 - 0.1 * (0.5 + 0.9 * buf2)}, "step 2");
  run_sgd_against_reference({.learning_rate = 0.05, .momentum = 0.8, .nesterov = true}, 6);
}

TEST(SGD, Maximize) {
  run_sgd_against_reference({.learning_rate = 0.1, .maximize = true}, 4);
  run_sgd_against_reference({.learning_rate = 0.1,
                             .momentum = 0.9,
                             .dampening = 0.3,
                             .weight_decay = 0.2,
                             .maximize = true},
                            6);
  run_sgd_against_reference({.learning_rate = 0.05,
                             .momentum = 0.8,
                             .weight_decay = 0.1,
                             .nesterov = true,
                             .maximize = true},
                            6);
}

TEST(SGD, WeightDecay) {
  run_sgd_against_reference({.learning_rate = 0.1, .weight_decay = 0.2}, 4);
  run_sgd_against_reference({.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 0.2}, 4);
  run_sgd_against_reference(
      {.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 0.2, .nesterov = true}, 4);
}

// ---------------------------------------------------------------------------------------------
// Common behaviour

TEST(Optimizer, ParametersWithoutGradAreSkipped) {
  Tensor a = leaf({1.0, 2.0}), b = leaf({3.0});
  Adam opt({a, b}, {.learning_rate = 0.1});
  set_grad(a, {0.5, 0.5});
  opt.step();
  EXPECT_EQ(b.to_vector(), (std::vector<float>{3.f}));
  EXPECT_EQ(opt.state(a).step, 1);
  EXPECT_EQ(opt.state(b).step, 0);
  EXPECT_FALSE(opt.state(b).exp_avg.defined());
  // b's first update later is a first Adam step: bias correction from step 1.
  opt.clear_grad();
  set_grad(b, {2.0});
  opt.step();
  expect_close(b, {3.0 - 0.1}, "b");
  EXPECT_EQ(opt.state(a).step, 1);
  EXPECT_EQ(opt.state(b).step, 1);
}

TEST(Optimizer, SGDMomentumStartsWhenAParameterFirstGetsAGradient) {
  Tensor a = leaf({1.0}), b = leaf({1.0});
  SGD opt({a, b}, {.learning_rate = 0.1, .momentum = 0.9});
  set_grad(a, {1.0});
  opt.step();
  opt.step();  // a's gradient is still there: buf = 0.9 + 1
  expect_close(a, {1.0 - 0.1 - 0.19}, "a");
  EXPECT_EQ(b.to_vector(), (std::vector<float>{1.f}));
  set_grad(b, {1.0});
  a.set_grad(Tensor());
  opt.step();
  expect_close(b, {0.9}, "b");
  expect_close(a, {1.0 - 0.1 - 0.19}, "a after");
}

TEST(Optimizer, StateStepCounts) {
  Tensor p = leaf({1.0});
  Adam opt({p});
  EXPECT_EQ(opt.state(p).step, 0);
  for (int i = 1; i <= 4; ++i) {
    set_grad(p, {0.1});
    opt.step();
    EXPECT_EQ(opt.state(p).step, i);
  }
  opt.clear_grad();
  opt.step();
  EXPECT_EQ(opt.state(p).step, 4);
  Tensor other = leaf({1.0});
  EXPECT_THROW(opt.state(other), galley::Error);
  EXPECT_THROW(opt.index_of(other), galley::Error);
  EXPECT_EQ(opt.index_of(p), 0u);
}

TEST(Optimizer, ClearGrad) {
  Tensor a = leaf({1.0}), b = leaf({2.0});
  SGD opt({a, b});
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.clear_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  set_grad(a, {1.0});
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  opt.step();  // nothing to do
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1.f}));
}

TEST(Optimizer, StepRecordsNoGraphAndKeepsHandles) {
  Tensor p = leaf({1.0, 2.0});
  void* data = p.raw_data();
  SGD opt({p}, {.learning_rate = 0.1, .momentum = 0.9});
  galley::sum(p * p).backward();
  opt.step();
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
  EXPECT_EQ(p.raw_data(), data);
  EXPECT_TRUE(opt.parameters()[0].is_same(p));
  expect_close(p, {1.0 - 0.2, 2.0 - 0.4}, "p");
}

TEST(Optimizer, InvalidOptionsThrow) {
  Tensor p = leaf({1.0});
  EXPECT_THROW(SGD({p}, {.learning_rate = -0.1}), galley::Error);
  EXPECT_THROW(Adam({p}, {.learning_rate = -1e-3}), galley::Error);
  EXPECT_THROW(Adam({p}, {.beta1 = 1.0}), galley::Error);
  EXPECT_THROW(Adam({p}, {.beta2 = 1.0}), galley::Error);
  EXPECT_THROW(Adam({p}, {.beta1 = 1.5}), galley::Error);
  EXPECT_THROW(Adam({p}, {.beta1 = -0.1}), galley::Error);
  EXPECT_THROW(Adam({p}, {.eps = -1e-8}), galley::Error);
  EXPECT_THROW(Adam({p}, {.weight_decay = -0.1}), galley::Error);
  EXPECT_THROW(AdamW({p}, {.beta2 = 1.0}), galley::Error);
  std::string msg = error_of([&] { SGD({p}, {.nesterov = true}); });
  expect_contains(msg, {"Nesterov"});
  EXPECT_THROW(SGD({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), galley::Error);
  EXPECT_THROW(SGD({p}, {.momentum = -0.9}), galley::Error);
  EXPECT_THROW(SGD({p}, {.weight_decay = -1.0}), galley::Error);
  EXPECT_NO_THROW(SGD({p}, {.momentum = 0.9, .nesterov = true}));
  EXPECT_NO_THROW(Adam({p}, {.learning_rate = 0.0, .beta1 = 0.0, .beta2 = 0.0}));
}

TEST(Optimizer, InvalidParametersThrow) {
  EXPECT_THROW(SGD({}), galley::Error);
  EXPECT_THROW(SGD({Tensor()}), galley::Error);
  Tensor p = leaf({1.0});
  EXPECT_THROW(SGD({p, p}), galley::Error);
  Tensor nonleaf = p * 2.f;
  EXPECT_THROW(Adam({nonleaf}), galley::Error);
  EXPECT_THROW(Adam({galley::zeros({2}, galley::DType::Int64)}), galley::Error);
}

TEST(Optimizer, SetLearningRate) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.1);
  opt.set_learning_rate(0.5);
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.5);
  set_grad(p, {1.0});
  opt.step();
  expect_close(p, {0.5}, "after lr change");
  EXPECT_THROW(opt.set_learning_rate(-1.0), galley::Error);
  testutil::expect_contains(
      testutil::error_of([&] { opt.set_learning_rate(std::numeric_limits<double>::infinity()); }),
      {"learning rate inf must be finite"});
  testutil::expect_contains(testutil::error_of([&] { opt.set_learning_rate(std::nan("")); }),
                            {"must be finite"});
  testutil::expect_contains(
      testutil::error_of(
          [] { SGD({leaf({1.0})}, {.learning_rate = std::numeric_limits<double>::infinity()}); }),
      {"must be finite"});
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.5);
  // A saved step count past 64 bits is an error, not the largest one.
  galley::StateDict sd;
  sd.values["state.0.step"] = "99999999999999999999";
  testutil::expect_contains(testutil::error_of([&] { sd.get_int("state.0.step", "test"); }),
                            {"state.0.step", "past the range"});
}

TEST(Optimizer, TrainsALinearModel) {
  // y = 3x - 1 with Adam on a Linear(1, 1).
  galley::manual_seed(0);
  galley::nn::Linear l(1, 1);
  Adam opt(l.parameters(), {.learning_rate = 0.05});
  Tensor x = Tensor::from_vector(std::vector<float>{-1, -0.5f, 0, 0.5f, 1, 2}, {6, 1});
  Tensor y = Tensor::from_vector(std::vector<float>{-4, -2.5f, -1, 0.5f, 2, 5}, {6, 1});
  float loss = 0;
  for (int i = 0; i < 500; ++i) {
    opt.zero_grad();
    Tensor d = l(x) - y;
    Tensor lt = galley::mean(d * d);
    lt.backward();
    opt.step();
    loss = lt.item();
  }
  EXPECT_LT(loss, 1e-4);
  EXPECT_NEAR(l.weight().item(), 3.f, 1e-2);
  EXPECT_NEAR(l.bias().item(), -1.f, 1e-2);
}

// ---------------------------------------------------------------------------------------------
// Schedules

TEST(Schedulers, StepLR) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  galley::optim::StepLR sched(opt, 3, 0.5);
  EXPECT_EQ(sched.last_epoch(), 0);
  EXPECT_DOUBLE_EQ(sched.lr_at(0), 0.1);
  for (int e = 1; e <= 10; ++e) {
    sched.step();
    EXPECT_EQ(sched.last_epoch(), e);
    const double want = 0.1 * std::pow(0.5, e / 3);
    EXPECT_NEAR(opt.learning_rate(), want, 1e-12) << "epoch " << e;
    EXPECT_NEAR(sched.lr_at(e), want, 1e-12);
  }
  EXPECT_THROW(galley::optim::StepLR(opt, 0), galley::Error);
  EXPECT_THROW(galley::optim::StepLR(opt, 2, 0.0), galley::Error);
}

TEST(Schedulers, StepLRDefaultGamma) {
  Tensor p = leaf({1.0});
  Adam opt({p}, {.learning_rate = 1.0});
  galley::optim::StepLR sched(opt, 2);
  sched.step();
  EXPECT_NEAR(opt.learning_rate(), 1.0, 1e-12);
  sched.step();
  EXPECT_NEAR(opt.learning_rate(), 0.1, 1e-12);
}

TEST(Schedulers, CosineAnnealingLR) {
  Tensor p = leaf({1.0});
  Adam opt({p}, {.learning_rate = 0.1});
  const double base = 0.1, eta_min = 0.001;
  const int t_max = 10;
  galley::optim::CosineAnnealingLR sched(opt, t_max, eta_min);
  EXPECT_NEAR(sched.lr_at(0), base, 1e-12);
  for (int e = 1; e <= t_max; ++e) {
    sched.step();
    const double want = eta_min + (base - eta_min) * (1 + std::cos(M_PI * e / t_max)) / 2;
    EXPECT_NEAR(opt.learning_rate(), want, 1e-12) << "epoch " << e;
  }
  EXPECT_NEAR(opt.learning_rate(), eta_min, 1e-12);
  EXPECT_NEAR(sched.lr_at(t_max / 2), (base + eta_min) / 2, 1e-12);
  EXPECT_THROW(galley::optim::CosineAnnealingLR(opt, 0), galley::Error);
}

TEST(Schedulers, BaseRateIsTheOptimizersAtConstruction) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  opt.set_learning_rate(0.4);
  galley::optim::CosineAnnealingLR sched(opt, 4);
  sched.step();
  EXPECT_NEAR(opt.learning_rate(), 0.4 * (1 + std::cos(M_PI / 4)) / 2, 1e-12);
}

using galley::optim::AnnealStrategy;
using galley::optim::LinearLR;
using galley::optim::LRScheduler;
using galley::optim::OneCycleLR;
using galley::optim::PlateauMode;
using galley::optim::ReduceLROnPlateau;
using galley::optim::SequentialLR;
using galley::optim::ThresholdMode;

// An option that is NaN or infinite is refused when the optimizer or schedule is made, naming
// the option (a NaN dampening used to turn every parameter into NaN at the second step).
TEST(Optimizers, NonFiniteOptionsAreRefusedByName) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto opt = [] { return SGD({leaf({1.0})}, {.learning_rate = 0.1}); };
  expect_contains(error_of([&] { SGD({leaf({1.0})}, {.momentum = 0.9, .dampening = nan}); }),
                  {"SGD", "dampening", "finite"});
  expect_contains(error_of([&] { SGD({leaf({1.0})}, {.momentum = inf}); }),
                  {"SGD", "momentum", "finite"});
  expect_contains(error_of([&] { SGD({leaf({1.0})}, {.weight_decay = inf}); }),
                  {"SGD", "weight_decay", "finite"});
  expect_contains(error_of([&] { SGD({leaf({1.0})}, {.learning_rate = -0.1}); }),
                  {"learning_rate", "-0.1", "not negative"});
  expect_contains(error_of([&] { Adam({leaf({1.0})}, {.eps = inf}); }), {"Adam: eps inf"});
  expect_contains(error_of([&] { Adam({leaf({1.0})}, {.eps = nan}); }), {"Adam: eps", "finite"});
  expect_contains(error_of([&] { AdamW({leaf({1.0})}, {.beta1 = 1.0}); }), {"AdamW: betas"});
  expect_contains(error_of([&] { AdamW({leaf({1.0})}, {.weight_decay = inf}); }),
                  {"AdamW: weight_decay"});
  {
    SGD o = opt();
    expect_contains(error_of([&] { o.set_learning_rate(nan); }), {"SGD: learning rate nan"});
    expect_contains(error_of([&] { OneCycleLR(o, {.max_lr = inf, .total_steps = 4}); }),
                    {"OneCycleLR: max_lr inf"});
    expect_contains(
        error_of([&] { OneCycleLR(o, {.max_lr = 1.0, .total_steps = 4, .div_factor = inf}); }),
        {"OneCycleLR: div_factor inf"});
    expect_contains(error_of([&] { galley::optim::CosineAnnealingLR(o, 5, inf); }),
                    {"CosineAnnealingLR: eta_min inf"});
    expect_contains(error_of([&] { galley::optim::StepLR(o, 2, nan); }), {"StepLR: gamma nan"});
    expect_contains(error_of([&] { ReduceLROnPlateau(o, {.min_lr = inf}); }),
                    {"ReduceLROnPlateau: min_lr inf"});
  }
}

// Two schedules stepped together on one optimizer, the second made after the first moved the
// rate: the second's base is the optimizer's initial rate (PyTorch's initial_lr), not the moved
// one. The sequences are PyTorch's (1.13 and 2.15 agree), from
//   o = SGD([w], lr=0.1); a = <first>; b = <second>; then a.step(); b.step() each period.
// Before, the second took the moved rate as its base: every LambdaLR rate was half PyTorch's,
// and the cosines peaked at 0.05.
TEST(Schedulers, ASecondScheduleStartsFromTheInitialRate) {
  struct Case {
    const char* name;
    std::function<std::vector<std::unique_ptr<LRScheduler>>(SGD&)> make;
    std::vector<double> want;
  };
  using galley::optim::CosineAnnealingLR;
  using galley::optim::CosineAnnealingWarmRestarts;
  using galley::optim::LambdaLR;
  using galley::optim::MultiStepLR;
  auto two = [](auto a, auto b) {
    std::vector<std::unique_ptr<LRScheduler>> v;
    v.push_back(std::move(a));
    v.push_back(std::move(b));
    return v;
  };
  const std::vector<Case> cases = {
      {"LinearLR(0.5, 3) + LambdaLR(1 / (1 + e))",
       [&](SGD& o) {
         auto a = std::make_unique<LinearLR>(
             o, galley::optim::LinearLROptions{.start_factor = 0.5, .total_iters = 3});
         return two(std::move(a),
                    std::make_unique<LambdaLR>(o, [](int64_t e) { return 1.0 / double(1 + e); }));
       },
       {0.1, 0.05, 0.03333333333333333, 0.025, 0.020000000000000004, 0.016666666666666666,
        0.014285714285714285}},
      {"LinearLR(0.5, 3) + CosineAnnealingWarmRestarts(3)",
       [&](SGD& o) {
         auto a = std::make_unique<LinearLR>(
             o, galley::optim::LinearLROptions{.start_factor = 0.5, .total_iters = 3});
         return two(std::move(a), std::make_unique<CosineAnnealingWarmRestarts>(o, 3));
       },
       {0.1, 0.07500000000000001, 0.025000000000000012, 0.1, 0.07500000000000001,
        0.025000000000000012, 0.1, 0.07500000000000001, 0.025000000000000012}},
      {"LinearLR(0.5, 2) + CosineAnnealingLR(3)",
       [&](SGD& o) {
         auto a = std::make_unique<LinearLR>(
             o, galley::optim::LinearLROptions{.start_factor = 0.5, .total_iters = 2});
         return two(std::move(a), std::make_unique<CosineAnnealingLR>(o, 3, 0.0));
       },
       {0.05, 0.05625000000000001, 0.025000000000000015, 0.0, 0.024999999999999994,
        0.07500000000000005, 0.10000000000000006, 0.07500000000000007, 0.025000000000000053, 0.0,
        0.024999999999999994, 0.0749999999999999, 0.09999999999999992}},
      {"MultiStepLR({0, 3}, 0.5) + CosineAnnealingLR(2, 0.01)",
       [&](SGD& o) {
         auto a = std::make_unique<MultiStepLR>(o, std::vector<int64_t>{0, 3}, 0.5);
         return two(std::move(a), std::make_unique<CosineAnnealingLR>(o, 2, 0.01));
       },
       {0.05, 0.03, 0.01, 0.049999999999999996, 0.09, 0.05000000000000001, 0.01, 0.055,
        0.10000000000000003, 0.05500000000000004, 0.01}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor p = leaf({1.0});
    SGD opt({p}, {.learning_rate = 0.1});
    auto scheds = c.make(opt);
    EXPECT_DOUBLE_EQ(scheds[1]->base_lr(), 0.1);
    for (size_t e = 0; e < c.want.size(); ++e) {
      EXPECT_NEAR(opt.learning_rate(), c.want[e], 1e-15) << "period " << e;
      for (auto& s : scheds) s->step();
    }
  }
}

// A SequentialLR whose children moved the rate when they were made starts afresh (it resets
// the rate, as PyTorch's does) and steps its schedules by their closed forms: a LinearLR decay to
// 0 ends at 0. Chained, it rounded to -2.2e-18 (PyTorch's value), which the optimizer refuses,
// and the step threw mid-training. The rates are PyTorch's, with that last one held at 0.
TEST(Schedulers, ASequenceOfSchedulesThatMovedTheRateDecaysToZero) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  LinearLR warm(opt, {.start_factor = 0.5, .total_iters = 2});
  LinearLR decay(opt, {.start_factor = 0.3, .end_factor = 0.0, .total_iters = 3});
  SequentialLR seq(opt, {&warm, &decay}, {2});
  EXPECT_FALSE(seq.chained());
  const std::vector<double> want = {
      0.05, 0.07500000000000001, 0.03, 0.019999999999999997, 0.009999999999999997, 0.0, 0.0, 0.0};
  for (size_t e = 0; e < want.size(); ++e) {
    EXPECT_NEAR(opt.learning_rate(), want[e], 1e-15) << "period " << e;
    seq.step();
  }
}

// An optimizer keeps its initial rate after its first schedule is gone, as PyTorch's param
// group keeps initial_lr: a later schedule starts from it. clear_initial_learning_rate() (del
// group['initial_lr']) makes the next schedule start from the rate set by hand.
TEST(Schedulers, TheInitialRateOutlivesItsScheduleUntilCleared) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  { galley::optim::StepLR first(opt, 2, 0.5); }
  opt.set_learning_rate(0.01);
  {
    galley::optim::LambdaLR second(opt, [](int64_t) { return 1.0; });
    EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.1);  // PyTorch's too
  }
  opt.set_learning_rate(0.01);
  opt.clear_initial_learning_rate();
  galley::optim::LambdaLR third(opt, [](int64_t) { return 1.0; });
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.01);
  EXPECT_DOUBLE_EQ(*opt.initial_learning_rate(), 0.01);
}

TEST(Schedulers, LinearLRWarmsUpFromConstruction) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  LinearLR sched(opt, {.start_factor = 0.25, .total_iters = 4});
  EXPECT_NEAR(opt.learning_rate(), 0.025, 1e-15);  // period 0 is already warmed down
  EXPECT_DOUBLE_EQ(sched.base_lr(), 0.1);
  for (int e = 1; e <= 6; ++e) {
    sched.step();
    EXPECT_NEAR(opt.learning_rate(), 0.1 * (0.25 + 0.75 * std::min(e, 4) / 4.0), 1e-15) << e;
  }
  expect_contains(error_of([&] { LinearLR(opt, {.start_factor = -0.1}); }),
                  {"LinearLR", "start_factor", "[0, 1]"});
  expect_contains(error_of([&] { LinearLR(opt, {.end_factor = 1.5}); }), {"end_factor"});
  expect_contains(error_of([&] { LinearLR(opt, {.total_iters = 0}); }), {"total_iters"});
}

TEST(Schedulers, LinearLRStateRestoresPeriodZeroRate) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.2});
  LinearLR sched(opt, {.start_factor = 0.5, .total_iters = 2});
  galley::StateDict st = sched.state_dict();
  opt.set_learning_rate(1.0);
  sched.load_state_dict(st);
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.1);
}

TEST(Schedulers, OneCycleLRPhases) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 123.0});  // replaced by max_lr / div_factor
  OneCycleLR sched(opt, {.max_lr = 1.0,
                         .total_steps = 10,
                         .pct_start = 0.5,
                         .anneal_strategy = AnnealStrategy::Linear,
                         .div_factor = 4.0,
                         .final_div_factor = 5.0});
  EXPECT_EQ(sched.total_steps(), 10);
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.25);
  EXPECT_DOUBLE_EQ(sched.lr_at(4), 1.0);     // end of the rise: pct_start * total - 1
  EXPECT_NEAR(sched.lr_at(9), 0.05, 1e-15);  // the minimum at the last batch
  EXPECT_DOUBLE_EQ(sched.lr_at(10), 0.0);    // one past: -0.14 extrapolated, held at 0
  for (int e = 1; e <= 10; ++e) sched.step();
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.0);
  expect_contains(error_of([&] { sched.step(); }), {"OneCycleLR", "11", "total_steps 10"});
  OneCycleLR by_epochs(opt, {.max_lr = 1.0, .epochs = 2, .steps_per_epoch = 5});
  EXPECT_EQ(by_epochs.total_steps(), 10);
}

TEST(Schedulers, OneCycleLRValidation) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  expect_contains(error_of([&] { OneCycleLR(opt, {.total_steps = 10}); }), {"max_lr"});
  expect_contains(error_of([&] { OneCycleLR(opt, {.max_lr = 1.0}); }),
                  {"total_steps", "epochs and steps_per_epoch"});
  expect_contains(error_of([&] { OneCycleLR(opt, {.max_lr = 1.0, .epochs = 3}); }),
                  {"total_steps"});
  expect_contains(
      error_of([&] { OneCycleLR(opt, {.max_lr = 1.0, .total_steps = 10, .pct_start = 1.5}); }),
      {"pct_start", "[0, 1]"});
  expect_contains(
      error_of([&] { OneCycleLR(opt, {.max_lr = 1.0, .total_steps = 10, .pct_start = 0.1}); }),
      {"phase 0", "no steps"});
  expect_contains(
      error_of([&] { OneCycleLR(opt, {.max_lr = 1.0, .total_steps = 10, .div_factor = 0}); }),
      {"div_factor"});
}

TEST(Schedulers, ReduceLROnPlateauReducesAfterPatience) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0});
  ReduceLROnPlateau sched(opt, {.factor = 0.5, .patience = 1, .cooldown = 1, .min_lr = 0.2});
  EXPECT_EQ(sched.best(), HUGE_VAL);
  sched.step(1.0);  // improves on +inf
  sched.step(1.0);  // bad 1 (patience 1)
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 1.0);
  sched.step(2.0);  // bad 2 -> reduce, cooldown 1
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.5);
  EXPECT_EQ(sched.cooldown_counter(), 1);
  sched.step(2.0);  // in cooldown: not counted
  sched.step(2.0);
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.5);
  sched.step(2.0);  // -> 0.25
  sched.step(2.0);
  sched.step(2.0);
  sched.step(2.0);  // floor
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.2);
  EXPECT_EQ(sched.last_epoch(), 9);
  EXPECT_DOUBLE_EQ(sched.lr_at(9), 0.2);
  expect_contains(error_of([&] { sched.lr_at(3); }), {"ReduceLROnPlateau", "period 3"});
  LRScheduler& base = sched;
  expect_contains(error_of([&] { base.step(); }), {"step(metric)"});
}

TEST(Schedulers, ReduceLROnPlateauMaxModeAndThresholds) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0});
  ReduceLROnPlateau sched(opt, {.mode = PlateauMode::Max,
                                .patience = 0,
                                .threshold = 0.1,
                                .threshold_mode = ThresholdMode::Abs});
  sched.step(0.5);
  sched.step(0.55);  // +0.05 < 0.1: no improvement, patience 0 -> reduce
  EXPECT_DOUBLE_EQ(sched.best(), 0.5);
  EXPECT_NEAR(opt.learning_rate(), 0.1, 1e-15);
  sched.step(0.7);
  EXPECT_DOUBLE_EQ(sched.best(), 0.7);
  EXPECT_NEAR(opt.learning_rate(), 0.1, 1e-15);
}

TEST(Schedulers, ReduceLROnPlateauValidationAndState) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0});
  expect_contains(error_of([&] { ReduceLROnPlateau(opt, {.factor = 1.0}); }), {"factor"});
  expect_contains(error_of([&] { ReduceLROnPlateau(opt, {.patience = -1}); }), {"patience"});
  expect_contains(error_of([&] { ReduceLROnPlateau(opt, {.cooldown = -1}); }), {"cooldown"});
  expect_contains(error_of([&] { ReduceLROnPlateau(opt, {.min_lr = -1}); }), {"min_lr"});
  ReduceLROnPlateau a(opt, {.factor = 0.5, .patience = 2, .cooldown = 3});
  for (double m : {3.0, 2.0, 2.5, 2.5}) a.step(m);
  galley::StateDict st = a.state_dict();

  Tensor q = leaf({1.0});
  SGD opt2({q}, {.learning_rate = 7.0});
  ReduceLROnPlateau b(opt2, {.factor = 0.5, .patience = 2, .cooldown = 3});
  b.load_state_dict(st);
  EXPECT_EQ(b.last_epoch(), 4);
  EXPECT_DOUBLE_EQ(b.best(), 2.0);
  EXPECT_EQ(b.num_bad_epochs(), 2);
  EXPECT_DOUBLE_EQ(opt2.learning_rate(), 1.0);
  for (double m : {2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5}) {
    a.step(m);
    b.step(m);
    EXPECT_EQ(opt.learning_rate(), opt2.learning_rate());
    EXPECT_EQ(a.cooldown_counter(), b.cooldown_counter());
  }
  EXPECT_DOUBLE_EQ(opt2.learning_rate(), 0.25);
}

TEST(Schedulers, SequentialLRWarmupThenCosine) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  LinearLR warm(opt, {.start_factor = 0.1, .total_iters = 2});
  galley::optim::CosineAnnealingLR cos(opt, 4);  // built after the warm-up changed the rate
  SequentialLR sched(opt, {&warm, &cos}, {2});
  EXPECT_DOUBLE_EQ(cos.base_lr(), 0.1);
  EXPECT_NEAR(opt.learning_rate(), 0.01, 1e-15);
  sched.step();
  EXPECT_NEAR(opt.learning_rate(), 0.055, 1e-15);
  EXPECT_EQ(warm.last_epoch(), 1);
  sched.step();  // milestone: the cosine starts at its period 0
  EXPECT_NEAR(opt.learning_rate(), 0.1, 1e-15);
  EXPECT_EQ(cos.last_epoch(), 0);
  sched.step();
  sched.step();
  EXPECT_NEAR(opt.learning_rate(), 0.05, 1e-15);
  EXPECT_EQ(cos.last_epoch(), 2);

  galley::StateDict st = sched.state_dict();
  opt.set_learning_rate(3.0);
  sched.load_state_dict(st);
  EXPECT_NEAR(opt.learning_rate(), 0.05, 1e-15);
  EXPECT_EQ(sched.last_epoch(), 4);
}

// A OneCycleLR sets the children's shared initial rate (max_lr / div_factor), as PyTorch's sets
// the optimizer's initial_lr: a warm-up before it warms up towards that rate.
TEST(Schedulers, SequentialLRTakesTheInitialRateOfAOneCycleLR) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  LinearLR warm(opt, {.start_factor = 0.2, .end_factor = 1.0, .total_iters = 10});
  OneCycleLR one(opt, {.max_lr = 1.0, .total_steps = 50});
  SequentialLR sched(opt, {&warm, &one}, {10});
  // PyTorch 2.15 and 1.13: 0.008 0.0112 0.0144 0.0176.
  for (double want : {0.008, 0.0112, 0.0144, 0.0176}) {
    EXPECT_NEAR(opt.learning_rate(), want, 1e-12);
    sched.step();
  }
}

// The rates of PyTorch 2.15 over the first periods (SGD at 0.1), then a checkpoint round trip.
TEST(Schedulers, MultiStepExponentialAndWarmRestartsMatchPyTorch) {
  auto expect_rates = [](LRScheduler& sched, SGD& opt, const std::vector<double>& want,
                         const std::string& what) {
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(opt.learning_rate(), want[i], 1e-15) << what << " period " << i;
      sched.step();
    }
  };
  Tensor p = leaf({1.0});
  {
    SGD opt({p}, {.learning_rate = 0.1});
    galley::optim::MultiStepLR sched(opt, {5, 2, 5, 0}, 0.5);  // 5 twice, 0 at once
    expect_rates(sched, opt, {0.05, 0.05, 0.025, 0.025, 0.025, 0.00625, 0.00625, 0.00625},
                 "MultiStepLR");
  }
  {
    SGD opt({p}, {.learning_rate = 0.1});
    galley::optim::ExponentialLR sched(opt, 0.9);
    expect_rates(sched, opt, {0.1, 0.09, 0.081, 0.0729, 0.06561}, "ExponentialLR");
  }
  {
    SGD opt({p}, {.learning_rate = 0.1});
    galley::optim::CosineAnnealingWarmRestarts sched(opt, 2, 2, 0.01);
    expect_rates(sched, opt,
                 {0.1, 0.05500000000000001, 0.1, 0.08681980515339464, 0.05500000000000001,
                  0.023180194846605363, 0.1, 0.0965745789630079, 0.08681980515339464,
                  0.07222075445642905, 0.05500000000000001, 0.03777924554357097,
                  0.023180194846605363, 0.013425421036992097, 0.1, 0.09913533761814537},
                 "CosineAnnealingWarmRestarts t_mult 2");
    galley::StateDict st = sched.state_dict();
    SGD again({p}, {.learning_rate = 0.1});
    galley::optim::CosineAnnealingWarmRestarts restored(again, 2, 2, 0.01);
    restored.load_state_dict(st);
    EXPECT_EQ(restored.last_epoch(), 16);
    EXPECT_EQ(again.learning_rate(), opt.learning_rate()) << "restored at period 16";
  }
  {
    SGD opt({p}, {.learning_rate = 0.1});
    galley::optim::CosineAnnealingWarmRestarts sched(opt, 3);
    expect_rates(sched, opt, {0.1, 0.075, 0.025, 0.1, 0.075, 0.025, 0.1, 0.075},
                 "CosineAnnealingWarmRestarts t_mult 1");
  }
  {
    SGD opt({p}, {.learning_rate = 0.1});
    galley::optim::LambdaLR sched(opt, [](int64_t e) { return 1.0 / double(e + 1); });
    expect_rates(sched, opt, {0.1, 0.05, 0.1 / 3, 0.025}, "LambdaLR");
    SGD other({p}, {.learning_rate = 0.1});
    galley::optim::LambdaLR bad(other, [](int64_t e) { return e < 5 ? 1.0 : -1.0; });
    for (int i = 0; i < 4; ++i) bad.step();
    expect_contains(error_of([&] { bad.step(); }), {"LambdaLR", "period 5", "-1"});
    EXPECT_EQ(bad.last_epoch(), 4) << "a step that fails changes nothing";
    EXPECT_DOUBLE_EQ(other.learning_rate(), 0.1);
  }
  SGD opt({p}, {.learning_rate = 0.1});
  EXPECT_THROW(galley::optim::MultiStepLR(opt, {3, -1}), galley::Error);
  EXPECT_THROW(galley::optim::ExponentialLR(opt, 0.0), galley::Error);
  EXPECT_THROW(galley::optim::CosineAnnealingWarmRestarts(opt, 0), galley::Error);
  EXPECT_THROW(galley::optim::CosineAnnealingWarmRestarts(opt, 2, 0), galley::Error);
  EXPECT_THROW(galley::optim::CosineAnnealingWarmRestarts(opt, 2, 1, -0.1), galley::Error);
}

TEST(Schedulers, CosineAnnealingRefusesANegativeOrNaNFloor) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  expect_contains(error_of([&] { galley::optim::CosineAnnealingLR(opt, 10, -0.01); }),
                  {"eta_min -0.01"});
  EXPECT_THROW(galley::optim::CosineAnnealingLR(opt, 10, NAN), galley::Error);
}

TEST(Schedulers, SequentialLRValidation) {
  Tensor p = leaf({1.0}), q = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1}), other({q}, {.learning_rate = 0.1});
  LinearLR a(opt), b(opt), elsewhere(other);
  ReduceLROnPlateau plateau(opt);
  expect_contains(error_of([&] { SequentialLR(opt, {}, {}); }), {"no schedulers"});
  expect_contains(error_of([&] { SequentialLR(opt, {&a, &b}, {}); }), {"need 1 milestones"});
  expect_contains(error_of([&] { SequentialLR(opt, {&a, &b}, {0}); }), {"milestone 0"});
  expect_contains(error_of([&] { SequentialLR(opt, {&a, &b, &a}, {3, 3}); }), {"milestone 1"});
  expect_contains(error_of([&] { SequentialLR(opt, {&a, nullptr}, {2}); }), {"1 is null"});
  expect_contains(error_of([&] {
                    SequentialLR(opt, {&a, &elsewhere}, {2});
                  }),
                  {"another optimizer"});
  expect_contains(error_of([&] { SequentialLR(opt, {&a, &plateau}, {2}); }), {"ReduceLROnPlateau"});
}

// ---------------------------------------------------------------------------------------------
// 16-bit parameters: the update is computed in float32 (float32 state) and the parameter rounded
// once per step.

using galley::DType;

struct OptimizerCase {
  std::string name;
  std::function<std::unique_ptr<galley::optim::Optimizer>(std::vector<Tensor>)> make;
};

std::vector<OptimizerCase> every_optimizer() {
  using galley::optim::Optimizer;
  return {
      {"SGD",
       [](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
         return std::make_unique<SGD>(p, SGDOptions{.learning_rate = 0.05});
       }},
      {"SGD momentum, dampening, weight decay",
       [](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
         return std::make_unique<SGD>(
             p,
             SGDOptions{
                 .learning_rate = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2});
       }},
      {"SGD nesterov",
       [](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
         return std::make_unique<SGD>(
             p,
             SGDOptions{
                 .learning_rate = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
       }},
      {"Adam",
       [](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
         return std::make_unique<Adam>(p, AdamOptions{.learning_rate = 1e-2});
       }},
      {"Adam amsgrad, L2",
       [](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
         return std::make_unique<Adam>(
             p, AdamOptions{.learning_rate = 1e-2, .weight_decay = 1e-2, .amsgrad = true});
       }},
      {"AdamW",
       [](std::vector<Tensor> p) -> std::unique_ptr<Optimizer> {
         return std::make_unique<AdamW>(p,
                                        AdamOptions{.learning_rate = 1e-2, .weight_decay = 1e-2});
       }},
  };
}

// 600 elements: more than one block of the 16-bit staging (256), not a multiple of it.
constexpr int64_t kN16 = 600;

std::vector<float> init16() {
  std::vector<float> v(kN16);
  for (int64_t i = 0; i < kN16; ++i) v[i] = 1.5f * std::sin(0.7f * float(i)) + 0.01f;
  return v;
}
std::vector<float> grad16(int step) {
  std::vector<float> v(kN16);
  for (int64_t i = 0; i < kN16; ++i) v[i] = 0.5f * std::cos(0.3f * float(i) + step) + 0.01f * step;
  return v;
}

// `values` rounded to `dtype` (float32 values that `dtype` holds exactly).
std::vector<float> rounded(const std::vector<float>& values, DType dtype) {
  return Tensor::from_vector(values, {int64_t(values.size())})
      .to(dtype)
      .to(DType::Float32)
      .to_vector();
}

Tensor param16(const std::vector<float>& values, DType dtype) {
  Tensor p = Tensor::from_vector(values, {int64_t(values.size())}).to(dtype);
  p.set_requires_grad();
  return p;
}

std::vector<float> widened(const Tensor& t) {
  return t.to(DType::Float32).to_vector();
}

const char* dtype_label(DType d) {
  return d == DType::BFloat16 ? "bfloat16" : "float16";
}

TEST(Optimizer16Bit, EachOptimizerRoundsTheFloat32UpdateOncePerStep) {
  // The float32 optimizer stepping the widened 16-bit parameter with the same gradient, then
  // rounded, gives the 16-bit optimizer's parameter bit for bit: the update is float32 with
  // float32 state, and the parameter is rounded once.
  for (DType dtype : {DType::BFloat16, DType::Float16})
    for (const OptimizerCase& c : every_optimizer()) {
      const std::string what = c.name + " on " + dtype_label(dtype);
      Tensor p = param16(init16(), dtype);
      Tensor q = param16(rounded(init16(), dtype), DType::Float32);
      auto o16 = c.make({p});
      auto o32 = c.make({q});
      for (int step = 1; step <= 10; ++step) {
        const std::vector<float> g = rounded(grad16(step), dtype);
        p.set_grad(Tensor::from_vector(g, {kN16}).to(dtype));
        {
          galley::NoGradGuard no_grad;
          q.copy_(p.to(DType::Float32));
        }
        q.set_grad(Tensor::from_vector(g, {kN16}));
        o16->step();
        o32->step();
        ASSERT_EQ(p.dtype(), dtype) << what;
        ASSERT_EQ(widened(p), widened(q.to(dtype))) << what << ", step " << step;
      }
      for (auto& [key, t] : o16->state_dict().tensors)
        EXPECT_EQ(t.dtype(), DType::Float32) << what << ": state " << key << " is float32";
    }
}

TEST(Optimizer16Bit, EachOptimizerTracksTheFloat32OneWithinTheDtypesTolerance) {
  const int steps = 10;
  for (DType dtype : {DType::BFloat16, DType::Float16})
    for (const OptimizerCase& c : every_optimizer()) {
      const std::string what = c.name + " on " + dtype_label(dtype);
      // Unit roundoff: each step rounds the parameter once.
      const double u = dtype == DType::BFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const std::vector<float> start = rounded(init16(), dtype);
      Tensor p = param16(start, dtype);
      Tensor q = param16(start, DType::Float32);
      auto o16 = c.make({p});
      auto o32 = c.make({q});
      for (int step = 1; step <= steps; ++step) {
        const std::vector<float> g = rounded(grad16(step), dtype);
        p.set_grad(Tensor::from_vector(g, {kN16}).to(dtype));
        q.set_grad(Tensor::from_vector(g, {kN16}));
        o16->step();
        o32->step();
      }
      ASSERT_EQ(p.dtype(), dtype) << what;
      const std::vector<float> got = widened(p), want = q.to_vector();
      double moved = 0;
      for (int64_t i = 0; i < kN16; ++i) {
        moved = std::max(moved, std::fabs(double(want[i]) - start[i]));
        EXPECT_NEAR(got[i], want[i], steps * u * std::max(1.0, std::fabs(double(want[i]))))
            << what << ", element " << i;
      }
      EXPECT_GT(moved, 10 * u) << what << ": the parameters moved";
    }
}

TEST(Optimizer16Bit, StateDictRoundTripsWithFloat32State) {
  for (DType dtype : {DType::BFloat16, DType::Float16})
    for (const OptimizerCase& c : every_optimizer()) {
      const std::string what = c.name + " on " + dtype_label(dtype);
      Tensor p = param16(init16(), dtype);
      auto a = c.make({p});
      for (int step = 1; step <= 3; ++step) {
        p.set_grad(Tensor::from_vector(grad16(step), {kN16}).to(dtype));
        a->step();
      }
      const galley::StateDict st = a->state_dict();
      for (auto& [key, t] : st.tensors) EXPECT_EQ(t.dtype(), DType::Float32) << what << " " << key;
      Tensor p2 = param16(widened(p), dtype);
      auto b = c.make({p2});
      b->load_state_dict(st);
      for (int step = 4; step <= 6; ++step) {
        const Tensor g = Tensor::from_vector(grad16(step), {kN16}).to(dtype);
        p.set_grad(g);
        p2.set_grad(g.clone());
        a->step();
        b->step();
        ASSERT_EQ(widened(p2), widened(p)) << what << ", step " << step;
      }
      // Saved again, the state is the same.
      const galley::StateDict again = b->state_dict();
      for (auto& [key, t] : a->state_dict().tensors) {
        ASSERT_TRUE(again.tensors.count(key)) << what << " " << key;
        EXPECT_EQ(again.tensors.at(key).to_vector(), t.to_vector()) << what << " " << key;
      }
    }
}

TEST(Optimizer16Bit, ASavedSixteenBitStateIsWidened) {
  Tensor p = param16(init16(), DType::BFloat16);
  SGD a({p}, {.learning_rate = 0.1, .momentum = 0.9});
  p.set_grad(Tensor::from_vector(grad16(1), {kN16}).to(DType::BFloat16));
  a.step();
  galley::StateDict st = a.state_dict();
  Tensor& buf = st.tensors.at("state.0.momentum_buffer");
  buf = buf.to(DType::BFloat16);
  SGD b({param16(init16(), DType::BFloat16)}, {.learning_rate = 0.1, .momentum = 0.9});
  b.load_state_dict(st);
  EXPECT_EQ(b.state_dict().tensors.at("state.0.momentum_buffer").dtype(), DType::Float32);
  EXPECT_EQ(b.state_dict().tensors.at("state.0.momentum_buffer").to_vector(),
            buf.to(DType::Float32).to_vector());
}

TEST(Optimizer16Bit, MixedDtypesInOneOptimizer) {
  // A float32 and a bfloat16 parameter side by side: the float32 one steps exactly as alone.
  Tensor a = param16(init16(), DType::Float32);
  Tensor b = param16(init16(), DType::BFloat16);
  Tensor alone = param16(init16(), DType::Float32);
  Adam both({a, b}, {.learning_rate = 1e-2});
  Adam single({alone}, {.learning_rate = 1e-2});
  for (int step = 1; step <= 5; ++step) {
    const Tensor g = Tensor::from_vector(grad16(step), {kN16});
    a.set_grad(g);
    alone.set_grad(g.clone());
    b.set_grad(g.to(DType::BFloat16));
    both.step();
    single.step();
  }
  EXPECT_EQ(a.to_vector(), alone.to_vector());
  EXPECT_EQ(b.dtype(), DType::BFloat16);
  EXPECT_EQ(both.state(b).exp_avg.dtype(), DType::Float32);
}

TEST(Optimizer16Bit, AGradientOfAnotherDtypeIsAnError) {
  Tensor p = param16(init16(), DType::BFloat16);
  SGD opt({p});
  const Tensor wide = Tensor::from_vector(grad16(1), {kN16});
  expect_contains(error_of([&] { p.set_grad(wide); }), {"set_grad", "float32", "bfloat16"});
  testutil::force_grad(p, wide);  // however it came there, the step refuses it
  expect_contains(error_of([&] { opt.step(); }),
                  {"parameter 0", "float32", "bfloat16", "same dtype"});
}

TEST(Optimizer16Bit, ABadGradientFailsTheStepBeforeAnyParameterChanges) {
  Tensor good = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  good.set_requires_grad(true);
  good.set_grad(galley::ones({3}));
  Tensor p = param16(init16(), DType::BFloat16);
  testutil::force_grad(p, Tensor::from_vector(grad16(1), {kN16}));  // float32, bfloat16 param
  Adam opt({good, p}, {.learning_rate = 0.1});
  expect_contains(error_of([&] { opt.step(); }), {"parameter 1", "same dtype"});
  EXPECT_EQ(good.to_vector(), (std::vector<float>{1, 2, 3}));
  EXPECT_FALSE(opt.state(good).exp_avg.defined());
}

}  // namespace

// A scheduler's state that gives no learning rate (a one-cycle schedule past its end) is
// refused whole: the scheduler keeps its place and steps on. A cycle whose epochs x steps per
// epoch overflows is refused at construction.
TEST(Schedulers, AStateThatGivesNoRateChangesNothing) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 0.1});
  OneCycleLR sched(opt, {.max_lr = 1.0, .total_steps = 4});
  sched.step();
  const double lr = opt.learning_rate();
  galley::StateDict past = sched.state_dict();
  past.set("last_epoch", int64_t(9));
  expect_contains(error_of([&] { sched.load_state_dict(past); }), {"OneCycleLR"});
  EXPECT_EQ(sched.state_dict().get_int("last_epoch", "test"), 1);
  EXPECT_EQ(opt.learning_rate(), lr);
  sched.step();  // still within the cycle
  expect_contains(
      error_of([&] {
        OneCycleLR(
            opt, {.max_lr = 1.0, .epochs = int64_t(1) << 40, .steps_per_epoch = int64_t(1) << 40});
      }),
      {"OneCycleLR", "overflows"});
}

// A parameter that is a strided view (a transposed or narrowed leaf) is updated element by
// element as a dense one with the same values and gradients: the kernels work on a dense copy
// that is written back through the strides, and memory outside a narrowed view is not touched.
TEST(Optimizer, StridedParametersAreUpdatedThroughTheirStrides) {
  const std::vector<float> values{1, 2, 3, 4, 5, 6}, grads{10, 20, 30, 40, 50, 60};
  auto step_both = [&](auto make, const std::string& what) {
    // Transposed: base [2, 3], parameter its [3, 2] transpose.
    Tensor base = Tensor::from_vector(values, {2, 3});
    Tensor t = galley::transpose(base, 0, 1).set_requires_grad(true);
    ASSERT_FALSE(t.is_contiguous());
    Tensor dense = galley::transpose(base, 0, 1).contiguous().set_requires_grad(true);
    const Tensor g = Tensor::from_vector(grads, {3, 2});
    t.set_grad(g.clone());
    dense.set_grad(g.clone());
    // Narrowed: columns 1..2 of a [2, 3] base; column 0 stays as it was.
    Tensor outer = Tensor::from_vector(values, {2, 3});
    Tensor n = galley::narrow(outer, 1, 1, 2).set_requires_grad(true);
    ASSERT_FALSE(n.is_contiguous());
    Tensor n_dense = galley::narrow(outer, 1, 1, 2).contiguous().set_requires_grad(true);
    n.set_grad(Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}));
    n_dense.set_grad(n.grad().clone());
    auto opt = make(std::vector<Tensor>{t, n});
    auto ref = make(std::vector<Tensor>{dense, n_dense});
    for (int s = 0; s < 2; ++s) {
      opt->step();
      ref->step();
    }
    EXPECT_EQ(t.detach().contiguous().to_vector(), dense.to_vector()) << what;
    EXPECT_EQ(n.detach().contiguous().to_vector(), n_dense.to_vector()) << what;
    const std::vector<float> whole = outer.to_vector();
    EXPECT_EQ(whole[0], 1.f) << what;
    EXPECT_EQ(whole[3], 4.f) << what;
  };
  step_both(
      [](std::vector<Tensor> ps) {
        return std::make_unique<SGD>(ps, SGDOptions{.learning_rate = 0.5, .momentum = 0.9});
      },
      "SGD");
  step_both(
      [](std::vector<Tensor> ps) {
        return std::make_unique<Adam>(ps, AdamOptions{.learning_rate = 0.5});
      },
      "Adam");
}

// A state saved for another number of parameters says so, before any per-parameter key.
TEST(Optimizer, AStateForAnotherParameterCountSaysSo) {
  Tensor a = leaf({1.0}), b = leaf({2.0});
  Adam one({a}, {.learning_rate = 0.1});
  set_grad(a, {1.0});
  one.step();
  Adam two({a, b}, {.learning_rate = 0.1});
  expect_contains(error_of([&] { two.load_state_dict(one.state_dict()); }),
                  {"saved state is for 1 parameters", "has 2"});
  SGD sgd2({a, b}, {.learning_rate = 0.1, .momentum = 0.9});
  SGD sgd1({a}, {.learning_rate = 0.1, .momentum = 0.9});
  expect_contains(error_of([&] { sgd2.load_state_dict(sgd1.state_dict()); }),
                  {"saved state is for 1 parameters"});
}

// SequentialLR starts its schedules at the optimizer's initial rate (PyTorch's initial_lr, set by
// the first schedule made on it), also when the first child was made after another child had
// changed the rate. PyTorch 2.15 and 1.13 give the rates below.
TEST(Schedulers, SequentialLRStartsAtTheOptimizersInitialRate) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0});
  LinearLR warm(opt, {.start_factor = 0.1, .end_factor = 1.0, .total_iters = 4});  // rate 0.1
  EXPECT_EQ(opt.initial_learning_rate(), 1.0);
  galley::optim::ExponentialLR decay(opt, 0.9);
  SequentialLR sched(opt, {&decay, &warm}, {3});
  for (double want : {1.0, 0.9, 0.81, 0.1, 0.325, 0.55, 0.7750000000000001, 1.0000000000000002}) {
    EXPECT_NEAR(opt.learning_rate(), want, 1e-15);
    sched.step();
  }
}

// A schedule made after another changed the rate, and stepped alone, runs from that rate as
// PyTorch's does; where something else moves the rate between steps (another schedule stepped on
// the same optimizer, a ReduceLROnPlateau, set_learning_rate as a loaded optimizer state does),
// StepLR, MultiStepLR, ExponentialLR, LinearLR and CosineAnnealingLR go on from the moved rate as
// PyTorch's recursive forms do, and LambdaLR sets its own over it. The rates of PyTorch 2.15 (and
// 1.13), to the last bits or within the recursion's rounding.
TEST(Schedulers, ChainAsPyTorchsRecursiveForms) {
  auto expect_rates = [](const std::vector<double>& got, const std::vector<double>& want,
                         const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-15 * std::fabs(want[i])) << what << ", period " << i;
  };
  {
    Tensor p = leaf({1.0});
    SGD opt({p}, {.learning_rate = 1.0});
    galley::optim::MultiStepLR first(opt, {0}, 0.5);
    galley::optim::StepLR second(opt, 2, 0.5);
    std::vector<double> rates{opt.learning_rate()};
    for (int e = 0; e < 4; ++e) {
      second.step();
      rates.push_back(opt.learning_rate());
    }
    expect_rates(rates, {0.5, 0.5, 0.25, 0.25, 0.125}, "StepLR after MultiStepLR");
  }
  auto chained = [](auto make, int periods, std::function<void(SGD&, int)> between = nullptr,
                    double lr0 = 1.0) {
    Tensor p = leaf({1.0});
    SGD opt({p}, {.learning_rate = lr0});
    auto scheds = make(opt);
    std::vector<double> rates{opt.learning_rate()};
    for (int e = 0; e < periods; ++e) {
      std::apply([&](auto&... s) { (s->step(), ...); }, scheds);
      rates.push_back(opt.learning_rate());
      if (between) between(opt, e);
    }
    return rates;
  };
  expect_rates(chained(
                   [](SGD& o) {
                     return std::make_tuple(std::make_unique<galley::optim::StepLR>(o, 2, 0.5),
                                            std::make_unique<galley::optim::ExponentialLR>(o, 0.9));
                   },
                   6),
               {1.0, 0.9, 0.405, 0.36450000000000005, 0.16402500000000003, 0.14762250000000005,
                0.06643012500000002},
               "StepLR and ExponentialLR");
  expect_rates(
      chained(
          [](SGD& o) {
            return std::make_tuple(
                std::make_unique<LinearLR>(o, galley::optim::LinearLROptions{.start_factor = 0.1,
                                                                             .end_factor = 1.0,
                                                                             .total_iters = 4}),
                std::make_unique<galley::optim::ExponentialLR>(o, 0.9));
          },
          6),
      {0.1, 0.29250000000000004, 0.44550000000000006, 0.5649750000000001, 0.6561000000000001,
       0.5904900000000002, 0.5314410000000002},
      "LinearLR and ExponentialLR");
  {  // a warm-up stepped with a ReduceLROnPlateau on a flat metric
    Tensor p = leaf({1.0});
    SGD opt({p}, {.learning_rate = 1.0});
    LinearLR warm(opt, {.start_factor = 0.1, .end_factor = 1.0, .total_iters = 2});
    ReduceLROnPlateau plateau(opt, {.patience = 0});
    EXPECT_EQ(opt.initial_learning_rate(), 1.0);
    std::vector<double> rates{opt.learning_rate()};
    for (int e = 0; e < 6; ++e) {
      warm.step();
      plateau.step(1.0);
      rates.push_back(opt.learning_rate());
    }
    expect_rates(rates,
                 {0.1, 0.55, 0.1, 0.010000000000000002, 0.0010000000000000002,
                  0.00010000000000000003, 1.0000000000000004e-05},
                 "LinearLR and ReduceLROnPlateau");
  }
  auto moved = [&](auto make, int periods, int at, double to, double lr0 = 1.0) {
    return chained([&](SGD& o) { return std::make_tuple(make(o)); }, periods,
                   [&](SGD& o, int e) {
                     if (e == at) o.set_learning_rate(to);
                   },
                   lr0);
  };
  auto without = [](std::vector<double> v, size_t i) {  // the moved rate is not a step's
    v.erase(v.begin() + long(i));
    return v;
  };
  expect_rates(
      moved([](SGD& o) { return std::make_unique<galley::optim::CosineAnnealingLR>(o, 6, 0.1); }, 6,
            1, 0.3),
      without({1.0, 0.9397114317029974, 0.775, 0.3, 0.2333333333333333, 0.16666666666666669,
               0.11786327949540817, 0.1},
              3),
      "CosineAnnealingLR after set_learning_rate");
  expect_rates(moved(
                   [](SGD& o) {
                     return std::make_unique<galley::optim::LambdaLR>(
                         o, [](int64_t e) { return 1.0 / double(e + 1); });
                   },
                   4, 0, 0.3),
               without({1.0, 0.5, 0.3, 0.3333333333333333, 0.25, 0.2}, 2),
               "LambdaLR after set_learning_rate");
  expect_rates(
      moved(
          [](SGD& o) {
            return std::make_unique<galley::optim::MultiStepLR>(o, std::vector<int64_t>{2, 4}, 0.5);
          },
          5, 0, 0.01),
      without({1.0, 1.0, 0.01, 0.005, 0.005, 0.0025, 0.0025}, 2),
      "MultiStepLR after a loaded rate");
  // Past t_max the cosine's recursion restarts from the moved rate by the original base; a move at
  // t_max, where the rate is eta_min, and one after a warm-down to 0, or from an optimizer at
  // rate 0, are followed too (the rates below are PyTorch's, the move after the period `at`).
  expect_rates(
      moved([](SGD& o) { return std::make_unique<galley::optim::CosineAnnealingLR>(o, 2); }, 6, 0,
            0.25),
      {1.0, 0.5, 0.0, 0.49999999999999994, 1.0, 0.5000000000000001, 0.0},
      "CosineAnnealingLR moved, past t_max");
  expect_rates(
      moved([](SGD& o) { return std::make_unique<galley::optim::CosineAnnealingLR>(o, 2); }, 6, 1,
            0.3),
      {1.0, 0.5, 0.0, 0.7999999999999999, 1.6000000000000003, 0.8000000000000004, 0.0},
      "CosineAnnealingLR moved at t_max");
  expect_rates(moved(
                   [](SGD& o) {
                     return std::make_unique<LinearLR>(
                         o, galley::optim::LinearLROptions{
                                .start_factor = 0.5, .end_factor = 0.0, .total_iters = 2});
                   },
                   5, 2, 0.1),
               {0.5, 0.25, 0.0, 0.0, 0.1, 0.1}, "LinearLR to 0, then moved");
  expect_rates(moved([](SGD& o) { return std::make_unique<galley::optim::ExponentialLR>(o, 0.5); },
                     3, 0, 0.4, 0.0),
               {0.0, 0.0, 0.2, 0.1}, "ExponentialLR from rate 0, moved");
  // PyTorch's ReduceLROnPlateau sets no initial_lr.
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0});
  ReduceLROnPlateau plateau(opt);
  EXPECT_FALSE(opt.initial_learning_rate().has_value());
}

// OneCycleLR's rates have PyTorch's bits: no product fused into an FMA (PyTorch 2.15).
TEST(Schedulers, OneCycleLRRatesArePyTorchsBitForBit) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0});
  OneCycleLR sched(opt, {.max_lr = 1.0, .total_steps = 10});
  for (double want :
       {0.040000000000000036, 0.52, 1.0, 0.9504846320134737, 0.8117456539497631, 0.6112620219362893,
        0.38874197806371075, 0.18825834605023697, 0.049519367986526286, 4e-06}) {
    EXPECT_EQ(opt.learning_rate(), want) << "period " << sched.last_epoch();
    if (sched.last_epoch() < 9) sched.step();
  }
}

// ReduceLROnPlateau refuses a saved rate that is not finite and changes nothing then.
TEST(Schedulers, ReduceLROnPlateauRefusesANonFiniteRateWhole) {
  Tensor p = leaf({1.0});
  SGD opt({p}, {.learning_rate = 1.0});
  ReduceLROnPlateau sched(opt, {.patience = 0});
  sched.step(1.0);
  for (double bad : {double(INFINITY), double(NAN), -1.0}) {
    galley::StateDict st = sched.state_dict();
    st.set("lr", bad);
    st.set("last_epoch", int64_t(7));
    st.set("best", -3.0);
    expect_contains(error_of([&] { sched.load_state_dict(st); }),
                    {"ReduceLROnPlateau", "must be finite and not negative"});
    EXPECT_EQ(sched.last_epoch(), 1);
    EXPECT_EQ(sched.best(), 1.0);
    EXPECT_EQ(opt.learning_rate(), 1.0);
  }
}
