// Optimizers and schedules against PyTorch's update rules, written out here in double precision.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
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
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (decoupled) {
        p[i] *= 1 - o.learning_rate * o.weight_decay;
      } else {
        g += o.weight_decay * p[i];
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
      double d = grad[i] + o.weight_decay * p[i];
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
  EXPECT_DOUBLE_EQ(opt.options().weight_decay, 1e-2);
  EXPECT_DOUBLE_EQ(opt.options().learning_rate, 1e-3);
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
  EXPECT_DOUBLE_EQ(opt.learning_rate(), 0.5);
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

}  // namespace
