// Autograd: backward passes, accumulation, grad mode, graph lifetime, hooks, broadcasting and
// independent graphs on several threads.
#include <gtest/gtest.h>

#include "test_util.h"

#include <galley/galley.h>

#include <atomic>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using galley::Shape;
using galley::Tensor;

using testutil::error_of;

using testutil::expect_contains;

Tensor fvec(const std::vector<float>& v, const Shape& s) {
  return Tensor::from_vector(v, s);
}

// A leaf that wants a gradient.
Tensor param(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::from_vector(v, s);
  t.set_requires_grad();
  return t;
}

void expect_near_vec(const std::vector<float>& got, const std::vector<float>& want,
                     float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1.f + std::fabs(want[i]))) << "at index " << i;
}

// ---------------------------------------------------------------------------------------------
// Basic passes

TEST(Backward, ScalarOutput) {
  Tensor x = param({1, -2, 3}, {3});
  Tensor y = galley::sum(x * x + x * 3.f);  // dy/dx = 2x + 3
  EXPECT_EQ(y.dim(), 0);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  y.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().shape(), x.shape());
  expect_near_vec(x.grad().to_vector(), {5, -1, 9});
}

TEST(Backward, OneElementNonScalarOutputNeedsNoGradient) {
  Tensor x = param({2}, {1});
  Tensor y = x * x;  // shape [1]
  y.backward();
  expect_near_vec(x.grad().to_vector(), {4});
}

TEST(Backward, ExplicitGradient) {
  Tensor x = param({1, 2, 3}, {3});
  Tensor y = x * 2.f;
  y.backward(fvec({1, 10, 100}, {3}));
  expect_near_vec(x.grad().to_vector(), {2, 20, 200});
}

TEST(Backward, ExplicitGradientIsNotModifiedByLaterAccumulation) {
  // The leaf's gradient must be a private copy: later accumulation must not write into the
  // gradient the caller passed in, nor into another leaf's gradient.
  Tensor x = param({1, 2}, {2});
  Tensor z = param({3, 4}, {2});
  Tensor g = fvec({1, 1}, {2});
  (x + z).backward(g);
  (x + z).backward(g);
  EXPECT_EQ(g.to_vector(), (std::vector<float>{1, 1}));
  expect_near_vec(x.grad().to_vector(), {2, 2});
  expect_near_vec(z.grad().to_vector(), {2, 2});
  (x * 5.f).backward(g);
  expect_near_vec(x.grad().to_vector(), {7, 7});
  expect_near_vec(z.grad().to_vector(), {2, 2});
  EXPECT_EQ(g.to_vector(), (std::vector<float>{1, 1}));
}

TEST(Backward, LeafRoot) {
  Tensor x = param({1, 2}, {2});
  x.backward(fvec({3, 4}, {2}));
  expect_near_vec(x.grad().to_vector(), {3, 4});
}

TEST(Backward, NonScalarWithoutGradientThrows) {
  Tensor x = param({1, 2, 3, 4}, {2, 2});
  Tensor y = x * 2.f;
  std::string msg = error_of([&] { y.backward(); });
  expect_contains(msg, {"[2, 2]"});
  EXPECT_FALSE(x.grad().defined());
}

TEST(Backward, GradientOfWrongShapeThrows) {
  Tensor x = param({1, 2, 3}, {3});
  Tensor y = x * 2.f;
  std::string msg = error_of([&] { y.backward(galley::ones({2})); });
  expect_contains(msg, {"[2]", "[3]"});
}

TEST(Backward, WithoutRequiresGradThrows) {
  Tensor x = fvec({1, 2}, {2});
  Tensor y = galley::sum(x * x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_THROW(y.backward(), galley::Error);
}

TEST(Backward, AccumulatesAcrossSeparateGraphs) {
  Tensor x = param({1, 2, 3}, {3});
  galley::sum(x * 2.f).backward();
  expect_near_vec(x.grad().to_vector(), {2, 2, 2});
  galley::sum(x * x).backward();  // + 2x
  expect_near_vec(x.grad().to_vector(), {4, 6, 8});
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
  galley::sum(x * 3.f).backward();
  expect_near_vec(x.grad().to_vector(), {3, 3, 3});
}

TEST(Backward, SetGradChecksShape) {
  Tensor x = param({1, 2, 3}, {3});
  std::string msg = error_of([&] { x.set_grad(galley::zeros({2})); });
  expect_contains(msg, {"[2]", "[3]"});
  x.set_grad(galley::ones({3}));
  galley::sum(x).backward();
  expect_near_vec(x.grad().to_vector(), {2, 2, 2});
}

TEST(Backward, InputUsedTwice) {
  Tensor x = param({-1.5f, 0.5f, 3}, {3});
  galley::sum(x * x).backward();
  expect_near_vec(x.grad().to_vector(), {-3, 1, 6});

  Tensor a = param({2, 5}, {2});
  galley::sum(a + a).backward();
  expect_near_vec(a.grad().to_vector(), {2, 2});

  Tensor b = param({2, 3}, {2});
  galley::sum(b * b * b).backward();  // 3 b^2
  expect_near_vec(b.grad().to_vector(), {12, 27});
}

TEST(Backward, DiamondGraph) {
  // h = 2x feeds two branches that meet again: y = sum(h * h + exp(h)).
  Tensor x = param({0.1f, -0.3f}, {2});
  Tensor h = x * 2.f;
  Tensor y = galley::sum(h * h + galley::exp(h));
  y.backward();
  std::vector<float> xv{0.1f, -0.3f}, want;
  for (float v : xv) want.push_back(2.f * (2.f * (2 * v)) + 2.f * std::exp(2 * v));
  expect_near_vec(x.grad().to_vector(), want);
}

TEST(Backward, ElementwiseOps) {
  Tensor a = param({1, 2}, {2});
  Tensor b = param({4, -2}, {2});
  galley::sum(a / b - galley::log(a) + galley::pow(b, 2.f) + galley::relu(-a + 1.5f)).backward();
  // d/da: 1/b - 1/a - [a < 1.5];  d/db: -a/b^2 + 2b
  expect_near_vec(a.grad().to_vector(), {1.f / 4 - 1.f - 1.f, -1.f / 2 - 1.f / 2});
  expect_near_vec(b.grad().to_vector(), {-1.f / 16 + 8, -2.f / 4 - 4});
}

TEST(Backward, MatmulAndMean) {
  Tensor a = param({1, 2, 3, 4}, {2, 2});
  Tensor b = param({5, 6, 7, 8}, {2, 2});
  galley::mean(galley::matmul(a, b)).backward();
  // d mean(AB)/dA = (1/4) 1 B^T ; d/dB = (1/4) A^T 1
  expect_near_vec(a.grad().to_vector(), {11.f / 4, 15.f / 4, 11.f / 4, 15.f / 4});
  expect_near_vec(b.grad().to_vector(), {4.f / 4, 4.f / 4, 6.f / 4, 6.f / 4});
}

// ---------------------------------------------------------------------------------------------
// Grad mode and graph cutting

TEST(GradMode, NoGradGuardDisablesRecording) {
  Tensor x = param({1, 2}, {2});
  EXPECT_TRUE(galley::grad_enabled());
  {
    galley::NoGradGuard guard;
    EXPECT_FALSE(galley::grad_enabled());
    Tensor y = x * x;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    EXPECT_EQ(y.grad_fn_name(), "");
    {
      galley::NoGradGuard inner;
      EXPECT_FALSE(galley::grad_enabled());
    }
    EXPECT_FALSE(galley::grad_enabled());  // the inner guard restores "disabled"
    EXPECT_THROW(galley::sum(y).backward(), galley::Error);
  }
  EXPECT_TRUE(galley::grad_enabled());
  Tensor z = x * x;
  EXPECT_TRUE(z.requires_grad());
  EXPECT_EQ(z.grad_fn_name(), "mul");
}

TEST(GradMode, IsPerThread) {
  galley::NoGradGuard guard;
  bool other = false;
  std::thread t([&] { other = galley::grad_enabled(); });
  t.join();
  EXPECT_TRUE(other);
  EXPECT_FALSE(galley::grad_enabled());
}

TEST(GradMode, DetachCutsTheGraph) {
  Tensor x = param({2, 3}, {2});
  Tensor y = galley::sum(x.detach() * x);  // only the right-hand factor carries a gradient
  y.backward();
  expect_near_vec(x.grad().to_vector(), {2, 3});

  Tensor w = param({1, 1}, {2});
  Tensor h = (w * 4.f).detach();
  EXPECT_FALSE(h.requires_grad());
  Tensor out = galley::sum(h * w);
  out.backward();
  expect_near_vec(w.grad().to_vector(), {4, 4});
}

TEST(GradMode, OpsOnPlainTensorsRecordNothing) {
  Tensor a = galley::ones({2}), b = galley::ones({2});
  Tensor c = a * b + a;
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(c.grad_fn_name(), "");
}

TEST(GradMode, GradFnNames) {
  Tensor x = param({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(x.grad_fn_name(), "");
  EXPECT_TRUE(x.is_leaf());
  EXPECT_EQ((x + x).grad_fn_name(), "add");
  EXPECT_EQ((x * x).grad_fn_name(), "mul");
  EXPECT_EQ(galley::matmul(x, x).grad_fn_name(), "matmul");
  EXPECT_FALSE((x * x).is_leaf());
}

TEST(Graph, SecondBackwardOnSameGraphThrows) {
  Tensor x = param({1, 2}, {2});
  Tensor y = galley::sum(x * x);
  y.backward();
  expect_near_vec(x.grad().to_vector(), {2, 4});
  std::string msg = error_of([&] { y.backward(); });
  EXPECT_FALSE(msg.empty());
  // The failed pass must not have added anything.
  expect_near_vec(x.grad().to_vector(), {2, 4});
}

TEST(Graph, BackwardThroughFreedIntermediateThrows) {
  Tensor x = param({1, 2}, {2});
  Tensor h = x * x;
  galley::sum(h * 2.f).backward();
  EXPECT_THROW(galley::sum(h).backward(), galley::Error);
}

TEST(Graph, SetRequiresGradOnNonLeafThrows) {
  Tensor x = param({1, 2}, {2});
  Tensor y = x * 2.f;
  std::string msg = error_of([&] { y.set_requires_grad(); });
  expect_contains(msg, {"mul"});
  // A detached copy is a leaf again and may be marked.
  Tensor d = y.detach();
  EXPECT_NO_THROW(d.set_requires_grad());
  EXPECT_TRUE(d.requires_grad());
  d.set_requires_grad(false);
  EXPECT_FALSE(d.requires_grad());
}

TEST(Graph, IntegerTensorsCannotRequireGrad) {
  Tensor i = galley::zeros({2}, galley::DType::Int64);
  std::string msg = error_of([&] { i.set_requires_grad(); });
  expect_contains(msg, {"int64"});
}

TEST(Graph, GraphKeepsInputsAlive) {
  // The graph owns what backward needs, even when the caller drops its handles.
  Tensor x = param({3}, {1});
  Tensor y;
  {
    Tensor h = x * 2.f;
    Tensor k = h * h;
    y = galley::sum(k);
  }
  y.backward();
  expect_near_vec(x.grad().to_vector(), {24});  // d(4x^2)/dx = 8x
}

// ---------------------------------------------------------------------------------------------
// Hooks

TEST(Hooks, CalledAfterAccumulation) {
  Tensor x = param({1, 2}, {2});
  std::vector<std::vector<float>> seen;
  x.register_grad_hook([&](const Tensor& g) {
    seen.push_back(g.to_vector());
    // The hook runs after the gradient has been stored on the leaf.
    EXPECT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().to_vector(), g.to_vector());
  });
  galley::sum(x * 3.f).backward();
  galley::sum(x * 2.f).backward();
  ASSERT_EQ(seen.size(), 2u);
  expect_near_vec(seen[0], {3, 3});
  expect_near_vec(seen[1], {5, 5});  // the accumulated sum, not the second pass alone
}

TEST(Hooks, SeveralHooksRunInOrder) {
  Tensor x = param({1}, {1});
  std::vector<int> calls;
  x.register_grad_hook([&](const Tensor&) { calls.push_back(1); });
  x.register_grad_hook([&](const Tensor&) { calls.push_back(2); });
  galley::sum(x).backward();
  EXPECT_EQ(calls, (std::vector<int>{1, 2}));
}

TEST(Hooks, CalledOnceWithTheFullGradientWhenALeafIsUsedTwice) {
  // A parameter used twice in one graph (x * x, tied weights) gets one complete gradient per
  // backward pass; a hook that reduces gradients across replicas must not see a partial one.
  Tensor x = param({1, 2}, {2});
  std::vector<std::vector<float>> seen;
  x.register_grad_hook([&](const Tensor& g) { seen.push_back(g.to_vector()); });
  galley::sum(x * x).backward();
  EXPECT_EQ(seen.size(), 1u) << "the hook must run once per backward pass";
  ASSERT_FALSE(seen.empty());
  expect_near_vec(seen[0], {2, 4});  // the complete gradient 2x
  expect_near_vec(x.grad().to_vector(), {2, 4});
}

TEST(Hooks, OnlyOnLeaves) {
  Tensor x = param({1}, {1});
  Tensor y = x * 2.f;
  EXPECT_THROW(y.register_grad_hook([](const Tensor&) {}), galley::Error);
}

// ---------------------------------------------------------------------------------------------
// Broadcasting

TEST(Broadcast, AddReducesToRowVector) {
  Tensor a = param({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = param({10, 20, 30}, {3});
  Tensor y = a + b;
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  expect_near_vec(y.to_vector(), {11, 22, 33, 14, 25, 36});
  y.backward(fvec({1, 2, 3, 4, 5, 6}, {2, 3}));
  EXPECT_EQ(b.grad().shape(), (Shape{3}));
  expect_near_vec(b.grad().to_vector(), {5, 7, 9});
  EXPECT_EQ(a.grad().shape(), (Shape{2, 3}));
  expect_near_vec(a.grad().to_vector(), {1, 2, 3, 4, 5, 6});
}

TEST(Broadcast, MulReducesToColumn) {
  Tensor a = param({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor c = param({2, -1}, {2, 1});
  Tensor y = a * c;
  expect_near_vec(y.to_vector(), {2, 4, 6, -4, -5, -6});
  galley::sum(y).backward();
  EXPECT_EQ(c.grad().shape(), (Shape{2, 1}));
  expect_near_vec(c.grad().to_vector(), {6, 15});
  expect_near_vec(a.grad().to_vector(), {2, 2, 2, -1, -1, -1});
}

TEST(Broadcast, BothSidesBroadcast) {
  Tensor r = param({1, 2, 3}, {1, 3});
  Tensor c = param({10, 20}, {2, 1});
  Tensor y = r * c;  // [2, 3]
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  y.backward(fvec({1, 1, 1, 2, 2, 2}, {2, 3}));
  EXPECT_EQ(r.grad().shape(), (Shape{1, 3}));
  expect_near_vec(r.grad().to_vector(), {50, 50, 50});
  EXPECT_EQ(c.grad().shape(), (Shape{2, 1}));
  expect_near_vec(c.grad().to_vector(), {6, 12});
}

TEST(Broadcast, ScalarTensor) {
  Tensor a = param({1, 2, 3, 4}, {2, 2});
  Tensor s = param({3}, {});
  galley::sum(a * s + s).backward();
  EXPECT_EQ(s.grad().shape(), Shape{});
  expect_near_vec(s.grad().to_vector(), {10 + 4});
  expect_near_vec(a.grad().to_vector(), {3, 3, 3, 3});
}

TEST(Broadcast, SubAndDivReduce) {
  Tensor a = param({2, 4, 6, 8}, {2, 2});
  Tensor b = param({2, 4}, {2});
  galley::sum(a - b).backward();
  expect_near_vec(b.grad().to_vector(), {-2, -2});
  Tensor c = param({2, 4}, {2});
  galley::sum(a.detach() / c).backward();  // d/dc = -a / c^2, summed over rows
  expect_near_vec(c.grad().to_vector(), {-(2.f + 6.f) / 4, -(4.f + 8.f) / 16});
}

TEST(Broadcast, IncompatibleShapesThrow) {
  Tensor a = galley::zeros({2, 3}), b = galley::zeros({2});
  std::string msg = error_of([&] { a + b; });
  expect_contains(msg, {"[2, 3]", "[2]"});
}

// ---------------------------------------------------------------------------------------------
// Threads

struct ThreadCase {
  std::shared_ptr<galley::nn::Sequential> model;
  Tensor x, y;
  std::vector<std::vector<float>> serial_grads;
};

std::vector<std::vector<float>> grads_of(const galley::nn::Layer& model) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.grad().to_vector());
  return out;
}

void one_step(ThreadCase& c) {
  c.model->zero_grad();
  Tensor loss = galley::cross_entropy((*c.model)(c.x), c.y);
  loss.backward();
}

TEST(Threads, IndependentGraphsOnSeveralThreads) {
  constexpr int kThreads = 4;
  std::vector<ThreadCase> cases(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    galley::manual_seed(100 + t);
    cases[t].model = std::make_shared<galley::nn::Sequential>(
        std::make_shared<galley::nn::Linear>(16, 32), std::make_shared<galley::nn::ReLU>(),
        std::make_shared<galley::nn::Linear>(32, 5));
    galley::Generator gen(7 + t);
    cases[t].x = galley::randn({64, 16}, gen);
    std::vector<int64_t> labels(64);
    for (int i = 0; i < 64; ++i) labels[i] = (i * 7 + t) % 5;
    cases[t].y = Tensor::from_vector(labels, {64});
  }
  for (auto& c : cases) {
    one_step(c);
    c.serial_grads = grads_of(*c.model);
  }
  // Same models and data, all at once, several times over.
  std::vector<std::vector<std::vector<float>>> threaded(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int it = 0; it < 20; ++it) one_step(cases[t]);
        threaded[t] = grads_of(*cases[t].model);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[t], "") << "thread " << t;
    ASSERT_EQ(threaded[t].size(), cases[t].serial_grads.size());
    for (size_t p = 0; p < threaded[t].size(); ++p) {
      SCOPED_TRACE("thread " + std::to_string(t) + ", parameter " + std::to_string(p));
      expect_near_vec(threaded[t][p], cases[t].serial_grads[p], 1e-5f);
    }
  }
}

TEST(Threads, SeveralThreadsNoGradAndGradAtOnce) {
  // One thread runs inference under a NoGradGuard while another records a graph.
  Tensor w = param({1, 2, 3}, {3});
  std::atomic<bool> recorded_under_guard{false};
  std::thread infer([&] {
    galley::NoGradGuard guard;
    for (int i = 0; i < 200; ++i)
      if ((w * w).requires_grad()) recorded_under_guard = true;
  });
  std::vector<float> grad;
  std::thread train([&] {
    Tensor local = param({1, 2, 3}, {3});
    for (int i = 0; i < 200; ++i) {
      local.set_grad(Tensor());
      galley::sum(local * local).backward();
    }
    grad = local.grad().to_vector();
  });
  infer.join();
  train.join();
  EXPECT_FALSE(recorded_under_guard.load());
  expect_near_vec(grad, {2, 4, 6});
}

// ---------------------------------------------------------------------------------------------
// The loss guard of backward()

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Turns the loss guard off for a scope, and back on after.
struct LossGuardOff {
  LossGuardOff() { galley::set_check_loss_finite(false); }
  ~LossGuardOff() { galley::set_check_loss_finite(true); }
};

TEST(LossGuard, IsOnByDefault) {
  EXPECT_TRUE(galley::check_loss_finite_enabled());
}

TEST(LossGuard, NanLossRaisesAndLeavesGradientsUntouched) {
  Tensor w = param({1, 2, 3}, {3});
  galley::sum(w * w).backward();  // an earlier step's gradient: 2w
  Tensor before = w.grad().clone();
  Tensor x = fvec({1, kNaN, 1}, {3});
  Tensor loss = galley::sum(w * x);
  const std::string msg = error_of([&] { loss.backward(); });
  expect_contains(
      msg, {"backward: the loss is nan", "set_detect_anomaly", "set_check_loss_finite(false)"});
  EXPECT_EQ(w.grad().to_vector(), before.to_vector());
  // Nothing was consumed: the graph is still there for a backward once the guard is off.
  LossGuardOff off;
  loss.backward();
  EXPECT_TRUE(std::isnan(w.grad().to_vector()[1]));
}

TEST(LossGuard, InfiniteLossRaises) {
  Tensor w = param({100, 1}, {2});
  expect_contains(error_of([&] { galley::sum(galley::exp(w)).backward(); }), {"the loss is inf"});
  EXPECT_FALSE(w.grad().defined());
  expect_contains(error_of([&] { (galley::sum(galley::exp(w)) * -1.f).backward(); }),
                  {"the loss is -inf"});
  EXPECT_FALSE(w.grad().defined());
}

TEST(LossGuard, CanBeTurnedOff) {
  Tensor w = param({1, 2}, {2});
  {
    LossGuardOff off;
    EXPECT_FALSE(galley::check_loss_finite_enabled());
    galley::sum(w * fvec({kInf, 1}, {2})).backward();
  }
  EXPECT_TRUE(galley::check_loss_finite_enabled());
  auto g = w.grad().to_vector();
  EXPECT_TRUE(std::isinf(g[0]));
  EXPECT_EQ(g[1], 1.f);
}

TEST(LossGuard, ChecksOnlyOneElementRoots) {
  // A non-scalar root with an explicit gradient is not a loss: its values are not checked.
  Tensor w = param({1, 2}, {2});
  (w * fvec({kNaN, 1}, {2})).backward(fvec({1, 1}, {2}));
  EXPECT_TRUE(std::isnan(w.grad().to_vector()[0]));
}

TEST(LossGuard, ApplesToALossOfADataParallelModel) {
  // The gathered output's loss is checked before any replica runs its backward.
  auto model = galley::DataParallel<galley::nn::Linear>(
      {galley::Device::cpu(0), galley::Device::cpu(1)}, {}, int64_t(2), int64_t(1));
  Tensor x = fvec({1, 2, kNaN, 4, 5, 6}, {3, 2});
  Tensor loss = galley::sum(model(x));
  expect_contains(error_of([&] { loss.backward(); }), {"the loss is nan"});
  for (auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
}

// ---------------------------------------------------------------------------------------------
// Anomaly detection

// Turns anomaly detection on for a scope.
using Anomaly = galley::DetectAnomalyGuard;

// log(x) as a layer.
class Log : public galley::nn::Layer {
 public:
  Tensor forward(const Tensor& x) override { return galley::log(x); }
};

// sqrt(x) as x^0.5: finite at 0, with an infinite gradient there.
class Sqrt : public galley::nn::Layer {
 public:
  Tensor forward(const Tensor& x) override { return galley::pow(x, 0.5f); }
};

// A Linear whose output is x - 10 everywhere: log of it is NaN for small inputs.
std::shared_ptr<galley::nn::Linear> shift_down(int64_t n) {
  auto lin = std::make_shared<galley::nn::Linear>(n, n);
  galley::NoGradGuard no_grad;
  std::vector<float> eye(size_t(n * n), 0.f);
  for (int64_t i = 0; i < n; ++i) eye[size_t(i * n + i)] = 1.f;
  Tensor(lin->parameters()[0]).copy_(fvec(eye, {n, n}));
  Tensor(lin->parameters()[1]).fill_(-10.f);
  return lin;
}

// A model with a named Sequential inside: the path of its second layer is "body.1".
class Net : public galley::nn::Layer {
 public:
  Net() : body_(shift_down(3), std::make_shared<Log>()) { register_layer("body", body_); }
  Tensor forward(const Tensor& x) override { return body_(x); }

 private:
  galley::nn::Sequential body_;
};

TEST(Anomaly, IsOffByDefaultAndGuardsNest) {
  EXPECT_FALSE(galley::is_anomaly_enabled());
  {
    Anomaly outer;
    EXPECT_TRUE(galley::is_anomaly_enabled());
    {
      Anomaly inner;
      EXPECT_TRUE(galley::is_anomaly_enabled());
    }
    EXPECT_TRUE(galley::is_anomaly_enabled());
    galley::set_detect_anomaly(true);
    galley::set_detect_anomaly(false);  // the guard still holds it on
    EXPECT_TRUE(galley::is_anomaly_enabled());
  }
  EXPECT_FALSE(galley::is_anomaly_enabled());
  galley::set_detect_anomaly(true);
  EXPECT_TRUE(galley::is_anomaly_enabled());
  galley::set_detect_anomaly(false);
  EXPECT_FALSE(galley::is_anomaly_enabled());
}

TEST(Anomaly, ForwardNamesTheOpTheShapeAndTheLayerPath) {
  galley::nn::Sequential model(shift_down(4), std::make_shared<Log>());
  Tensor x = fvec({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  {
    // Off: the NaNs flow through without a word (and the layer path is not tracked).
    Tensor y = model(x);
    EXPECT_TRUE(std::isnan(y.to_vector()[0]));
    EXPECT_EQ(galley::autograd::current_layer_path(), "");
  }
  Anomaly on;
  const std::string msg = error_of([&] { model(x); });
  expect_contains(
      msg, {"detect_anomaly", "forward of log", "in layer '1'", "nan", "[2, 4]", "element 0"});
}

TEST(Anomaly, TheLayerPathJoinsTheRegisteredNames) {
  Net net;
  Anomaly on;
  expect_contains(error_of([&] {
                    net(fvec({1, 2, 3}, {1, 3}));
                  }),
                  {"forward of log", "in layer 'body.1'"});
  // A layer called outside a model has no name; the op then ran outside any named layer.
  Log log;
  expect_contains(error_of([&] { log(param({-1}, {1})); }),
                  {"forward of log", "outside any named layer"});
}

TEST(Anomaly, BackwardNamesTheOpAndTheLayerOfItsForward) {
  // A Linear of zeros feeds sqrt with 0: the output is finite, its gradient is not.
  auto lin = std::make_shared<galley::nn::Linear>(2, 2);
  for (auto& p : lin->parameters()) Tensor(p).zero_();
  galley::nn::Sequential model(lin, std::make_shared<Sqrt>());
  Tensor x = fvec({1, 2}, {1, 2});
  {
    Tensor loss = galley::sum(model(x));
    EXPECT_EQ(loss.item(), 0.f);
    loss.backward();  // off: the loss is finite, the gradients silently are not
    for (float v : lin->parameters()[1].grad().to_vector()) EXPECT_TRUE(std::isinf(v));
    model.zero_grad();
  }
  Anomaly on;
  Tensor loss = galley::sum(model(x));
  const std::string msg = error_of([&] { loss.backward(); });
  expect_contains(msg, {"detect_anomaly", "backward of pow", "forward ran in layer '1'", "inf",
                        "gradient of its input 0", "[1, 2]"});
  for (auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Anomaly, FiniteTrainingRunsUnchanged) {
  // On, with nothing non-finite: the same gradients as with it off.
  auto run = [] {
    galley::manual_seed(7);
    galley::nn::Sequential model(std::make_shared<galley::nn::Linear>(3, 4),
                                 std::make_shared<galley::nn::ReLU>(),
                                 std::make_shared<galley::nn::Linear>(4, 2));
    Tensor x = galley::randn({5, 3});
    galley::nn::CrossEntropyLoss loss_fn;
    loss_fn(model(x), Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0, 1}, {5})).backward();
    std::vector<std::vector<float>> grads;
    for (auto& p : model.parameters()) grads.push_back(p.grad().to_vector());
    return grads;
  };
  auto off = run();
  Anomaly on;
  EXPECT_EQ(run(), off);
}

TEST(Anomaly, NamesTheLayerOnADataParallelReplica) {
  // Replicas run on their own threads: the process-wide switch reaches them, and each thread
  // tracks its own layer path.
  auto model = galley::DataParallel<Net>({galley::Device::cpu(0), galley::Device::cpu(1)});
  Anomaly on;
  expect_contains(error_of([&] {
                    model(fvec({1, 2, 3, 4, 5, 6}, {2, 3}));
                  }),
                  {"DataParallel forward on replica 0", "forward of log", "in layer 'body.1'"});
}

}  // namespace

// An explicit gradient of another dtype is converted to the output's (PyTorch casts it): the
// backward passes run in the output's dtype, not the gradient's.
TEST(Backward, AnExplicitGradientTakesTheOutputsDtype) {
  using galley::DType;
  const Tensor ones16 = Tensor::from_vector({1.f, 1.f, 1.f}, {3}).to(DType::BFloat16);
  Tensor x = Tensor::from_vector({1.f, -2.f, 3.f}, {3}).set_requires_grad(true);
  (x / 3.f).backward(ones16);
  EXPECT_EQ(x.grad().dtype(), DType::Float32);
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>(3, 1.f / 3.f));  // not bfloat16's 0.333984
  x.set_grad(Tensor());
  galley::relu(x).backward(ones16);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 0, 1}));
  Tensor w = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true);
  galley::linear(x.detach().reshape({1, 3}), w)
      .backward(Tensor::from_vector({1.f, 1.f}, {1, 2}).to(DType::Float16));
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{1, -2, 3, 1, -2, 3}));
  // A host gradient of another CPU index is host memory too.
  x.set_grad(Tensor());
  galley::relu(x).backward(galley::ones({3}, {.device = galley::Device::cpu(1)}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 0, 1}));
}

// relu(std::move(t)) reuses t's buffer when nothing else holds it, but never a leaf that wants a
// gradient: its values stay (PyTorch's relu leaves them too).
TEST(Backward, ReluOfAMovedLeafLeavesTheLeaf) {
  Tensor p = Tensor::from_vector({-1.f, 2.f}, {2}).set_requires_grad(true);
  Tensor y = galley::relu(std::move(p));
  EXPECT_EQ(p.to_vector(), (std::vector<float>{-1, 2}));  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(y.to_vector(), (std::vector<float>{0, 2}));
  galley::sum(y).backward();
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{0, 1}));
  // A temporary is still rectified in place.
  Tensor t = p * 1.f;
  const void* data = t.raw_data();
  Tensor r = galley::relu(std::move(t));
  EXPECT_EQ(r.raw_data(), data);
}

// A graph a million ops deep, dropped without its backward, is taken apart without recursion
// (the release of each node freed the next inside it, 1M frames deep: a stack overflow).
TEST(Graph, AMillionOpsDeepIsDroppedWithoutItsBackward) {
  Tensor x = Tensor::from_vector({1.f}, {1}).set_requires_grad(true);
  {
    Tensor y = x;
    for (int i = 0; i < 1000000; ++i) y = galley::mul(y, 1.0f);
  }
  Tensor y = galley::mul(x, 2.f);
  galley::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2.f}));
}

// A hook may register another hook (which runs from the next gradient on): the list it was
// read from may move meanwhile. A hook on a tensor that takes no gradient, which would never
// run, is refused.
TEST(Hooks, AHookThatRegistersAHookAndAHookThatWouldNeverRun) {
  Tensor x = Tensor::from_vector({1.f, 2.f, 3.f}, {3}).set_requires_grad(true);
  int outer = 0, inner = 0;
  x.register_grad_hook([&](const Tensor&) {
    ++outer;
    for (int k = 0; k < 8; ++k) x.register_grad_hook([&](const Tensor&) { ++inner; });
  });
  galley::sum(galley::mul(x, x)).backward();
  EXPECT_EQ(outer, 1);
  EXPECT_EQ(inner, 0);
  galley::sum(galley::mul(x, x)).backward();
  EXPECT_EQ(outer, 2);
  EXPECT_EQ(inner, 8);
  Tensor plain = Tensor::from_vector({1.f}, {1});
  expect_contains(error_of([&] { plain.register_grad_hook([](const Tensor&) {}); }),
                  {"register_grad_hook", "does not require a gradient"});
}

// Backwards on two threads: through one graph, one runs it and the other gets the usual error
// (never a crash); through two graphs that share a leaf, both parts reach its gradient.
TEST(Graph, ConcurrentBackwardsAreErrorsOrExactSums) {
  for (int rep = 0; rep < 20; ++rep) {
    Tensor x = Tensor::from_vector({1.f}, {1}).set_requires_grad(true);
    Tensor y = x;
    for (int i = 0; i < 2000; ++i) y = galley::mul(y, 1.0f);
    Tensor loss = galley::sum(y);
    std::atomic<int> ok{0}, refused{0};
    auto run = [&] {
      try {
        loss.backward();
        ++ok;
      } catch (const galley::Error& e) {
        const std::string m = e.what();
        if (m.find("already freed") != std::string::npos ||
            m.find("at the same time") != std::string::npos)
          ++refused;
      }
    };
    std::thread a(run), b(run);
    a.join();
    b.join();
    EXPECT_EQ(ok.load(), 1) << rep;
    EXPECT_EQ(refused.load(), 1) << rep;
    EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1.f})) << rep;
  }
  Tensor w = Tensor::from_vector({1.f}, {1}).set_requires_grad(true);
  const int n = 300;
  auto many = [&] {
    for (int i = 0; i < n; ++i) galley::sum(galley::mul(w, 1.f)).backward();
  };
  std::thread a(many), b(many);
  a.join();
  b.join();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{float(2 * n)}));
}

// An anomaly found in add_'s sum leaves the tensor its history (it was a leaf, detached from its
// graph, before); a node recorded with detection off says its layer is not known rather than
// "outside any named layer".
TEST(Anomaly, AddInPlaceKeepsItsHistoryAndAnUntrackedLayerIsSaidSo) {
  Tensor x = Tensor::from_vector({1.f, 2.f}, {2}).set_requires_grad(true);
  Tensor h = galley::mul(x, 2.f);
  {
    Anomaly on;
    EXPECT_THROW(h.add_(Tensor::from_vector({INFINITY, 0.f}, {2})), galley::Error);
  }
  EXPECT_TRUE(h.requires_grad());
  EXPECT_FALSE(h.is_leaf());
  Tensor z = galley::mul(x, 0.f);
  Tensor loss = galley::sum(galley::div(z, z));  // recorded with detection off; NaN gradients
  Anomaly on;
  expect_contains(error_of([&] { loss.backward(galley::full({}, 1.f)); }),
                  {"detect_anomaly", "backward of div", "layer is not known"});
}

// copy_, fill_ and copy_from_host are not recorded: on an op's output that is part of a graph,
// while gradients are recorded, they would change that graph's gradients silently (PyTorch's
// version counters make its backward refuse). They are refused; a leaf (a parameter) may still
// be written, and a detached copy or a write under NoGradGuard is the caller's choice.
TEST(Graph, UnrecordedWritesIntoAGraphAreRefused) {
  Tensor x = fvec({1, 2, 3}, {3});
  x.set_requires_grad(true);
  Tensor h = galley::mul(x, 2.f);
  Tensor y = galley::sum(galley::mul(h, h));
  const float zeros[3] = {0, 0, 0};
  expect_contains(error_of([&] { h.copy_(galley::zeros({3})); }),
                  {"copy_", "[3]", "not recorded", "detach()"});
  expect_contains(error_of([&] { h.fill_(0.f); }), {"fill_"});
  expect_contains(error_of([&] { h.narrow(0, 0, 1).fill_(0.f); }), {"fill_"});
  expect_contains(error_of([&] { h.copy_from_host(zeros); }), {"copy_from_host"});
  y.backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{8, 16, 24}));
  x.copy_(fvec({4, 5, 6}, {3}));  // a leaf: its gradient does not read its value
  EXPECT_EQ(x.to_vector(), (std::vector<float>{4, 5, 6}));
}

// Version counters (PyTorch's `_version`): every in-place write counts one on the data, which all
// its views share and a clone does not.
TEST(Versions, InPlaceWritesCountOnTheDataItsViewsShare) {
  Tensor t = galley::zeros({2, 3});
  Tensor row = t.narrow(0, 1, 1);
  const uint64_t v0 = t.version();
  t.fill_(1.f);
  EXPECT_EQ(t.version(), v0 + 1);
  EXPECT_EQ(row.version(), t.version()) << "a view shares its base's counter";
  row.copy_(galley::full({1, 3}, 2.f));
  EXPECT_EQ(t.version(), v0 + 2) << "a write through a view counts on the base";
  const float host[6] = {1, 2, 3, 4, 5, 6};
  t.copy_from_host(host);
  t.add_(galley::ones({2, 3}));
  EXPECT_EQ(t.version(), v0 + 4);
  Tensor c = t.clone();
  c.fill_(0.f);
  EXPECT_EQ(t.version(), v0 + 4) << "a clone has data, and a counter, of its own";
  (void)galley::mul(t, 2.f);  // reads count nothing
  EXPECT_EQ(t.version(), v0 + 4);
  EXPECT_EQ(Tensor::empty({0}).version(), 0u);
}

// A tensor an op saved for its backward, written in place before that backward runs, is an
// error naming the op, the tensor's role, shape and dtype, and both versions, raised before any
// gradient is computed: the backward would read the new values (as PyTorch refuses, "modified by
// an inplace operation").
TEST(Versions, AWriteIntoASavedTensorIsRefusedBeforeAnyGradient) {
  // A weight written between the forward and the backward (an optimizer step in the wrong place).
  Tensor x = galley::randn({2, 3, 6, 6}).set_requires_grad(true);
  Tensor w = galley::randn({4, 3, 3, 3}).set_requires_grad(true);
  Tensor loss = galley::sum(galley::conv2d(x, w, Tensor(), {.padding = 1}));
  const uint64_t saved_at = w.version();
  {
    galley::NoGradGuard no_grad;
    w.add_(galley::full({4, 3, 3, 3}, 0.5f));
  }
  const std::string msg = error_of([&] { loss.backward(); });
  expect_contains(msg,
                  {"the weight (float32 [4, 3, 3, 3])", "conv2d", "modified in place",
                   "version " + std::to_string(saved_at + 1),
                   "saved at version " + std::to_string(saved_at), "no gradient was computed"});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  // Still refused (not "already freed"): nothing ran.
  expect_contains(error_of([&] { loss.backward(); }), {"modified in place"});

  // An op's own saved output, written under NoGradGuard (which the graph-write check lets pass).
  Tensor a = fvec({0.5f, 1.f}, {2});
  a.set_requires_grad(true);
  Tensor e = galley::exp(a);
  Tensor y = galley::sum(galley::mul(e, 3.f));
  {
    galley::NoGradGuard no_grad;
    e.fill_(0.f);
  }
  expect_contains(error_of([&] { y.backward(); }), {"the output (float32 [2]) that exp saved"});

  // A constant operand (no gradient of its own) saved for the other's gradient.
  Tensor c = fvec({2.f, 3.f}, {2});
  Tensor z = galley::sum(galley::mul(a, c));
  c.fill_(7.f);
  expect_contains(error_of([&] { z.backward(); }), {"the second operand", "mul"});
}

// Only what a backward reads is checked: an operand kept for no gradient, a tensor written after
// the backward, BatchNorm's running statistics updated by a later training forward (the eval
// forward kept its own copy of them), and a leaf's value where only its gradient is read pass.
TEST(Versions, WritesTheBackwardDoesNotReadPass) {
  Tensor a = fvec({1.f, 2.f}, {2});
  a.set_requires_grad(true);
  Tensor c = fvec({2.f, 3.f}, {2});
  Tensor y = galley::sum(galley::mul(a, c));  // c takes no gradient: a's value is not kept
  a.fill_(5.f);
  y.backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{2.f, 3.f}));
  y = galley::sum(galley::mul(a, c));
  y.backward();
  c.fill_(0.f);  // after the backward
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{4.f, 6.f}));

  galley::nn::BatchNorm2D bn(2);
  Tensor x = galley::randn({4, 2, 3, 3}).set_requires_grad(true);
  bn.eval();
  Tensor eval_loss = galley::sum(galley::mul(bn(x), bn(x)));
  bn.train();
  Tensor train_loss = galley::sum(bn(x));  // updates the running statistics in place
  eval_loss.backward();
  train_loss.backward();
  EXPECT_TRUE(x.grad().defined());
}

// With anomaly detection on (or a profiler recording) the error names the layer whose forward
// saved the tensor; an optimizer step counts a write on every parameter it updates.
TEST(Versions, AnOptimizerStepBeforeTheBackwardNamesTheLayer) {
  auto fc = std::make_shared<galley::nn::Linear>(3, 2);
  galley::nn::Sequential model(fc);
  galley::optim::SGD opt(model.parameters(), {.learning_rate = 0.1});
  Tensor x = galley::randn({4, 3}).set_requires_grad(true);
  galley::sum(model(x)).backward();
  Anomaly on;
  Tensor loss = galley::sum(model(x));
  const uint64_t before = fc->weight().version();
  opt.step();
  EXPECT_GT(fc->weight().version(), before);
  expect_contains(error_of([&] { loss.backward(); }),
                  {"the weight (float32 [2, 3]) that linear (in layer '0') saved"});
}

// A gradient hook that writes what a node still to run saved is refused at that node (the
// nodes that ran before keep their gradients, as in PyTorch, which checks as it unpacks).
TEST(Versions, AWriteByAGradientHookIsRefusedAtTheNodeThatSavedIt) {
  Tensor p = fvec({1.f, 2.f}, {2});
  p.set_requires_grad(true);
  Tensor a = fvec({3.f, 4.f}, {2});
  a.set_requires_grad(true);
  Tensor c = fvec({5.f, 6.f}, {2});
  // p's gradient is complete (and its hook runs) before the mul that saved p.detach() runs.
  Tensor y = galley::sum(galley::add(galley::mul(galley::exp(a), p.detach()), galley::mul(p, c)));
  p.register_grad_hook([&p](const Tensor&) { p.fill_(100.f); });
  expect_contains(error_of([&] { y.backward(); }),
                  {"the second operand", "mul", "written during this backward"});
}

// Backward lets go of what each node saved as it runs (activations are freed on the way, not at
// the end); a loss kept alive after its backward holds none of them.
TEST(Versions, BackwardReleasesTheSavedDataAsItGoes) {
  Tensor logits = galley::randn({4, 3}).set_requires_grad(true);
  Tensor labels = Tensor::from_vector({0.f, 2.f, 1.f, 1.f}, {4}).to(galley::DType::Int64);
  const long before = labels.impl()->storage.use_count();
  Tensor loss = galley::cross_entropy(logits, labels);
  EXPECT_GT(labels.impl()->storage.use_count(), before) << "the labels are saved";
  loss.backward();
  EXPECT_EQ(labels.impl()->storage.use_count(), before);
}

// clip_grad_value_ clamps the gradients in place and counts the write, like clip_grad_norm_.
TEST(Versions, ClippingTheGradientsCountsAWrite) {
  Tensor p = fvec({1.f, -1.f}, {2});
  p.set_requires_grad(true);
  galley::sum(galley::mul(p, 3.f)).backward();
  const uint64_t v = p.grad().version();
  galley::nn::clip_grad_value_({p}, 1.0);
  EXPECT_GT(p.grad().version(), v);
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{1.f, 1.f}));
}

// A batch norm with a fused ReLU (with or without the residual) takes its mask from the output
// or from x and its own copy of the forward's bias: a bias written before the backward neither
// refuses it nor changes the gradient (PyTorch keeps no bias for batch norm either).
TEST(Versions, BatchNormWithReluKeepsNoLiveBias) {
  for (bool residual : {false, true}) {
    std::vector<float> grads[2];
    for (int write = 0; write < 2; ++write) {
      galley::manual_seed(3);
      Tensor x = galley::randn({4, 3, 2, 2}).set_requires_grad(true);
      Tensor r = galley::randn({4, 3, 2, 2});
      Tensor g = galley::randn({4, 3, 2, 2});
      Tensor w = galley::ones({3}).set_requires_grad(true);
      Tensor b = galley::full({3}, 0.1f).set_requires_grad(true);
      const galley::BatchNormOptions o{.training = true, .relu = true};
      Tensor y = galley::sum(
          galley::mul(residual ? galley::batch_norm_add(x, r, Tensor(), Tensor(), w, b, o)
                               : galley::batch_norm(x, Tensor(), Tensor(), w, b, o),
                      g));
      if (write) {
        galley::NoGradGuard no_grad;
        b.fill_(5.f);
      }
      y.backward();
      grads[write] = x.grad().to_vector();
    }
    EXPECT_EQ(grads[0], grads[1]) << (residual ? "batch_norm_add" : "batch_norm");
  }
}

// div keeps the numerator for the divisor's gradient, as PyTorch does, not the quotient: the
// quotient may be written after the forward; the numerator may not while the divisor needs a
// gradient.
TEST(Versions, DivKeepsTheNumeratorNotTheQuotient) {
  Tensor a = fvec({1.f, 2.f}, {2});
  a.set_requires_grad(true);
  Tensor b = fvec({4.f, 8.f}, {2});
  b.set_requires_grad(true);
  Tensor q = galley::div(a, b);
  Tensor y = galley::sum(galley::mul(q, 2.f));
  {
    galley::NoGradGuard no_grad;
    q.fill_(0.f);
  }
  y.backward();
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{-2.f / 16.f, -4.f / 64.f}));
  Tensor n = galley::mul(a, 1.f);
  Tensor z = galley::sum(galley::div(n, b));
  {
    galley::NoGradGuard no_grad;
    n.fill_(0.f);
  }
  expect_contains(error_of([&] { z.backward(); }), {"the numerator", "div"});
}

// A backward whose kernel runs out of host heap (a std::bad_alloc, not a tensor allocation)
// reaches the caller of backward() as an OutOfMemoryError naming the op.
TEST(Autograd, AHostAllocationFailureInABackwardIsAnOutOfMemoryError) {
  Tensor a = galley::ones({3}).set_requires_grad(true);
  Tensor y =
      galley::autograd::record(galley::mul(a.detach(), 2.f), "hungry_op", {a},
                               [](const Tensor&, std::vector<Tensor>&) { throw std::bad_alloc(); });
  Tensor loss = galley::sum(y);
  try {
    loss.backward();
    ADD_FAILURE() << "no exception";
  } catch (const galley::OutOfMemoryError& e) {
    expect_contains(e.what(), {"the backward of hungry_op", "host allocation failed"});
  }
}

// An add_ that anomaly detection refuses (the sum is not finite) leaves the tensor's values as
// well as its history as they were: a backward after the caught error computes the gradients of
// the graph as it stands. (The sum used to stay written, and the old graph's backward read it.)
TEST(Autograd, ARefusedAddInPlaceLeavesItsTensorAsItWas) {
  Tensor a = Tensor::from_vector({1.f, 2.f, 3.f}, {3}).set_requires_grad(true);
  Tensor h = galley::mul(a, 2.f);
  {
    galley::DetectAnomalyGuard anomaly;
    const float inf = std::numeric_limits<float>::infinity();
    expect_contains(error_of([&] {
                      h.add_(Tensor::from_vector({inf, 0.f, 0.f}, {3}));
                    }),
                    {"detect_anomaly", "add_", "inf"});
  }
  EXPECT_EQ(h.to_vector(), (std::vector<float>{2.f, 4.f, 6.f}));
  galley::sum(h).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{2.f, 2.f, 2.f}));
}
