// Automatic mixed precision: which ops autocast casts and how, its parameter cache, its scopes
// and threads; the loss scaler's dynamic scheme against PyTorch's, its errors, its state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "amp_test_util.h"
#include "galley/galley.h"
#include "models.h"
#include "src/ops/autocast.h"
#include "test_util.h"

namespace nn = galley::nn;
namespace amp = galley::amp;
using galley::Device;
using galley::DType;
using galley::Tensor;

using amp_test::expect_near;
using amp_test::expect_same;
using amp_test::param;

TEST(Autocast, MatmulLinearConvRunInTheLowPrecisionDtype) {
  for (DType low : {DType::BFloat16, DType::Float16}) {
    const std::string d = galley::dtype_name(low);
    Tensor a = galley::randn({5, 7}), b = galley::randn({7, 3});
    Tensor x = galley::randn({2, 3, 6, 6}), w = param({4, 3, 3, 3}, 1), bias = param({4}, 2);
    Tensor lw = param({3, 7}, 3), lb = param({3}, 4);
    Tensor mm, lin, conv;
    {
      amp::Autocast autocast(low);
      EXPECT_TRUE(amp::is_autocast_enabled());
      EXPECT_EQ(amp::autocast_dtype(), low);
      mm = galley::matmul(a, b);
      lin = galley::linear(a, lw, lb);
      conv = galley::conv2d(x, w, bias, {.padding = 1});
    }
    EXPECT_FALSE(amp::is_autocast_enabled());
    // The same ops on inputs cast by hand: the same bits.
    expect_same(mm, galley::matmul(a.to(low), b.to(low)), d + " matmul");
    expect_same(lin, galley::linear(a.to(low), lw.to(low), lb.to(low)), d + " linear");
    expect_same(conv, galley::conv2d(x.to(low), w.to(low), bias.to(low), {.padding = 1}),
                d + " conv2d");
    // Outside the scope: float32 again.
    EXPECT_EQ(galley::matmul(a, b).dtype(), DType::Float32);
  }
}

// Under either low-precision dtype, with the inputs in it.
TEST(Autocast, SensitiveOpsRunInFloat32) {
  for (DType low : {DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(galley::dtype_name(low));
    Tensor x = galley::randn({4, 6}).to(low);
    Tensor pos = galley::uniform({4, 6}, 0.5f, 2.f).to(low);
    Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 5, 2, 3}, {4});
    amp::Autocast autocast(low);
    const Tensor xf = x.to(DType::Float32), pf = pos.to(DType::Float32);
    struct Case {
      const char* name;
      Tensor got, want;
    };
    std::vector<Case> cases;
    {
      // The references run with autocast off, on float32 inputs.
      Tensor s = galley::softmax(x, 1), ls = galley::log_softmax(x, 1),
             ce = galley::cross_entropy(x, labels), sm = galley::sum(x), sd = galley::sum(x, 1),
             mn = galley::mean(x), md = galley::mean(x, 0, true), e = galley::exp(x),
             l = galley::log(pos), p = galley::pow(pos, 1.5f);
      amp::Autocast off(DType::BFloat16, false);
      cases = {{"softmax", s, galley::softmax(xf, 1)},
               {"log_softmax", ls, galley::log_softmax(xf, 1)},
               {"cross_entropy", ce, galley::cross_entropy(xf, labels)},
               {"sum", sm, galley::sum(xf)},
               {"sum(dim)", sd, galley::sum(xf, 1)},
               {"mean", mn, galley::mean(xf)},
               {"mean(dim)", md, galley::mean(xf, 0, true)},
               {"exp", e, galley::exp(xf)},
               {"log", l, galley::log(pf)},
               {"pow", p, galley::pow(pf, 1.5f)}};
    }
    for (auto& c : cases) expect_same(c.got, c.want, c.name);
    // BatchNorm computes its statistics in float32 and keeps its running ones float32, whatever
    // the input's dtype; the output is the input's.
    nn::BatchNorm1D bn(6);
    Tensor y = bn(x);
    EXPECT_EQ(y.dtype(), low);
    for (auto& [name, b] : bn.named_buffers())
      if (name != "num_batches_tracked") EXPECT_EQ(b.dtype(), DType::Float32) << name;
    {
      amp::Autocast off(low, false);
      Tensor rm = galley::zeros({6}), rv = galley::ones({6});
      galley::batch_norm(xf, rm, rv, Tensor(), Tensor(), {.training = true});
      expect_near(bn.running_mean(), rm, 1e-6f, "running_mean");
      expect_near(bn.running_var(), rv, 1e-6f, "running_var");
    }
  }
}

TEST(Autocast, MixedDtypesPromoteToTheWidest) {
  Tensor h = galley::randn({3, 4}).to(DType::BFloat16), f = galley::randn({3, 4});
  Tensor g = galley::randn({3, 4}).to(DType::Float16);
  // Without autocast a mix is an error naming both dtypes.
  testutil::expect_contains(testutil::error_of([&] { galley::add(h, f); }),
                            {"add", "bfloat16", "float32"});
  amp::Autocast autocast(DType::BFloat16);
  expect_same(galley::add(h, f), galley::add(h.to(DType::Float32), f), "add");
  expect_same(galley::sub(f, h), galley::sub(f, h.to(DType::Float32)), "sub");
  expect_same(galley::mul(h, g), galley::mul(h.to(DType::Float32), g.to(DType::Float32)),
              "mul bfloat16 x float16");
  expect_same(galley::div(h, f), galley::div(h.to(DType::Float32), f), "div");
  // One dtype stays as it is: bfloat16 / bfloat16 is bfloat16, of the operands' own bits.
  Tensor q = galley::div(h, h);
  EXPECT_EQ(q.dtype(), DType::BFloat16);
  {
    amp::Autocast off(DType::BFloat16, false);
    expect_same(q, galley::div(h, h), "div of one dtype");
  }
  expect_same(galley::cat({h, f}, 0), galley::cat({h.to(DType::Float32), f}, 0), "cat");
  expect_same(galley::stack({f, h}, 1), galley::stack({f, h.to(DType::Float32)}, 1), "stack");
}

// As PyTorch's promotion, a 0-dim tensor (a scalar) does not widen tensors with dimensions.
TEST(Autocast, AZeroDimTensorTakesTheDtypeOfTheOthers) {
  Tensor h = galley::randn({3}).to(DType::BFloat16);
  Tensor two = galley::full({}, 2.f), half_two = galley::full({}, 2.f, DType::BFloat16);
  amp::Autocast autocast(DType::BFloat16);
  Tensor y = galley::mul(h, two);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  expect_same(y, galley::mul(h, two.to(DType::BFloat16)), "bfloat16 x 0-dim float32");
  EXPECT_EQ(galley::add(two, half_two).dtype(), DType::Float32) << "all 0-dim: the widest";
}

// A layer's fused ReLU gives what relu(op(x, w, b)) gives under autocast: the product and its
// bias rounded once to bfloat16 (a bias added after a rounded product rounds twice).
TEST(Autocast, LayersWithAFusedReluRoundOnceAsTheUnfusedOps) {
  galley::manual_seed(61);
  galley::nn::Linear fc(16, 8, {.relu = true});
  galley::nn::Conv2D conv(3, 8, 3, {.padding = 1, .relu = true});
  Tensor x = galley::randn({4, 16}) * 3.f, image = galley::randn({2, 3, 6, 6}) * 3.f;
  amp::Autocast autocast(DType::BFloat16);
  expect_same(fc(x), galley::relu(galley::linear(x, fc.weight(), fc.bias())), "Linear");
  expect_same(conv(image),
              galley::relu(galley::conv2d(image, conv.weight(), conv.bias(), {.padding = 1})),
              "Conv2D");
}

TEST(Autocast, InPlaceAddAndBiasReluKeepTheFirstInputsDtype) {
  Tensor b = galley::randn({4});
  Tensor bias = param({4}, 9);
  amp::Autocast autocast(DType::BFloat16);
  // add_: a float32 b is added in float32 and the sum rounded once (as PyTorch's add_).
  Tensor a = galley::randn({2, 4}).to(DType::BFloat16);
  Tensor want = galley::add(a.to(DType::Float32), b).to(DType::BFloat16);
  a.add_(b);
  expect_same(a, want, "add_");
  // 1 + (2^-8 + 2^-16): rounded once to bfloat16 it is 1 + 2^-7; b rounded first, 1 + 2^-8 is
  // a tie that goes to 1.
  Tensor one = galley::full({1}, 1.f, DType::BFloat16);
  one.add_(galley::full({1}, std::ldexp(1.f, -8) + std::ldexp(1.f, -16)));
  EXPECT_EQ(one.to(DType::Float32).item(), 1.f + std::ldexp(1.f, -7));
  // Its gradients: a's in a's dtype, a float32 b's in float32.
  Tensor leaf = param({2, 4}, 10), shortcut = param({4}, 11);
  Tensor sum = galley::mul(leaf.to(DType::BFloat16), galley::full({}, 2.f, DType::BFloat16));
  sum.add_(shortcut);
  galley::sum(sum.to(DType::Float32)).backward();
  EXPECT_EQ(shortcut.grad().dtype(), DType::Float32);
  EXPECT_EQ(shortcut.grad().to_vector(), std::vector<float>(4, 2.f));
  EXPECT_EQ(leaf.grad().to_vector(), std::vector<float>(8, 2.f));
  Tensor x = galley::randn({2, 4, 3, 3}).to(DType::BFloat16);
  expect_same(galley::bias_relu(x, bias, 1), galley::bias_relu(x, bias.to(DType::BFloat16), 1),
              "bias_relu");
  // batch_norm_add: a float32 residual beside a bfloat16 input is rounded to bfloat16 first.
  Tensor r = galley::randn({2, 4, 3, 3});
  const galley::BatchNormOptions o{.training = true, .relu = true};
  expect_same(
      galley::batch_norm_add(x, r, Tensor(), Tensor(), Tensor(), Tensor(), o),
      galley::batch_norm_add(x, r.to(DType::BFloat16), Tensor(), Tensor(), Tensor(), Tensor(), o),
      "batch_norm_add");
}

TEST(Autocast, OtherOpsKeepTheirInputsDtype) {
  amp::Autocast autocast(DType::BFloat16);
  Tensor f = galley::randn({2, 3, 4, 4});
  EXPECT_EQ(galley::relu(f).dtype(), DType::Float32);
  EXPECT_EQ(galley::max_pool2d(f, {.kernel_size = 2}).dtype(), DType::Float32);
  EXPECT_EQ(galley::avg_pool2d(f.to(DType::BFloat16), {.kernel_size = 2}).dtype(), DType::BFloat16);
  EXPECT_EQ(galley::gelu(f.to(DType::Float16)).dtype(), DType::Float16);
  // batch_norm: a 16-bit input with float32 statistics and parameters returns the input's dtype.
  Tensor rm = galley::zeros({3}), rv = galley::ones({3});
  EXPECT_EQ(galley::batch_norm(f.to(DType::BFloat16), rm, rv, galley::ones({3}), galley::zeros({3}),
                               {.training = true})
                .dtype(),
            DType::BFloat16);
}

TEST(Autocast, GradientsArriveInTheParametersFloat32) {
  nn::Linear fc(6, 3);
  nn::Conv2D conv(2, 4, 3, {.padding = 1});
  Tensor x = galley::randn({3, 2, 5, 5}), v = galley::randn({3, 6});
  Tensor loss;
  {
    amp::Autocast autocast(DType::BFloat16);
    Tensor h = conv(x);
    EXPECT_EQ(h.dtype(), DType::BFloat16);
    loss = galley::add(galley::sum(fc(v)), galley::sum(h));
  }
  EXPECT_EQ(loss.dtype(), DType::Float32);
  loss.backward();
  // The same graph with the casts written out.
  std::vector<Tensor> ps = {fc.weight(), fc.bias(), conv.weight(), conv.bias()};
  std::vector<Tensor> leaves;
  for (auto& p : ps) leaves.push_back(p.detach().clone().set_requires_grad());
  const DType bf = DType::BFloat16;
  Tensor h = galley::conv2d(x.to(bf), leaves[2].to(bf), leaves[3].to(bf), {.padding = 1});
  Tensor out = galley::linear(v.to(bf), leaves[0].to(bf), leaves[1].to(bf));
  galley::add(galley::sum(out.to(DType::Float32)), galley::sum(h.to(DType::Float32))).backward();
  for (size_t k = 0; k < ps.size(); ++k) {
    ASSERT_TRUE(ps[k].grad().defined()) << "parameter " << k;
    EXPECT_EQ(ps[k].grad().dtype(), DType::Float32) << "parameter " << k;
    expect_same(ps[k].grad(), leaves[k].grad(), "gradient of parameter " + std::to_string(k));
  }
}

// What autocast's forward of `fc` should give: the layer's op on the input and the parameters as
// they are now, each rounded to bfloat16, outside the scope.
namespace {
Tensor bf16_linear(nn::Linear& fc, const Tensor& x) {
  amp::Autocast off(DType::BFloat16, false);
  return galley::linear(x.to(DType::BFloat16), fc.weight().to(DType::BFloat16),
                        fc.bias().to(DType::BFloat16));
}
}  // namespace

TEST(Autocast, ParametersAreConvertedOncePerScopeAndAgainAfterAStep) {
  nn::Linear fc(4, 4);
  Tensor x = galley::randn({2, 4});
  galley::optim::SGD opt(fc.parameters(), {.learning_rate = 0.5});
  amp::Autocast autocast(DType::BFloat16);
  {
    galley::detail::AutocastPause pause;
    Tensor first = pause.low(fc.weight()), again = pause.low(fc.weight());
    EXPECT_TRUE(first.is_same(again)) << "a parameter must be converted once per scope";
    // An activation (not a parameter) is converted by each op that reads it.
    EXPECT_FALSE(pause.low(x).is_same(pause.low(x)));
  }
  // A tied weight used twice: one conversion, and both uses' gradients reach the parameter.
  Tensor y = fc(fc(x));
  galley::sum(y).backward();
  Tensor g = fc.weight().grad();
  ASSERT_TRUE(g.defined());
  opt.step();  // writes the weights in place: the cached copies are stale
  opt.clear_grad();
  Tensor after = fc(x);
  const Tensor want = bf16_linear(fc, x);
  expect_same(after, want, "the forward after an optimizer step inside the scope");
  // Forward and backward twice in one scope (gradient accumulation): both run through the one
  // cached conversion.
  galley::sum(fc(x)).backward();
  Tensor once = fc.weight().grad().clone();
  galley::sum(fc(x)).backward();
  expect_near(fc.weight().grad(), galley::mul(once, 2.f), 1e-6f, "accumulated gradient");
  // Two forwards, then their two backwards (two losses of one step): the first backward must
  // leave the shared conversion for the second, as PyTorch's does.
  const Tensor x3 = galley::mul(x, 3.f);
  std::vector<Tensor> alone;
  for (const Tensor& in : {x, x3}) {
    opt.clear_grad();
    galley::sum(fc(in)).backward();
    alone.push_back(fc.weight().grad().clone());
  }
  opt.clear_grad();
  Tensor first = galley::sum(fc(x)), second = galley::sum(fc(x3));
  first.backward();
  second.backward();
  expect_same(fc.weight().grad(), galley::add(alone[0], alone[1]), "two losses' gradients");
}

// A parameter written in place by anything (copy_, fill_, a write through a view), not only an
// optimizer step or a load, is converted afresh: the cached copy remembers the data's version.
TEST(Autocast, AParameterWrittenInPlaceIsConvertedAfresh) {
  nn::Linear fc(4, 3);
  Tensor x = galley::randn({2, 4});
  amp::Autocast autocast(DType::BFloat16);
  Tensor before = fc(x);
  fc.weight().fill_(0.25f);
  {
    galley::NoGradGuard no_grad;
    fc.bias().narrow(0, 0, 2).fill_(-1.f);
  }
  Tensor after = fc(x);
  const Tensor want = bf16_linear(fc, x);
  expect_same(after, want, "the forward after the weights were written in place");
}

TEST(Autocast, ACopyMadeWithoutGradientsIsNotReusedForTraining) {
  nn::Linear fc(3, 2);
  Tensor x = galley::randn({2, 3});
  amp::Autocast autocast(DType::BFloat16);
  {
    galley::NoGradGuard no_grad;
    fc(x);
  }
  galley::sum(fc(x)).backward();
  ASSERT_TRUE(fc.weight().grad().defined());
  EXPECT_EQ(fc.weight().grad().dtype(), DType::Float32);
}

// Layer::to moves the parameters in place: the copies cached before are on the old device, and
// a forward after it converts afresh.
TEST(Autocast, MovingALayerInsideTheScopeDropsItsCachedCopies) {
  nn::Linear fc(3, 2);
  Tensor x = galley::randn({2, 3});
  amp::Autocast autocast(DType::BFloat16);
  fc(x);
  const galley::Device other = galley::Device::cpu(1);
  fc.to(other);
  Tensor y = fc(x.to(other));
  EXPECT_EQ(y.device(), other);
  Tensor want;
  {
    amp::Autocast off(DType::BFloat16, false);
    want = galley::linear(x.to(other).to(DType::BFloat16), fc.weight().to(DType::BFloat16),
                          fc.bias().to(DType::BFloat16));
  }
  expect_same(y, want, "the forward after Layer::to(Device)");
}

TEST(Autocast, ScopesNestAndAreThreadLocal) {
  Tensor a = galley::randn({2, 3}), b = galley::randn({3, 2});
  EXPECT_EQ(amp::autocast_dtype(), DType::BFloat16);
  {
    amp::Autocast outer(DType::BFloat16);
    {
      amp::Autocast inner(DType::Float16);
      EXPECT_EQ(galley::matmul(a, b).dtype(), DType::Float16);
    }
    {
      amp::Autocast off(DType::BFloat16, false);
      EXPECT_FALSE(amp::is_autocast_enabled());
      EXPECT_EQ(galley::matmul(a, b).dtype(), DType::Float32);
    }
    EXPECT_EQ(galley::matmul(a, b).dtype(), DType::BFloat16);
    DType other_thread = DType::Int64;
    std::thread t([&] { other_thread = galley::matmul(a, b).dtype(); });
    t.join();
    EXPECT_EQ(other_thread, DType::Float32) << "another thread has its own (off) setting";
  }
  EXPECT_EQ(galley::matmul(a, b).dtype(), DType::Float32);
}

TEST(Autocast, RefusesAFullPrecisionDtype) {
  testutil::expect_contains(testutil::error_of([] { amp::Autocast a(DType::Float32); }),
                            {"amp::Autocast", "bfloat16 or float16", "float32"});
  EXPECT_FALSE(amp::is_autocast_enabled());
  // A disabled scope takes any dtype, as PyTorch's.
  {
    amp::Autocast off(DType::Float32, false);
    EXPECT_FALSE(amp::is_autocast_enabled());
  }
}

TEST(Autocast, DataParallelReplicasRunUnderTheCallersSetting) {
  galley::manual_seed(11);
  struct Net : nn::Layer {
    Net() {
      register_layer("conv", conv);
      register_layer("fc", fc);
    }
    Tensor forward(const Tensor& x) override {
      return fc(galley::flatten(galley::relu(conv(x)), 1));
    }
    nn::Conv2D conv{2, 3, 3, {.padding = 1}};
    nn::Linear fc{3 * 4 * 4, 5};
  };
  galley::DataParallel<Net> model({Device::cpu(0), Device::cpu(1)});
  Net single;
  single.load_state_dict(model.module(0).state_dict());
  Tensor x = galley::randn({6, 2, 4, 4});
  Tensor out, want;
  {
    amp::Autocast autocast(DType::BFloat16);
    out = model(x);
    want = single(x);
  }
  EXPECT_EQ(out.dtype(), DType::BFloat16);
  expect_near(out, want, 1e-2f, "DataParallel logits under autocast");
  galley::sum(out.to(DType::Float32)).backward();
  for (auto& p : model.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), DType::Float32);
  }
  // Without a scope the replicas run in float32.
  EXPECT_EQ(model(x).dtype(), DType::Float32);
}

// --------------------------------------------------------------------------- parity

namespace {

// tests/parity/amp_reference.py's generator: 2u - 1 with u = (splitmix64(seed + i) >> 40)
// / 2^24, times `scale` in double, rounded to float32.
std::vector<double> hashed_uniform(uint64_t seed, int64_t n) {
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed + static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    out[i] = 2.0 * (static_cast<double>(z >> 40) / double(1 << 24)) - 1.0;
  }
  return out;
}

Tensor hashed_tensor(uint64_t seed, const galley::Shape& shape, double scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v;
  for (double u : hashed_uniform(seed, n)) v.push_back(static_cast<float>(u * scale));
  return Tensor::from_vector(v, shape);
}

Tensor hashed_labels(uint64_t seed, int64_t n, int64_t classes) {
  std::vector<int64_t> v;
  for (double u : hashed_uniform(seed, n))
    v.push_back(std::min(static_cast<int64_t>((u + 1.0) * 0.5 * classes), classes - 1));
  return Tensor::from_vector(v, {n});
}

// Every `stride`-th element of t, as the reference file samples it.
Tensor sampled(const Tensor& t, int64_t stride) {
  std::vector<float> all = t.to(DType::Float32).to_vector(), out;
  for (size_t i = 0; i < all.size(); i += stride) out.push_back(all[i]);
  return Tensor::from_vector(out, {static_cast<int64_t>(out.size())});
}

// max |got - want| <= rtol * max |want| (+ atol): a tolerance on the tensor's scale.
void expect_normwise(const Tensor& got, const std::vector<float>& want, double rtol, double atol,
                     const std::string& what) {
  std::vector<float> g = got.to_vector();
  ASSERT_EQ(g.size(), want.size()) << what;
  double scale = 0, worst = 0;
  size_t at = 0;
  for (float w : want) scale = std::max(scale, std::fabs(double(w)));
  for (size_t i = 0; i < g.size(); ++i)
    if (std::fabs(double(g[i]) - want[i]) > worst)
      worst = std::fabs(double(g[i]) - want[i]), at = i;
  EXPECT_LE(worst, rtol * scale + atol)
      << what << ": worst at " << at << ": galley " << g[at] << ", torch " << want[at]
      << " (max |torch| " << scale << ")";
}

}  // namespace

// SimpleCNN under bfloat16 autocast against torch.autocast("cpu", dtype=torch.bfloat16) (the run
// of tests/parity/amp_reference.py, on inputs and weights both sides generate alike): the
// first step's logits and gradients, the losses of 20 Adam steps, the final parameters. Both
// round conv's and linear's inputs to bfloat16 and accumulate in float32, but in another order,
// so a rounded output may differ by one bfloat16 step (2^-8 relative) and the runs drift apart
// slowly: the losses must agree within 1e-2 relative. Adam moves every weight by about lr per
// step whatever the gradient's size, so a near-zero gradient of another sign moves a weight
// 2 lr apart: the final parameters must agree within 5 lr.
TEST(AutocastParity, SimpleCnnAdam20StepsTrackPyTorchAutocast) {
  std::ifstream in(std::string(GALLEY_SOURCE_DIR) + "/tests/data/autocast_reference.json");
  ASSERT_TRUE(in) << "tests/data/autocast_reference.json is missing";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const int64_t stride = ref["sample_stride"].get<int64_t>(), batch = ref["batch"].get<int64_t>();
  testmodels::SimpleCNN model;
  std::map<std::string, Tensor> init;
  for (auto& [name, p] : model.named_parameters()) {
    for (const auto& e : ref["init"])
      if (e[0].get<std::string>() == name)
        init[name] =
            hashed_tensor(e[1].get<uint64_t>(), p.shape(), 1.0 / std::sqrt(e[2].get<double>()));
  }
  ASSERT_EQ(init.size(), 4u);
  model.load_state_dict(init);
  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-3});
  std::vector<float> losses;
  const auto want_losses = ref["losses"].get<std::vector<float>>();
  for (int64_t s = 0; s < ref["steps"].get<int64_t>(); ++s) {
    Tensor x = hashed_tensor(1000 + 2 * s, {batch, 3, 32, 32}, 1.0);
    Tensor y = hashed_labels(1001 + 2 * s, batch, 10);
    opt.clear_grad();
    Tensor logits, loss;
    {
      amp::Autocast autocast(DType::BFloat16);
      logits = model(x);
      loss = galley::cross_entropy(logits, y);
    }
    ASSERT_EQ(logits.dtype(), DType::BFloat16);
    ASSERT_EQ(loss.dtype(), DType::Float32);
    losses.push_back(loss.item());
    EXPECT_NEAR(losses.back(), want_losses[s], 1e-2 * std::fabs(want_losses[s])) << "step " << s;
    loss.backward();
    if (s == 0) {
      expect_normwise(logits.to(DType::Float32).reshape({-1}),
                      ref["out0"].get<std::vector<float>>(), 1e-2, 0, "logits of step 0");
      for (auto& [name, p] : model.named_parameters()) {
        ASSERT_EQ(p.grad().dtype(), DType::Float32) << name;
        expect_normwise(sampled(p.grad(), stride), ref["grad0"][name].get<std::vector<float>>(),
                        2e-2, 0, "gradient of " + name + " at step 0");
      }
    }
    opt.step();
  }
  for (auto& [name, p] : model.named_parameters()) {
    expect_normwise(sampled(p, stride), ref["final"][name].get<std::vector<float>>(), 0, 5e-3,
                    "final " + name);
    double sum = 0;
    for (float v : p.to_vector()) sum += v;
    EXPECT_NEAR(sum, ref["final_sum"][name].get<double>(), 5e-3 * std::sqrt(double(p.numel())))
        << "sum of final " << name;
  }
}

// --------------------------------------------------------------------------- GradScaler

TEST(GradScaler, ScalesTheLossInFloat32) {
  amp::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  Tensor w = param({3}, 5);
  Tensor loss = galley::sum(galley::mul(w, w)).to(DType::BFloat16);
  Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.dtype(), DType::Float32);
  EXPECT_EQ(scaled.item(), loss.to(DType::Float32).item() * 65536.f);
  amp::GradScaler off({.enabled = false});
  EXPECT_TRUE(off.scale(loss).is_same(loss));
  EXPECT_EQ(off.get_scale(), 1.0);
}

// The run of tests/parity/amp_reference.py (PyTorch's CPU GradScaler): a Linear(4, 2),
// SGD, Inf and NaN written into a gradient at three steps. Every step's scale, growth tracker,
// whether the optimizer stepped, and the parameters must match.
TEST(GradScaler, ScaleSequenceMatchesPyTorchWithInjectedInfs) {
  std::ifstream in(std::string(GALLEY_SOURCE_DIR) + "/tests/data/grad_scaler_reference.json");
  ASSERT_TRUE(in) << "tests/data/grad_scaler_reference.json is missing";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto& o = ref["options"];
  nn::Linear fc(4, 2);
  auto vec = [](const nlohmann::json& j) { return j.get<std::vector<float>>(); };
  fc.load_state_dict({{"weight", Tensor::from_vector(vec(ref["init"]["weight"]), {2, 4})},
                      {"bias", Tensor::from_vector(vec(ref["init"]["bias"]), {2})}});
  galley::optim::SGD opt(fc.parameters(), {.learning_rate = ref["lr"].get<double>()});
  amp::GradScaler scaler({.init_scale = o["init_scale"].get<double>(),
                          .growth_factor = o["growth_factor"].get<double>(),
                          .backoff_factor = o["backoff_factor"].get<double>(),
                          .growth_interval = o["growth_interval"].get<int64_t>()});
  int step = 0, skipped = 0;
  for (const auto& s : ref["steps"]) {
    const std::string at = "step " + std::to_string(step++);
    Tensor x = Tensor::from_vector(vec(s["x"]), {5, 4});
    Tensor y = Tensor::from_vector(s["y"].get<std::vector<int64_t>>(), {5});
    opt.clear_grad();
    Tensor loss = galley::cross_entropy(fc(x), y);
    EXPECT_NEAR(loss.item(), s["loss"].get<float>(), 1e-6f) << at;
    scaler.scale(loss).backward();
    if (s.contains("inject")) {
      const auto& inj = s["inject"];
      Tensor p = inj["param"] == "weight" ? fc.weight() : fc.bias();
      std::vector<float> g = p.grad().to_vector();
      auto idx = inj["index"].get<std::vector<int64_t>>();
      const int64_t flat = idx.size() == 2 ? idx[0] * 4 + idx[1] : idx[0];
      g[flat] = std::stof(inj["value"].get<std::string>());
      p.set_grad(Tensor::from_vector(g, p.shape()));
    }
    const bool stepped = scaler.step(opt);
    scaler.update();
    EXPECT_EQ(stepped, s["stepped"].get<bool>()) << at;
    EXPECT_EQ(scaler.last_step_skipped(), !stepped) << at;
    skipped += !stepped;
    EXPECT_EQ(scaler.get_scale(), s["scale"].get<double>()) << at;
    EXPECT_EQ(scaler.growth_tracker(), s["growth_tracker"].get<int64_t>()) << at;
    expect_near(fc.weight(), Tensor::from_vector(vec(s["params"]["weight"]), {2, 4}), 1e-6f,
                at + " weight");
    expect_near(fc.bias(), Tensor::from_vector(vec(s["params"]["bias"]), {2}), 1e-6f, at + " bias");
  }
  EXPECT_EQ(skipped, 3);
  const galley::StateDict sd = scaler.state_dict();
  EXPECT_EQ(sd.get_double("scale", "test"), ref["state_dict"]["scale"].get<double>());
  EXPECT_EQ(sd.get_int("_growth_tracker", "test"),
            ref["state_dict"]["_growth_tracker"].get<int64_t>());
  EXPECT_EQ(sd.get_int("growth_interval", "test"), o["growth_interval"].get<int64_t>());
}

TEST(GradScaler, UnscaleDividesTheGradientsOnce) {
  Tensor w = param({4}, 6);
  galley::optim::SGD opt({w}, {.learning_rate = 0.1});
  amp::GradScaler scaler({.init_scale = 8.0});
  scaler.scale(galley::sum(galley::mul(w, w))).backward();
  std::vector<float> scaled = w.grad().to_vector();
  scaler.unscale_(opt);
  std::vector<float> unscaled = w.grad().to_vector();
  for (size_t i = 0; i < scaled.size(); ++i) EXPECT_EQ(unscaled[i], scaled[i] * 0.125f);
  testutil::expect_contains(testutil::error_of([&] { scaler.unscale_(opt); }),
                            {"unscale_", "already", "update()"});
  EXPECT_TRUE(scaler.step(opt));  // does not unscale again
  testutil::expect_contains(testutil::error_of([&] { scaler.step(opt); }),
                            {"step", "already", "update()"});
  testutil::expect_contains(testutil::error_of([&] { scaler.unscale_(opt); }), {"after step()"});
  scaler.update();
  testutil::expect_contains(testutil::error_of([&] { scaler.update(); }),
                            {"update", "no gradients were checked"});
}

TEST(GradScaler, ANonFiniteScaledLossSkipsTheStepInsteadOfRaising) {
  Tensor w = param({3}, 7);
  std::vector<float> before = w.to_vector();
  galley::optim::Adam opt({w}, {.learning_rate = 0.1});
  amp::GradScaler scaler;
  // 1e35 * 65536 overflows float32: the scaled loss is infinite.
  Tensor loss = galley::mul(galley::sum(galley::mul(w, w)), 1e35f);
  ASSERT_TRUE(std::isfinite(loss.item()));
  Tensor scaled = scaler.scale(loss);
  ASSERT_TRUE(std::isinf(scaled.item()));
  scaled.backward();  // the loss guard lets a scaled loss through
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(w.to_vector(), before);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  // An unscaled infinite loss still stops at the guard.
  testutil::expect_contains(testutil::error_of([&] { galley::mul(loss, 1e10f).backward(); }),
                            {"the loss is inf"});
}

// Scaled losses summed into one, or one divided by the accumulation steps, are scaled losses
// too: backward from a non-finite one runs and the scaler skips the step, as in PyTorch (the
// guard used to refuse them, so a multi-loss step with an overflow stopped training).
TEST(GradScaler, ValuesComputedFromScaledLossesPassTheGuard) {
  for (int form = 0; form < 2; ++form) {
    SCOPED_TRACE(form == 0 ? "sum of two scaled losses" : "scaled loss / 4");
    Tensor w = param({3}, 7);
    std::vector<float> before = w.to_vector();
    galley::optim::Adam opt({w}, {.learning_rate = 0.1});
    amp::GradScaler scaler;
    Tensor finite = galley::sum(galley::mul(w, w));
    Tensor huge = galley::mul(finite, 1e35f);  // overflows float32 once scaled
    Tensor root = form == 0 ? galley::add(scaler.scale(finite), scaler.scale(huge))
                            : galley::div(scaler.scale(huge), 4.f);
    ASSERT_TRUE(std::isinf(root.item()));
    root.backward();
    EXPECT_FALSE(scaler.step(opt));
    scaler.update();
    EXPECT_EQ(w.to_vector(), before);
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    // The same value computed without the scaler still stops at the guard.
    testutil::expect_contains(testutil::error_of([&] { galley::mul(huge, 1e10f).backward(); }),
                              {"the loss is inf"});
  }
}

// docs/mixed_precision.md's recipe with gradient clipping: on an overflow step the clip lets the
// infinite norm through (error_if_nonfinite = false), the scaler skips the step and backs off,
// and the next steps run; the default clip refuses the step with a message that says so.
TEST(GradScaler, TheClippingRecipeSkipsAnOverflowStepAndGoesOn) {
  Tensor w = param({3}, 7);
  galley::optim::SGD opt({w}, {.learning_rate = 0.01});
  // Gradients of 100 x the scale: 4e38 overflows float32 on the first step, 2e38 after the backoff
  // does not.
  amp::GradScaler scaler({.init_scale = 4e36});
  const double first_scale = scaler.get_scale();
  std::vector<bool> stepped;
  for (int it = 0; it < 3; ++it) {
    const std::vector<float> before = w.to_vector();
    scaler.scale(galley::sum(galley::mul(w, 100.f))).backward();
    scaler.unscale_(opt);
    const float norm =
        galley::nn::clip_grad_norm_(opt.parameters(), 1.0, {.error_if_nonfinite = false});
    stepped.push_back(scaler.step(opt));
    scaler.update();
    EXPECT_EQ(std::isfinite(norm), bool(stepped.back())) << "iteration " << it;
    EXPECT_EQ(w.to_vector() != before, bool(stepped.back())) << "iteration " << it;
    opt.zero_grad();
  }
  EXPECT_EQ(stepped, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(scaler.get_scale(), first_scale * 0.5);
  // The default clip refuses the overflow and names the way out.
  amp::GradScaler strict({.init_scale = 4e36});
  strict.scale(galley::sum(galley::mul(w, 100.f))).backward();
  strict.unscale_(opt);
  testutil::expect_contains(
      testutil::error_of([&] { galley::nn::clip_grad_norm_(opt.parameters(), 1.0); }),
      {"clip_grad_norm_", "inf", "error_if_nonfinite = false", "GradScaler"});
}

TEST(GradScaler, StateRoundTripsThroughACheckpoint) {
  const std::string dir = ::testing::TempDir();
  Tensor w = param({2}, 8);
  galley::optim::SGD opt({w}, {.learning_rate = 0.1});
  amp::GradScaler scaler({.init_scale = 256.0, .growth_interval = 5});
  for (int i = 0; i < 3; ++i) {
    opt.clear_grad();
    scaler.scale(galley::sum(galley::mul(w, w))).backward();
    scaler.step(opt);
    scaler.update();
  }
  scaler.update(96.0);
  const std::string path = dir + "/grad_scaler_checkpoint.safetensors";
  galley::io::save_checkpoint(path, {.optimizer = &opt, .grad_scaler = &scaler});
  amp::GradScaler restored;
  galley::io::TrainingState state{.optimizer = &opt, .grad_scaler = &restored};
  galley::io::load_checkpoint(path, state);
  EXPECT_EQ(restored.get_scale(), 96.0);
  EXPECT_EQ(restored.growth_tracker(), 3);
  EXPECT_EQ(restored.options().growth_interval, 5);
  // A bad state changes nothing.
  galley::StateDict bad = scaler.state_dict();
  bad.set("_growth_tracker", int64_t{7});
  testutil::expect_contains(testutil::error_of([&] { restored.load_state_dict(bad); }),
                            {"_growth_tracker", "7"});
  EXPECT_EQ(restored.growth_tracker(), 3);
  testutil::expect_contains(
      testutil::error_of([&] { restored.load_state_dict(galley::StateDict{}); }),
      {"empty", "disabled"});
}

// A checkpoint saved without a scaler (mixed precision turned on since) loads into an enabled
// scaler, which keeps its state; resume() takes that newest file (it used to refuse it as
// damaged and fall back to the checkpoint before, losing the steps since).
TEST(GradScaler, ACheckpointWithoutScalerStateLoadsIntoAnEnabledScaler) {
  const std::string dir = ::testing::TempDir() + "/scalerless_checkpoints";
  std::filesystem::remove_all(dir);
  Tensor w = param({2}, 9);
  galley::optim::SGD opt({w}, {.learning_rate = 0.1});
  amp::GradScaler scaler({.init_scale = 512.0});
  galley::io::Checkpointer ckpt(dir);
  ckpt.save({.optimizer = &opt, .grad_scaler = &scaler, .step = 1});
  amp::GradScaler off({.enabled = false});
  ckpt.save({.optimizer = &opt, .grad_scaler = &off, .step = 2});
  amp::GradScaler fresh({.init_scale = 1024.0});
  galley::io::TrainingState state{.optimizer = &opt, .grad_scaler = &fresh};
  ASSERT_TRUE(ckpt.resume(state));
  EXPECT_EQ(state.step, 2);
  EXPECT_TRUE(ckpt.skipped().empty());
  EXPECT_EQ(fresh.get_scale(), 1024.0);
  std::filesystem::remove_all(dir);
}

// As PyTorch: a step with no gradient to check, and a float16 gradient to unscale, are errors
// that name the optimizer (and the parameter), and change nothing.
TEST(GradScaler, RefusesAStepWithoutGradientsAndFloat16Gradients) {
  Tensor w = param({2, 3}, 41);
  galley::optim::SGD opt({w}, {.learning_rate = 0.1});
  amp::GradScaler scaler;
  testutil::expect_contains(testutil::error_of([&] { scaler.step(opt); }),
                            {"amp::GradScaler::step", "SGD", "no parameter", "gradient"});
  Tensor h = param({4}, 42).to(DType::Float16).detach().set_requires_grad();
  galley::optim::SGD half({h}, {.learning_rate = 0.1});
  amp::GradScaler scaler16;
  galley::sum(scaler16.scale(galley::sum(h))).backward();
  const std::vector<float> before = h.grad().to(DType::Float32).to_vector();
  testutil::expect_contains(testutil::error_of([&] { scaler16.unscale_(half); }),
                            {"amp::GradScaler::unscale_", "parameter 0", "float16 gradient"});
  EXPECT_EQ(h.grad().to(DType::Float32).to_vector(), before) << "the gradient was changed";
}

// update() needs a check of some gradients since the last update (as PyTorch's "no inf checks
// were recorded"): a failed step or an unscale_ of no gradients grows nothing.
TEST(GradScaler, UpdateWithoutCheckedGradientsIsAnError) {
  Tensor w = param({2, 3}, 43);
  galley::optim::SGD opt({w}, {.learning_rate = 0.1});
  amp::GradScaler scaler({.growth_interval = 1});
  EXPECT_THROW(scaler.step(opt), galley::Error);
  testutil::expect_contains(testutil::error_of([&] { scaler.update(); }),
                            {"amp::GradScaler::update", "no gradients were checked"});
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  amp::GradScaler other({.growth_interval = 1});
  other.unscale_(opt);  // no gradients
  EXPECT_THROW(other.update(), galley::Error);
  EXPECT_EQ(other.get_scale(), 65536.0);
}

// A DataParallel replica's share of a one-sample-per-replica batch is a one-element output; its
// backward starts from the gradient it is given, so an Inf there is the scaler's to skip, not
// the loss guard's to raise.
TEST(GradScaler, AnInfInAOneElementReplicaOutputIsSkipped) {
  galley::DataParallel<nn::Linear> model({Device::cpu(0), Device::cpu(1)}, {}, 3, 1);
  galley::optim::SGD opt(model.parameters(), {.learning_rate = 0.1});
  amp::GradScaler scaler;
  Tensor x = Tensor::from_vector({0.5f, 0.5f, 0.5f, 0.5f, INFINITY, 0.5f}, {2, 3});
  std::vector<float> before = model.parameters()[0].to_vector();
  scaler.scale(galley::sum(model(x))).backward();
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(model.parameters()[0].to_vector(), before);
}

TEST(GradScaler, RefusesBadOptions) {
  testutil::expect_contains(testutil::error_of([] { amp::GradScaler s({.init_scale = 0}); }),
                            {"init_scale"});
  testutil::expect_contains(testutil::error_of([] { amp::GradScaler s({.growth_factor = 1}); }),
                            {"growth_factor"});
  testutil::expect_contains(testutil::error_of([] { amp::GradScaler s({.backoff_factor = 1}); }),
                            {"backoff_factor"});
  testutil::expect_contains(testutil::error_of([] { amp::GradScaler s({.growth_interval = 0}); }),
                            {"growth_interval"});
}

// An Inf in one replica's part of the batch reaches every replica's gradients through the
// all-reduce, so every replica skips the step and the replicas stay equal.
TEST(GradScaler, DataParallelReplicasAgreeOnASkippedStep) {
  amp_test::expect_replicas_skip_together({Device::cpu(0), Device::cpu(1)}, DType::BFloat16);
}

// The scale is a float32: values a double holds but a float32 does not (underflowing to 0,
// overflowing to inf) are refused. Gradients are checked after unscaling, as PyTorch's: a finite
// scaled gradient that overflows once a scale that backed off far is divided out skips the step
// and leaves the weights finite.
TEST(GradScaler, CheckedInFloat32AndAfterUnscaling) {
  for (double bad : {1e-50, 1e39})
    testutil::expect_contains(
        testutil::error_of([&] { amp::GradScaler scaler({.init_scale = bad}); }),
        {"init_scale", "float32"});
  amp::GradScaler scaler;
  testutil::expect_contains(testutil::error_of([&] { scaler.update(1e-50); }),
                            {"new_scale", "float32"});
  Tensor w = param({2}, 7);
  const std::vector<float> before = w.to_vector();
  galley::optim::SGD opt({w}, {.learning_rate = 0.1});
  scaler.update(1e-30);
  scaler.scale(galley::sum(w)).backward();
  w.set_grad(galley::full({2}, 1e10f));  // scaled: finite; unscaled 1e40: past float32
  EXPECT_FALSE(scaler.step(opt)) << "1e10 / 1e-30 overflows float32";
  EXPECT_EQ(w.to_vector(), before);
}
