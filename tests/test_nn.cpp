// Layers: registration and naming, modes, state dicts, default initialisation, forward results
// and the errors that name the layer and the shapes at fault.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "test_util.h"

#include <galley/galley.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace {

using galley::Shape;
using galley::Tensor;
namespace nn = galley::nn;

using testutil::error_of;

using testutil::expect_contains;

Tensor fvec(const std::vector<float>& v, const Shape& s) {
  return Tensor::from_vector(v, s);
}
Tensor labels(const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// A model with its own parameter, a member layer and an owned Sequential.
class Net : public nn::Layer {
 public:
  Net()
      : block_(std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(8, 8),
                                                std::make_shared<nn::ReLU>(),
                                                std::make_shared<nn::Linear>(8, 2))) {
    scale_ = register_parameter("scale", galley::ones({4}));
    register_layer("fc", fc_);
    register_layer("block", block_);
  }
  Tensor forward(const Tensor& x) override { return (*block_)(fc_(x * scale_)); }
  nn::Linear& fc() { return fc_; }
  nn::Sequential& block() { return *block_; }

 private:
  Tensor scale_;
  nn::Linear fc_{4, 8};
  std::shared_ptr<nn::Sequential> block_;
};

// A layer with a buffer next to its parameter.
class WithBuffer : public nn::Layer {
 public:
  WithBuffer() {
    register_parameter("w", galley::ones({2}));
    register_buffer("running", galley::zeros({2}));
  }
  Tensor forward(const Tensor& x) override { return x; }
};

std::vector<std::string> names_of(const std::vector<nn::NamedTensor>& v) {
  std::vector<std::string> out;
  for (auto& [n, t] : v) out.push_back(n);
  return out;
}

std::map<std::string, std::vector<float>> values_of(const nn::Layer& l) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [n, t] : l.named_state()) out[n] = t.to_vector();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Registration

TEST(Registration, NamedParametersOrderAndDottedNames) {
  Net net;
  const std::vector<std::string> want{"scale",          "fc.weight",    "fc.bias",
                                      "block.0.weight", "block.0.bias", "block.2.weight",
                                      "block.2.bias"};
  EXPECT_EQ(names_of(net.named_parameters()), want);
  EXPECT_EQ(net.parameters().size(), 7u);
  // The handles are the layers' own, not copies.
  auto named = net.named_parameters();
  EXPECT_TRUE(named[1].second.is_same(net.fc().weight()));
  EXPECT_TRUE(named[2].second.is_same(net.fc().bias()));
  EXPECT_TRUE(named[5].second.is_same(static_cast<nn::Linear&>(net.block()[2]).weight()));
  auto params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i].is_same(named[i].second));
    EXPECT_TRUE(params[i].requires_grad());
    EXPECT_TRUE(params[i].is_leaf());
  }
  EXPECT_EQ(params[3].shape(), (Shape{8, 8}));
  EXPECT_EQ(params[5].shape(), (Shape{2, 8}));
}

TEST(Registration, Children) {
  Net net;
  auto kids = net.children();
  ASSERT_EQ(kids.size(), 2u);
  EXPECT_EQ(kids[0].first, "fc");
  EXPECT_EQ(kids[0].second, &net.fc());
  EXPECT_EQ(kids[1].first, "block");
  EXPECT_EQ(net.block().size(), 3u);
  auto seq_kids = net.block().children();
  ASSERT_EQ(seq_kids.size(), 3u);
  EXPECT_EQ(seq_kids[0].first, "0");
  EXPECT_EQ(seq_kids[2].first, "2");
}

TEST(Registration, BuffersAreStateButNotParameters) {
  WithBuffer l;
  EXPECT_EQ(names_of(l.named_parameters()), (std::vector<std::string>{"w"}));
  EXPECT_EQ(names_of(l.named_buffers()), (std::vector<std::string>{"running"}));
  EXPECT_EQ(names_of(l.named_state()), (std::vector<std::string>{"w", "running"}));
  auto sd = l.state_dict();
  EXPECT_EQ(sd.size(), 2u);
  EXPECT_TRUE(sd.count("running"));
  EXPECT_FALSE(l.named_buffers()[0].second.requires_grad());
}

TEST(Registration, BadNamesAndDuplicatesThrow) {
  WithBuffer l;
  EXPECT_THROW(l.register_parameter("w", galley::ones({1})), galley::Error);
  EXPECT_THROW(l.register_parameter("a.b", galley::ones({1})), galley::Error);
  EXPECT_THROW(l.register_parameter("", galley::ones({1})), galley::Error);
  EXPECT_THROW(l.register_parameter("u", Tensor()), galley::Error);
  nn::Linear a(2, 2), b(2, 2);
  l.register_layer("a", a);
  EXPECT_THROW(l.register_layer("a", b), galley::Error);
  EXPECT_THROW(l.register_layer("x.y", b), galley::Error);
  EXPECT_THROW(l.register_layer("self", l), galley::Error);
}

// Generators follow the same naming rules: a checkpoint keys their state by the dotted names.
TEST(Registration, GeneratorNamesFollowTheRules) {
  WithBuffer l;
  galley::Generator g(1), h(2);
  EXPECT_THROW(l.register_generator("", g), galley::Error);
  EXPECT_THROW(l.register_generator("a.b", g), galley::Error);
  EXPECT_THROW(l.register_generator("w", g), galley::Error);  // the parameter's name
  l.register_generator("gen", g);
  EXPECT_THROW(l.register_generator("gen", h), galley::Error);
  EXPECT_THROW(l.register_parameter("gen", galley::ones({1})), galley::Error);
  EXPECT_EQ(l.named_generators().size(), 1u);
}

// A layer registered in two places (weights tied): parameters() lists its tensors once, under the
// first name, as PyTorch does, so an optimizer takes them (it refuses a parameter listed twice);
// the state keeps both names, as PyTorch's state_dict; both uses' gradients reach the one weight.
TEST(Registration, ASharedLayersParametersAreListedOnce) {
  auto lin = std::make_shared<nn::Linear>(3, 3);
  nn::Sequential s(lin, std::make_shared<nn::ReLU>(), lin);
  EXPECT_EQ(names_of(s.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_EQ(s.parameters().size(), 2u);
  EXPECT_EQ(names_of(s.named_state()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  galley::optim::SGD opt(s.parameters(), {.learning_rate = 0.1});
  Tensor x = galley::randn({2, 3});
  galley::sum(s(x)).backward();
  Tensor once = lin->weight().grad().clone();
  s.zero_grad();
  Tensor h = galley::relu(lin->forward(x));
  galley::sum(lin->forward(h)).backward();
  EXPECT_EQ(lin->weight().grad().to_vector(), once.to_vector());
  EXPECT_NO_THROW(opt.step());
}

TEST(Registration, NonLeafValueBecomesItsOwnLeaf) {
  Tensor x = galley::ones({2});
  x.set_requires_grad();
  WithBuffer l;
  Tensor& p = l.register_parameter("derived", x * 2.f);
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
  EXPECT_EQ(p.to_vector(), (std::vector<float>{2, 2}));
  Tensor& frozen = l.register_parameter("frozen", galley::ones({1}), false);
  EXPECT_FALSE(frozen.requires_grad());
}

TEST(Registration, LinearWithoutBias) {
  nn::Linear l(3, 2, false);
  EXPECT_EQ(names_of(l.named_parameters()), (std::vector<std::string>{"weight"}));
  EXPECT_FALSE(l.bias().defined());
  nn::Conv2D c(2, 4, 3, {.bias = false});
  EXPECT_EQ(c.parameters().size(), 1u);
  EXPECT_EQ(c.weight().shape(), (Shape{4, 2, 3, 3}));
}

// ---------------------------------------------------------------------------------------------
// Modes and devices

TEST(Modes, TrainEvalPropagate) {
  Net net;
  EXPECT_TRUE(net.is_training());
  EXPECT_TRUE(net.fc().is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.fc().is_training());
  EXPECT_FALSE(net.block().is_training());
  EXPECT_FALSE(net.block()[0].is_training());
  EXPECT_FALSE(net.block()[2].is_training());
  net.train();
  EXPECT_TRUE(net.block()[1].is_training());
  EXPECT_TRUE(net.fc().is_training());
  net.train(false);
  EXPECT_FALSE(net.block()[2].is_training());
}

TEST(Devices, ToCpuKeepsHandlesValid) {
  Net net;
  galley::optim::SGD opt(net.parameters(), {.learning_rate = 0.1});
  std::vector<void*> before;
  for (auto& p : net.parameters()) before.push_back(p.raw_data());
  auto values = values_of(net);
  net.to(galley::Device::cpu());
  auto params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(opt.parameters()[i].is_same(params[i]));
    EXPECT_EQ(params[i].raw_data(), before[i]);
    EXPECT_TRUE(params[i].device().is_cpu());
  }
  EXPECT_EQ(values_of(net), values);
}

TEST(Devices, ToAnotherCpuDeviceMovesUnderTheSameHandles) {
  Net net;
  galley::optim::SGD opt(net.parameters(), {.learning_rate = 0.1});
  auto values = values_of(net);
  Tensor w = net.fc().weight();
  net.to(galley::Device::cpu(1));
  EXPECT_EQ(values_of(net), values);
  for (size_t i = 0; i < opt.parameters().size(); ++i) {
    EXPECT_EQ(opt.parameters()[i].device(), galley::Device::cpu(1));
    EXPECT_TRUE(opt.parameters()[i].is_same(net.parameters()[i]));
  }
  EXPECT_EQ(w.device(), galley::Device::cpu(1));
  // A step through the optimizer's handles changes the tensors the model holds.
  for (auto& p : opt.parameters()) {
    Tensor g = galley::ones(p.shape()).to(galley::Device::cpu(1));
    Tensor(p).set_grad(g);
  }
  opt.step();
  EXPECT_NE(values_of(net), values);
  EXPECT_EQ(net.fc().weight().device(), galley::Device::cpu(1));
}

TEST(Devices, ForwardAndBackwardOnAnotherCpuDevice) {
  // A replica moved to cpu:1 (data-parallel testing) computes there: every op's output stays
  // on its inputs' device, so the next layer sees matching devices.
  galley::manual_seed(5);
  Net ref;
  galley::manual_seed(5);
  Net net;
  net.to(galley::Device::cpu(1));
  Tensor x = galley::ones({3, 4});
  Tensor out;
  ASSERT_NO_THROW(out = net(x.to(galley::Device::cpu(1))));
  EXPECT_EQ(out.device(), galley::Device::cpu(1));
  EXPECT_EQ(out.to(galley::Device::cpu()).to_vector(), ref(x).to_vector());
  ASSERT_NO_THROW(galley::sum(out).backward());
  for (auto& p : net.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().device(), galley::Device::cpu(1));
  }
}

// ---------------------------------------------------------------------------------------------
// State dicts

TEST(StateDict, RoundTrip) {
  galley::manual_seed(1);
  Net a;
  galley::manual_seed(2);
  Net b;
  EXPECT_NE(values_of(a), values_of(b));
  auto sd = a.state_dict();
  EXPECT_EQ(sd.size(), 7u);
  for (auto& [n, t] : a.named_parameters()) {
    ASSERT_TRUE(sd.count(n)) << n;
    EXPECT_EQ(sd[n].shape(), t.shape());
    EXPECT_FALSE(sd[n].is_same(t));
  }
  b.load_state_dict(sd);
  EXPECT_EQ(values_of(a), values_of(b));
  // Loading copies values under b's own handles; later changes to the dict don't leak in.
  Tensor bw = b.fc().weight();
  sd["fc.weight"].fill_(123.f);
  EXPECT_TRUE(bw.is_same(b.fc().weight()));
  EXPECT_EQ(b.fc().weight().to_vector(), a.fc().weight().to_vector());
  EXPECT_TRUE(b.fc().weight().requires_grad());
  EXPECT_TRUE(b.fc().weight().is_leaf());
}

TEST(StateDict, IsACopy) {
  Net a;
  auto before = a.fc().bias().to_vector();
  auto sd = a.state_dict();
  sd["fc.bias"].fill_(5.f);
  EXPECT_EQ(a.fc().bias().to_vector(), before);
  EXPECT_FALSE(sd["fc.bias"].requires_grad());
}

TEST(StateDict, WrongShapeNamesEntryAndShapesAndChangesNothing) {
  galley::manual_seed(3);
  Net a;
  galley::manual_seed(4);
  Net b;
  auto before = values_of(b);
  auto sd = a.state_dict();  // every other entry is valid and differs from b's values
  sd["fc.weight"] = galley::zeros({8, 5});
  std::string msg = error_of([&] { b.load_state_dict(sd); });
  expect_contains(msg, {"fc.weight", "[8, 5]", "[8, 4]"});
  EXPECT_EQ(values_of(b), before);

  // An entry that sorts after the bad one must not have been written either.
  auto sd2 = a.state_dict();
  sd2["block.0.bias"] = galley::zeros({3});
  msg = error_of([&] { b.load_state_dict(sd2); });
  expect_contains(msg, {"block.0.bias", "[3]", "[8]"});
  EXPECT_EQ(values_of(b), before);
}

TEST(StateDict, WrongDTypeThrows) {
  Net a, b;
  auto sd = a.state_dict();
  sd["scale"] = galley::zeros({4}, galley::DType::Int64);
  std::string msg = error_of([&] { b.load_state_dict(sd); });
  expect_contains(msg, {"scale", "int64"});
}

TEST(StateDict, MissingAndUnexpectedEntries) {
  Net a, b;
  auto before = values_of(b);
  auto sd = a.state_dict();
  sd.erase("block.2.bias");
  std::string msg = error_of([&] { b.load_state_dict(sd); });
  expect_contains(msg, {"block.2.bias", "missing"});
  EXPECT_EQ(values_of(b), before);

  // Not strict: the rest is loaded, and the missing name reported, as PyTorch's missing_keys.
  nn::Layer::LoadResult r = b.load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(b.fc().weight().to_vector(), a.fc().weight().to_vector());
  EXPECT_EQ(values_of(b)["block.2.bias"], before["block.2.bias"]);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"block.2.bias"});
  EXPECT_TRUE(r.unexpected_keys.empty());

  Net c;
  auto sd2 = a.state_dict();
  sd2["block.3.weight"] = galley::zeros({2});
  sd2["zz.extra"] = galley::zeros({1});
  sd2.erase("fc.bias");
  auto before2 = values_of(c);
  // Strict: one error lists every missing and unexpected name; nothing is written.
  msg = error_of([&] { c.load_state_dict(sd2); });
  expect_contains(
      msg, {"1 missing entry 'fc.bias'", "2 unexpected entries", "'block.3.weight', 'zz.extra'"});
  EXPECT_EQ(values_of(c), before2);
  // Not strict: an unexpected entry is skipped, as in PyTorch (a checkpoint with a head this
  // model lacks loads into the backbone).
  r = c.load_state_dict(sd2, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"fc.bias"});
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"block.3.weight", "zz.extra"}));
  EXPECT_EQ(c.fc().weight().to_vector(), a.fc().weight().to_vector());
  EXPECT_EQ(values_of(c)["fc.bias"], before2["fc.bias"]);

  // A matching name of the wrong shape is an error whether strict or not, as in PyTorch.
  auto sd3 = a.state_dict();
  sd3["fc.weight"] = galley::zeros({1, 1});
  auto before3 = values_of(c);
  msg = error_of([&] { c.load_state_dict(sd3, false); });
  expect_contains(msg, {"fc.weight", "[1, 1]"});
  EXPECT_EQ(values_of(c), before3);
}

TEST(StateDict, ToDtypeConvertsFloatingStateAndKeepsTheHandles) {
  class WithCounter : public nn::Layer {
   public:
    WithCounter() {
      register_parameter("w", galley::full({3}, 1.5f));
      register_buffer("running", galley::full({3}, 0.25f));
      register_buffer("steps", galley::zeros({1}, galley::DType::Int64));
    }
    Tensor forward(const Tensor& x) override { return x; }
  } l;
  const Tensor w = l.named_parameters()[0].second;  // as an optimizer holds it
  l.to(galley::DType::BFloat16);
  EXPECT_EQ(w.dtype(), galley::DType::BFloat16);
  EXPECT_EQ(w.to(galley::DType::Float32).to_vector(), std::vector<float>(3, 1.5f));
  const auto buffers = l.named_buffers();
  EXPECT_EQ(buffers[0].second.dtype(), galley::DType::BFloat16);
  EXPECT_EQ(buffers[1].second.dtype(), galley::DType::Int64) << "a counter stays an integer";
  l.to(galley::DType::Float32);
  EXPECT_EQ(w.dtype(), galley::DType::Float32);
  EXPECT_EQ(w.to_vector(), std::vector<float>(3, 1.5f));
  expect_contains(error_of([&] { l.to(galley::DType::Int64); }), {"to(int64)"});
}

// out = a + fc(b): a join of two inputs, as a residual block's.
class Join : public nn::Layer {
 public:
  Join() { register_layer("fc", fc_); }
  Tensor forward(const std::vector<Tensor>& in) override {
    GALLEY_CHECK(in.size() == 2, "Join takes two inputs, got ", in.size());
    return galley::add(in[0], fc_(in[1]));
  }
  std::string repr() const override { return "Join"; }
  nn::Linear& fc() { return fc_; }

 private:
  nn::Linear fc_{3, 3};
};

TEST(Layers, ALayerMayTakeSeveralInputs) {
  Join join;
  const Tensor a = galley::ones({2, 3}), b = galley::full({2, 3}, 2.f);
  const std::vector<float> want = galley::add(a, join.fc()(b)).to_vector();
  EXPECT_EQ(join(a, b).to_vector(), want);
  EXPECT_EQ(join({a, b}).to_vector(), want);
  expect_contains(error_of([&] { join(a); }), {"Join takes two inputs, got 1"});
  nn::Linear single(3, 3);
  expect_contains(error_of([&] { single(a, b); }), {"takes one input", "called with 2"});
  // Layer paths reach the inner layer through the several-input call.
  galley::DetectAnomalyGuard anomaly;
  Tensor nan_b = galley::full({2, 3}, NAN);
  expect_contains(error_of([&] { join(a, nan_b); }), {"fc"});
}

TEST(StateDict, IncludesBuffers) {
  WithBuffer a, b;
  a.named_buffers()[0].second.fill_(7.f);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.named_buffers()[0].second.to_vector(), (std::vector<float>{7, 7}));
}

TEST(StateDict, ZeroGradClearsEveryParameter) {
  Net net;
  galley::sum(net(galley::ones({2, 4}))).backward();
  for (auto& p : net.parameters()) EXPECT_TRUE(p.grad().defined());
  net.zero_grad();
  for (auto& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
}

// ---------------------------------------------------------------------------------------------
// Default initialisation

void check_uniform_init(const Tensor& t, double bound, double var_tol, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<float> v = t.to_vector();
  double sq = 0, mx = 0, mean = 0;
  for (float x : v) {
    EXPECT_LE(std::fabs(x), bound + 1e-7) << x;
    sq += double(x) * x;
    mean += x;
    mx = std::max(mx, double(std::fabs(x)));
  }
  mean /= double(v.size());
  const double var = sq / double(v.size());
  const double want = bound * bound / 3.0;  // variance of uniform(-b, b)
  EXPECT_NEAR(var, want, var_tol * want);
  EXPECT_NEAR(mean, 0.0, 4.0 * std::sqrt(want / double(v.size())));
  EXPECT_GT(mx, 0.8 * bound);  // the whole interval is used
}

TEST(Init, LinearBoundsAndVariance) {
  galley::manual_seed(10);
  nn::Linear l(100, 10);
  const double b = 1.0 / std::sqrt(100.0);
  check_uniform_init(l.weight(), b, 0.12, "weight");
  for (float x : l.bias().to_vector()) EXPECT_LE(std::fabs(x), b);
  nn::Linear wide(100, 200);  // enough bias entries for statistics
  check_uniform_init(wide.bias(), b, 0.25, "bias");
}

TEST(Init, Conv2DBoundsAndVariance) {
  galley::manual_seed(11);
  nn::Conv2D c(3, 8, 3);
  const double b = 1.0 / std::sqrt(27.0);
  EXPECT_EQ(c.weight().shape(), (Shape{8, 3, 3, 3}));
  check_uniform_init(c.weight(), b, 0.25, "weight");
  for (float x : c.bias().to_vector()) EXPECT_LE(std::fabs(x), b);

  nn::Conv2D big(16, 64, 3);  // fan_in 144
  check_uniform_init(big.weight(), 1.0 / 12.0, 0.08, "big weight");
  check_uniform_init(big.bias(), 1.0 / 12.0, 0.35, "big bias");

  nn::Conv2D grouped(4, 8, 3, {.groups = 2});  // fan_in 2 * 9
  EXPECT_EQ(grouped.weight().shape(), (Shape{8, 2, 3, 3}));
  for (float x : grouped.weight().to_vector()) EXPECT_LE(std::fabs(x), 1.0 / std::sqrt(18.0));
}

TEST(Init, FansAndInitialisers) {
  EXPECT_EQ(nn::init::fans(galley::zeros({10, 20})), std::make_pair(int64_t(20), int64_t(10)));
  EXPECT_EQ(nn::init::fans(galley::zeros({8, 3, 5, 5})), std::make_pair(int64_t(75), int64_t(200)));
  EXPECT_THROW(nn::init::fans(galley::zeros({4})), galley::Error);
  Tensor t = galley::zeros({1000});
  galley::Generator g(1);
  nn::init::uniform_(t, 2.f, 3.f, g);
  for (float x : t.to_vector()) {
    EXPECT_GE(x, 2.f);
    EXPECT_LT(x, 3.f);
  }
  Tensor w = galley::zeros({50, 60});
  nn::init::kaiming_uniform_(w, 0.f, g);  // bound sqrt(6 / fan_in)
  check_uniform_init(w, std::sqrt(6.0 / 60.0), 0.1, "kaiming a=0");
}

// The initialisers write 16-bit tensors and views too. A 16-bit tensor takes uniform(...) in its
// own dtype (draws on the dtype's grid, as PyTorch's uniform_, which never reach the bound); a
// view takes the float32 draws a contiguous tensor takes.
TEST(Init, SixteenBitTensorsDrawOnTheirGridAndViewsTakeTheDraws) {
  Tensor want = galley::zeros({8, 6});
  galley::Generator g1(3), g2(3), g3(3), g4(3);
  nn::init::kaiming_uniform_(want, 0.f, g1);
  Tensor half = galley::zeros({8, 6}, galley::DType::BFloat16);
  nn::init::kaiming_uniform_(half, 0.f, g2);
  EXPECT_EQ(half.dtype(), galley::DType::BFloat16);
  const float bound = std::sqrt(6.f / 6.f);  // kaiming a = 0: sqrt(6 / fan_in), fan_in 6
  EXPECT_EQ(half.to(galley::DType::Float32).to_vector(),
            galley::uniform({8, 6}, -bound, bound, {.dtype = galley::DType::BFloat16}, g4)
                .to(galley::DType::Float32)
                .to_vector());
  Tensor base = galley::zeros({6, 8});
  Tensor view = base.transpose(0, 1);  // [8, 6], not contiguous
  nn::init::kaiming_uniform_(view, 0.f, g3);
  EXPECT_EQ(view.contiguous().to_vector(), want.to_vector());
}

// torch.nn.init's formulas: the bounds and standard deviations from the fans.
TEST(Init, KaimingNormalXavierNormalAndConstants) {
  galley::Generator g(7);
  Tensor w = galley::zeros({64, 32, 3, 3});  // fan_in 288, fan_out 576
  nn::init::xavier_uniform_(w, 2.f, g);
  check_uniform_init(w, 2.0 * std::sqrt(6.0 / (288 + 576)), 0.05, "xavier_uniform gain 2");
  auto expect_normal = [](const Tensor& t, double want_std, const std::string& what) {
    SCOPED_TRACE(what);
    const std::vector<float> v = t.to_vector();
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double(x) * x;
    const double n = double(v.size()), mean = sum / n, var = sq / n - mean * mean;
    EXPECT_NEAR(std::sqrt(var), want_std, 0.03 * want_std);
    EXPECT_NEAR(mean, 0.0, 5.0 * want_std / std::sqrt(n));
  };
  nn::init::kaiming_normal_(w, 0.f, nn::init::FanMode::In, g);
  expect_normal(w, std::sqrt(2.0 / 288), "kaiming_normal fan_in");
  nn::init::kaiming_normal_(w, 0.2f, nn::init::FanMode::Out, g);
  expect_normal(w, std::sqrt(2.0 / 1.04) / std::sqrt(576.0), "kaiming_normal a=0.2 fan_out");
  nn::init::xavier_normal_(w, 1.f, g);
  expect_normal(w, std::sqrt(2.0 / (288 + 576)), "xavier_normal");
  // normal_ is randn's draws scaled: the same stream gives the same values.
  Tensor a = galley::zeros({5}), b = galley::zeros({5}, galley::DType::BFloat16);
  galley::Generator g1(9), g2(9), g3(9);
  nn::init::normal_(a, 1.f, 0.5f, g1);
  EXPECT_EQ(a.to_vector(), (galley::randn({5}, g2) * 0.5f + 1.f).to_vector());
  nn::init::normal_(b, 1.f, 0.5f, g3);
  EXPECT_EQ(b.to(galley::DType::Float32).to_vector(),
            a.to(galley::DType::BFloat16).to(galley::DType::Float32).to_vector());
  nn::init::ones_(a);
  EXPECT_EQ(a.to_vector(), std::vector<float>(5, 1.f));
  nn::init::zeros_(b);
  EXPECT_EQ(b.to(galley::DType::Float32).to_vector(), std::vector<float>(5, 0.f));
  nn::init::constant_(a, 2.5f);
  EXPECT_EQ(a.to_vector(), std::vector<float>(5, 2.5f));
  EXPECT_THROW(nn::init::normal_(a, 0.f, -1.f), galley::Error);
  EXPECT_THROW(nn::init::xavier_uniform_(a), galley::Error);  // 1-D: no fans
  Tensor ints = galley::zeros({3}, galley::DType::Int64);
  EXPECT_THROW(nn::init::ones_(ints), galley::Error);
}

TEST(Init, SeededConstructionIsReproducible) {
  galley::manual_seed(77);
  Net a;
  galley::manual_seed(77);
  Net b;
  EXPECT_EQ(values_of(a), values_of(b));
}

// ---------------------------------------------------------------------------------------------
// Forward results

TEST(Forward, LinearComputesXWtPlusB) {
  nn::Linear l(3, 2);
  l.weight().copy_(fvec({1, 2, 3, -1, 0, 1}, {2, 3}));
  l.bias().copy_(fvec({0.5f, -0.5f}, {2}));
  Tensor y = l(fvec({1, 1, 1, 2, 0, -1}, {2, 3}));
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(y.to_vector(), (std::vector<float>{6.5f, -0.5f, -0.5f, -3.5f}));
  // Any leading dimensions.
  Tensor y3 = l(galley::ones({4, 5, 3}));
  EXPECT_EQ(y3.shape(), (Shape{4, 5, 2}));
  EXPECT_FLOAT_EQ(y3.to_vector()[1], -0.5f);
}

TEST(Forward, SequentialChainsLayers) {
  auto fc = std::make_shared<nn::Linear>(2, 2, false);
  fc->weight().copy_(fvec({1, 0, 0, -1}, {2, 2}));
  nn::Sequential seq(fc, std::make_shared<nn::ReLU>());
  EXPECT_EQ(seq(fvec({3, 4}, {1, 2})).to_vector(), (std::vector<float>{3, 0}));
  seq.push_back(std::make_shared<nn::Flatten>(0));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq(fvec({3, 4}, {1, 2})).shape(), (Shape{2}));
  expect_contains(seq.repr(), {"Sequential", "Linear", "ReLU"});
}

// ---------------------------------------------------------------------------------------------
// Activation layers

TEST(Activations, LayersComputeTheirOpForwardAndBackward) {
  galley::Generator gen(9);
  const Tensor x0 = galley::randn({3, 5}, gen) * 3.f;
  struct Row {
    std::shared_ptr<nn::Layer> layer;
    std::function<Tensor(const Tensor&)> op;
  };
  const Row rows[] = {
      {std::make_shared<nn::GELU>(), [](const Tensor& x) { return galley::gelu(x); }},
      {std::make_shared<nn::GELU>(nn::GELUOptions{.approximate = galley::GeluApproximate::Tanh}),
       [](const Tensor& x) { return galley::gelu(x, galley::GeluApproximate::Tanh); }},
      {std::make_shared<nn::SiLU>(), [](const Tensor& x) { return galley::silu(x); }},
      {std::make_shared<nn::Sigmoid>(), [](const Tensor& x) { return galley::sigmoid(x); }},
      {std::make_shared<nn::Tanh>(), [](const Tensor& x) { return galley::tanh(x); }},
      {std::make_shared<nn::LeakyReLU>(), [](const Tensor& x) { return galley::leaky_relu(x); }},
      {std::make_shared<nn::LeakyReLU>(nn::LeakyReLUOptions{.negative_slope = 0.2f}),
       [](const Tensor& x) { return galley::leaky_relu(x, 0.2f); }},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.layer->repr());
    Tensor a = x0.clone().set_requires_grad(true), b = x0.clone().set_requires_grad(true);
    Tensor ya = (*r.layer)(a), yb = r.op(b);
    EXPECT_EQ(ya.to_vector(), yb.to_vector());
    galley::sum(ya * x0).backward();
    galley::sum(yb * x0).backward();
    EXPECT_EQ(a.grad().to_vector(), b.grad().to_vector());
  }
}

TEST(Activations, OptionsDefaultsAndRepr) {
  EXPECT_EQ(nn::GELU().options().approximate, galley::GeluApproximate::None);
  EXPECT_EQ(nn::GELU().repr(), "GELU()");
  nn::GELU tanh_gelu({.approximate = galley::GeluApproximate::Tanh});
  EXPECT_EQ(tanh_gelu.options().approximate, galley::GeluApproximate::Tanh);
  EXPECT_EQ(tanh_gelu.repr(), "GELU(approximate='tanh')");
  EXPECT_EQ(nn::LeakyReLU().options().negative_slope, 0.01f);
  EXPECT_EQ(nn::LeakyReLU().repr(), "LeakyReLU(negative_slope=0.01)");
  nn::LeakyReLU steep({.negative_slope = 0.2f});
  EXPECT_EQ(steep.options().negative_slope, 0.2f);
  EXPECT_EQ(steep.repr(), "LeakyReLU(negative_slope=0.2)");
  EXPECT_EQ(nn::SiLU().repr(), "SiLU()");
  EXPECT_EQ(nn::Sigmoid().repr(), "Sigmoid()");
  EXPECT_EQ(nn::Tanh().repr(), "Tanh()");
  EXPECT_EQ(nn::Identity().repr(), "Identity()");
  nn::Sequential seq(std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::GELU>(),
                     std::make_shared<nn::Identity>(), std::make_shared<nn::Tanh>());
  expect_contains(seq.repr(), {"Linear", "GELU()", "Identity()", "Tanh()"});
}

TEST(Activations, OptionsAreValidatedWhereTheLayerIsBuilt) {
  expect_contains(error_of([] { nn::LeakyReLU({.negative_slope = NAN}); }),
                  {"LeakyReLU", "negative_slope", "finite"});
  expect_contains(error_of([] { nn::LeakyReLU({.negative_slope = INFINITY}); }),
                  {"LeakyReLU", "negative_slope"});
  expect_contains(error_of([] { nn::GELU({.approximate = galley::GeluApproximate(3)}); }),
                  {"GELU", "approximate"});
  // A negative or zero slope is allowed, as in PyTorch.
  EXPECT_NO_THROW(nn::LeakyReLU({.negative_slope = -0.5f}));
}

TEST(Activations, LayersHoldNoStateAndNameThemselvesInErrors) {
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 2}, {2});
  std::vector<std::shared_ptr<nn::Layer>> layers = {
      std::make_shared<nn::GELU>(),      std::make_shared<nn::SiLU>(),
      std::make_shared<nn::Sigmoid>(),   std::make_shared<nn::Tanh>(),
      std::make_shared<nn::LeakyReLU>(), std::make_shared<nn::Identity>()};
  for (const auto& l : layers) {
    SCOPED_TRACE(l->repr());
    EXPECT_TRUE(l->state_dict().empty());
    EXPECT_TRUE(l->parameters().empty());
    EXPECT_TRUE(l->named_buffers().empty());
    if (l->repr() != "Identity()")  // Identity takes anything, labels included
      expect_contains(error_of([&] { (*l)(labels); }), {l->repr(), "int64"});
  }
}

TEST(Activations, IdentityReturnsItsInputItself) {
  nn::Identity id;
  Tensor x = galley::randn({2, 3}).set_requires_grad(true);
  Tensor y = id(x);
  EXPECT_TRUE(y.is_same(x));  // the same tensor: no copy, no graph node
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{4, 5}, {2});
  EXPECT_TRUE(id(labels).is_same(labels));
  // In a model the gradient flows through it untouched.
  nn::Sequential seq(std::make_shared<nn::Identity>(), std::make_shared<nn::Sigmoid>());
  galley::sum(seq(x)).backward();
  const auto s = galley::sigmoid(x.detach()).to_vector();
  const auto g = x.grad().to_vector();
  for (size_t i = 0; i < s.size(); ++i) EXPECT_FLOAT_EQ(g[i], s[i] * (1.f - s[i]));
}

TEST(Forward, SequentialIndexOutOfRangeIsAGalleyError) {
  // Every error galley raises derives from galley::Error.
  nn::Sequential seq(std::make_shared<nn::ReLU>());
  EXPECT_NO_THROW(seq[0]);
  EXPECT_THROW(seq[1], galley::Error);
}

TEST(Forward, ConvPoolFlattenShapes) {
  nn::Sequential seq(std::make_shared<nn::Conv2D>(3, 8, 3, nn::Conv2DOptions{.padding = 1}),
                     std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2D>(2),
                     std::make_shared<nn::Conv2D>(8, 4, 3, nn::Conv2DOptions{.stride = 2}),
                     std::make_shared<nn::Flatten>());
  Tensor y = seq(galley::ones({2, 3, 16, 16}));
  // 16 -> conv(pad 1) 16 -> pool 8 -> conv(k3, s2) 3 -> flatten 4*3*3
  EXPECT_EQ(y.shape(), (Shape{2, 36}));
}

TEST(Forward, MaxPoolPicksMaxima) {
  nn::MaxPool2D pool(2);
  Tensor x = fvec({1, 5, 2, 0, 3, 4, 8, 1, 0, 0, 1, 1, 9, 0, 1, 2}, {1, 1, 4, 4});
  EXPECT_EQ(pool(x).to_vector(), (std::vector<float>{5, 8, 9, 2}));
}

TEST(Forward, CrossEntropyLossMatchesFormula) {
  nn::CrossEntropyLoss loss;
  Tensor logits = fvec({1, 2, 3, 0, 0, 0}, {2, 3});
  const double lse0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double want = ((lse0 - 3.0) + std::log(3.0)) / 2.0;
  EXPECT_NEAR(loss(logits, labels({2, 0})).item(), want, 1e-5);
  EXPECT_THROW(nn::CrossEntropyLoss({.label_smoothing = 1.5f}), galley::Error);
}

// ---------------------------------------------------------------------------------------------
// Errors name the layer and the shapes

TEST(Errors, LinearWrongInput) {
  nn::Linear l(4, 2);
  std::string msg = error_of([&] { l(galley::zeros({3, 5})); });
  expect_contains(msg, {"Linear", "[3, 5]", "4"});
}

TEST(Errors, Conv2DWrongChannels) {
  nn::Conv2D c(3, 8, 3);
  std::string msg = error_of([&] { c(galley::zeros({1, 4, 8, 8})); });
  expect_contains(msg, {"Conv2D", "[1, 4, 8, 8]", "3"});
  msg = error_of([&] { c(galley::zeros({3, 8, 8})); });
  expect_contains(msg, {"Conv2D", "[3, 8, 8]"});
  msg = error_of([&] { c(galley::zeros({1, 3, 2, 2})); });  // smaller than the kernel
  expect_contains(msg, {"Conv2D", "[1, 3, 2, 2]"});
}

TEST(Errors, Conv2DBadGeometry) {
  EXPECT_THROW(nn::Conv2D(3, 8, 0), galley::Error);
  EXPECT_THROW(nn::Conv2D(3, 8, 3, {.stride = 0}), galley::Error);
  EXPECT_THROW(nn::Conv2D(3, 8, 3, {.groups = 2}), galley::Error);
  EXPECT_THROW(nn::Linear(0, 3), galley::Error);
}

TEST(Errors, CrossEntropyLabelsOfWrongLength) {
  nn::CrossEntropyLoss loss;
  std::string msg = error_of([&] { loss(galley::zeros({3, 4}), labels({0, 1})); });
  expect_contains(msg, {"[3, 4]", "[2]"});
  msg = error_of([&] { loss(galley::zeros({3, 4}), galley::zeros({3})); });
  expect_contains(msg, {"int64"});
}

TEST(Errors, CrossEntropyLabelOutOfRangeNamesRow) {
  nn::CrossEntropyLoss loss;
  std::string msg = error_of([&] { loss(galley::zeros({3, 4}), labels({0, 7, 1})); });
  expect_contains(msg, {"row 1", "7", "4"});
  msg = error_of([&] { loss(galley::zeros({3, 4}), labels({0, 1, -2})); });
  expect_contains(msg, {"row 2", "-2"});
  // The ignore index is not out of range.
  EXPECT_NO_THROW(loss(galley::zeros({3, 4}), labels({0, -100, 1})));
}

TEST(Errors, MaxPoolLargerThanInput) {
  nn::MaxPool2D pool(3);
  std::string msg = error_of([&] { pool(galley::zeros({1, 1, 2, 2})); });
  expect_contains(msg, {"MaxPool2D", "[1, 1, 2, 2]"});
  msg = error_of([&] { nn::MaxPool2D(2)(galley::zeros({4, 4})); });
  expect_contains(msg, {"MaxPool2D", "[4, 4]"});
  EXPECT_THROW(nn::MaxPool2D(0), galley::Error);
  EXPECT_THROW(nn::MaxPool2D(2, 2, 2), galley::Error);  // padding above half the kernel
}

TEST(Errors, SequentialNamesTheFailingIndex) {
  nn::Sequential seq(std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Linear>(8, 6), std::make_shared<nn::Linear>(5, 2));
  std::string msg = error_of([&] { seq(galley::zeros({2, 4})); });
  expect_contains(msg, {"Sequential", "3", "Linear", "[2, 6]", "5"});
  EXPECT_EQ(msg.find("Sequential[0]"), std::string::npos) << msg;
}

}  // namespace

// Context added by the layers keeps the error's type: running out of memory inside a layer is
// still an OutOfMemoryError to the caller (what a job sharing a GPU catches to back off), with
// the layer named in the message. On the CPU a 4 TiB output cannot be allocated.
TEST(LayerErrors, OutOfMemoryStaysOutOfMemoryThroughLayers) {
  nn::Linear wide(1, int64_t(1) << 20);
  const Tensor x = galley::zeros({int64_t(1) << 20, 1});
  try {
    (void)wide(x);
    ADD_FAILURE() << "a 4 TiB output was allocated";
  } catch (const galley::OutOfMemoryError& e) {
    testutil::expect_contains(e.what(), {"Linear(1, 1048576)", "host allocation"});
  }
  nn::Sequential seq;
  seq.push_back(std::make_shared<nn::Linear>(1, int64_t(1) << 20));
  EXPECT_THROW((void)seq(x), galley::OutOfMemoryError);
  // Plain errors stay plain errors.
  try {
    (void)wide(galley::zeros({2, 3}));
    ADD_FAILURE() << "a wrong shape was accepted";
  } catch (const galley::OutOfMemoryError&) {
    ADD_FAILURE() << "a shape error became an OutOfMemoryError";
  } catch (const galley::Error&) {
  }
}

TEST(LayerErrors, WithMessageKeepsTheDynamicType) {
  const galley::OutOfMemoryError oom("out of memory on cuda:0");
  const galley::Error& as_base = oom;
  auto copy = as_base.with_message("Conv2D(3, 64): out of memory on cuda:0");
  EXPECT_NE(dynamic_cast<galley::OutOfMemoryError*>(copy.get()), nullptr);
  EXPECT_STREQ(copy->what(), "Conv2D(3, 64): out of memory on cuda:0");
  EXPECT_THROW(copy->raise(), galley::OutOfMemoryError);
  EXPECT_THROW(galley::detail::rethrow_with_message(std::runtime_error("x"), "y"), galley::Error);
  try {
    galley::detail::rethrow_with_message(oom, "context: out of memory");
  } catch (const galley::OutOfMemoryError& e) {
    EXPECT_STREQ(e.what(), "context: out of memory");
  }
}

// ---------------------------------------------------------------------------------------------
// BatchNorm

namespace {

// Per-channel mean and biased variance of x [N, C, *] computed in double.
struct ChannelStats {
  std::vector<double> mean, var;
  int64_t count = 0;
};
ChannelStats channel_stats(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), inner = x.numel() / (n * c);
  const std::vector<float> v = x.to_vector();
  ChannelStats s{std::vector<double>(c), std::vector<double>(c), n * inner};
  for (int64_t k = 0; k < c; ++k) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) sum += v[(i * c + k) * inner + j];
    s.mean[k] = sum / double(s.count);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const double d = v[(i * c + k) * inner + j] - s.mean[k];
        sq += d * d;
      }
    s.var[k] = sq / double(s.count);
  }
  return s;
}

void expect_all_near(const Tensor& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  const std::vector<float> g = got.to(galley::DType::Float32).to_vector();
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " [" << i << "]";
}

}  // namespace

TEST(BatchNorm, RunningStatisticsAfterThreeTrainingStepsAndEvalUsesThem) {
  nn::BatchNorm2D bn(3);
  bn.weight().copy_(fvec({1.5f, -0.5f, 2.f}, {3}));
  bn.bias().copy_(fvec({0.1f, 0.2f, -0.3f}, {3}));
  std::vector<double> rm(3, 0.0), rv(3, 1.0);
  for (int step = 0; step < 3; ++step) {
    Tensor x = testutil::rnd({4, 3, 2, 5}, 10 + step, 1.f + step) + float(step) - 1.f;
    Tensor y = bn(x);
    const ChannelStats s = channel_stats(x);
    std::vector<double> want(size_t(x.numel()));
    const std::vector<float> xv = x.to_vector(), w = bn.weight().to_vector(),
                             b = bn.bias().to_vector();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = (i / 10) % 3;
      want[i] = (xv[i] - s.mean[c]) / std::sqrt(s.var[c] + 1e-5) * w[c] + b[c];
    }
    expect_all_near(y, want, 1e-5, "training output");
    for (int c = 0; c < 3; ++c) {
      rm[c] = 0.9 * rm[c] + 0.1 * s.mean[c];
      rv[c] = 0.9 * rv[c] + 0.1 * s.var[c] * double(s.count) / double(s.count - 1);
    }
  }
  expect_all_near(bn.running_mean(), rm, 1e-6, "running_mean");
  expect_all_near(bn.running_var(), rv, 1e-6, "running_var");
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{3});
  EXPECT_EQ(bn.num_batches_tracked().dim(), 0);

  bn.eval();
  Tensor x = testutil::rnd({2, 3, 2, 5}, 99);
  Tensor y = bn(x);
  const std::vector<float> xv = x.to_vector(), w = bn.weight().to_vector(),
                           b = bn.bias().to_vector();
  std::vector<double> want(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t c = (i / 10) % 3;
    want[i] = (xv[i] - rm[c]) / std::sqrt(rv[c] + 1e-5) * w[c] + b[c];
  }
  expect_all_near(y, want, 1e-5, "eval output");
  // Eval leaves the state alone.
  expect_all_near(bn.running_mean(), rm, 1e-6, "running_mean after eval");
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{3});
}

TEST(BatchNorm, MomentumNoneIsTheCumulativeAverage) {
  nn::BatchNorm1D bn(4, {.momentum = std::nullopt});
  std::vector<double> mean_sum(4, 0.0), var_sum(4, 0.0);
  for (int step = 0; step < 3; ++step) {
    Tensor x = testutil::rnd({6, 4}, 20 + step, 1.f + step);
    bn(x);
    const ChannelStats s = channel_stats(x);
    for (int c = 0; c < 4; ++c) {
      mean_sum[c] += s.mean[c];
      var_sum[c] += s.var[c] * 6.0 / 5.0;
    }
  }
  for (int c = 0; c < 4; ++c) mean_sum[c] /= 3, var_sum[c] /= 3;
  expect_all_near(bn.running_mean(), mean_sum, 1e-6, "running_mean");
  expect_all_near(bn.running_var(), var_sum, 1e-6, "running_var");
  expect_contains(bn.repr(), {"BatchNorm1D(4", "momentum=None"});
}

TEST(BatchNorm, StateDictKeysArePyTorchs) {
  auto keys = [](const nn::Layer& l) {
    std::vector<std::string> k;
    for (auto& [name, t] : l.state_dict()) k.push_back(name);
    return k;
  };
  nn::BatchNorm2D bn(5);
  EXPECT_EQ(keys(bn), (std::vector<std::string>{"bias", "num_batches_tracked", "running_mean",
                                                "running_var", "weight"}));
  EXPECT_EQ(bn.named_parameters().size(), 2u);
  EXPECT_EQ(bn.named_buffers().size(), 3u);
  EXPECT_EQ(bn.state_dict().at("num_batches_tracked").dtype(), galley::DType::Int64);
  EXPECT_EQ(bn.weight().to_vector(), std::vector<float>(5, 1.f));
  EXPECT_EQ(bn.bias().to_vector(), std::vector<float>(5, 0.f));
  EXPECT_EQ(bn.running_var().to_vector(), std::vector<float>(5, 1.f));
  nn::BatchNorm1D no_affine(3, {.affine = false});
  EXPECT_EQ(keys(no_affine),
            (std::vector<std::string>{"num_batches_tracked", "running_mean", "running_var"}));
  nn::BatchNorm1D no_stats(3, {.track_running_stats = false});
  EXPECT_EQ(keys(no_stats), (std::vector<std::string>{"bias", "weight"}));
  // Without running statistics both modes normalise with the batch's.
  Tensor x = testutil::rnd({8, 3}, 5);
  Tensor train_out = no_stats(x);
  no_stats.eval();
  EXPECT_EQ(no_stats(x).to_vector(), train_out.to_vector());
}

// batch_norm_add is batch_norm, add_ and relu in one pass: the same bits forward and backward
// (the input, weight, bias and residual gradients, and the running statistics), in every dtype,
// training and eval, with and without the ReLU, on planes long enough for the host kernel's
// channel-at-a-time backward (784), short ones (49) and [N, C] rows; with a frozen weight and
// bias in eval the backward needs no per-channel sums, which is a path of its own.
TEST(BatchNorm, AddEqualsBatchNormThenAddThenReluBitForBit) {
  using galley::DType;
  const std::vector<galley::Shape> shapes = {{4, 3, 28, 28}, {6, 5, 7, 7}, {9, 6}};
  for (const DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
    for (const galley::Shape& shape : shapes)
      for (const int mode : {0, 1, 2})  // training, eval, eval with a frozen affine
        for (const bool relu : {true, false}) {
          const int64_t C = shape[1];
          const bool training = mode == 0, frozen = mode == 2;
          const std::string what = galley::dtype_name(dt) + " " + galley::shape_str(shape) +
                                   (training ? " training"
                                    : frozen ? " eval frozen"
                                             : " eval") +
                                   (relu ? " relu" : "");
          std::vector<Tensor> grads[2], running[2];
          Tensor outs[2];
          for (int fused = 0; fused < 2; ++fused) {
            Tensor x = testutil::rnd(shape, 1).to(dt), r = testutil::rnd(shape, 2).to(dt);
            Tensor w = testutil::rnd({C}, 3) + 1.f, b = testutil::rnd({C}, 4, 0.5f);
            for (Tensor* t : {&x, &r, &w, &b})
              if (!frozen || t == &x || t == &r) t->set_requires_grad();
            Tensor rm = testutil::rnd({C}, 5, 0.2f), rv = testutil::rnd({C}, 6, 0.2f) + 1.f;
            const galley::BatchNormOptions o{.training = training, .relu = relu};
            Tensor y;
            if (fused) {
              y = galley::batch_norm_add(x, r, rm, rv, w, b, o);
            } else {
              galley::BatchNormOptions plain = o;
              plain.relu = false;
              y = galley::batch_norm(x, rm, rv, w, b, plain);
              y.add_(r);
              if (relu) y = galley::relu(y);
            }
            // A fixed incoming gradient, so that every element's differs.
            y.backward(testutil::rnd(shape, 7).to(dt));
            outs[fused] = y.detach();
            grads[fused] = {x.grad(), r.grad(), w.grad(), b.grad()};
            running[fused] = {rm, rv};
          }
          EXPECT_EQ(outs[1].to(DType::Float32).to_vector(), outs[0].to(DType::Float32).to_vector())
              << what << ": output";
          const char* names[] = {"input", "residual", "weight", "bias"};
          for (int k = 0; k < (frozen ? 2 : 4); ++k)
            EXPECT_EQ(grads[1][k].to(DType::Float32).to_vector(),
                      grads[0][k].to(DType::Float32).to_vector())
                << what << ": " << names[k] << " gradient";
          for (int k = 0; k < 2; ++k)
            EXPECT_EQ(running[1][k].to_vector(), running[0][k].to_vector())
                << what << ": running statistics";
        }
}

TEST(BatchNorm, AddChecksItsResidualAndTheLayerTakesTwoInputs) {
  Tensor x = testutil::rnd({2, 3, 4, 4}, 1);
  Tensor rm = galley::zeros({3}), rv = galley::ones({3});
  expect_contains(
      testutil::error_of([&] {
        galley::batch_norm_add(x, testutil::rnd({2, 3, 4, 5}, 2), rm, rv, Tensor(), Tensor());
      }),
      {"batch_norm_add", "residual [2, 3, 4, 5]", "input [2, 3, 4, 4]"});
  expect_contains(testutil::error_of([&] {
                    galley::batch_norm_add(x, x.to(galley::DType::BFloat16), rm, rv, Tensor(),
                                           Tensor());
                  }),
                  {"batch_norm_add", "bfloat16", "float32"});
  expect_contains(
      testutil::error_of([&] { galley::batch_norm_add(x, Tensor(), rm, rv, Tensor(), Tensor()); }),
      {"batch_norm_add", "undefined"});
  // The layer: bn(x, residual) with its ReLU after the sum; three inputs are an error.
  nn::BatchNorm2D bn(3, {.relu = true});
  bn.eval();
  Tensor r = testutil::rnd({2, 3, 4, 4}, 3);
  nn::BatchNorm2D plain(3);
  plain.eval();
  EXPECT_EQ(bn(x, r).to_vector(), galley::relu(plain(x) + r).to_vector());
  expect_contains(testutil::error_of([&] { bn(x, r, r); }), {"BatchNorm2D(3", "3 inputs"});
}

TEST(BatchNorm, ToBFloat16KeepsTheRunningStatisticsFloat32) {
  nn::BatchNorm2D bn(3);
  Tensor handle = bn.running_mean();
  bn.to(galley::DType::BFloat16);
  EXPECT_EQ(bn.weight().dtype(), galley::DType::BFloat16);
  EXPECT_EQ(bn.bias().dtype(), galley::DType::BFloat16);
  EXPECT_EQ(bn.running_mean().dtype(), galley::DType::Float32);
  EXPECT_EQ(bn.running_var().dtype(), galley::DType::Float32);
  EXPECT_EQ(bn.num_batches_tracked().dtype(), galley::DType::Int64);
  Tensor x = testutil::rnd({4, 3, 3, 3}, 7) + 2.f;
  Tensor y = bn(x.to(galley::DType::BFloat16));
  EXPECT_EQ(y.dtype(), galley::DType::BFloat16);
  // The update reads the bfloat16 input widened: the statistics of the rounded values.
  const ChannelStats s = channel_stats(x.to(galley::DType::BFloat16).to(galley::DType::Float32));
  std::vector<double> rm(3);
  for (int c = 0; c < 3; ++c) rm[c] = 0.1 * s.mean[c];
  expect_all_near(handle, rm, 1e-6, "running_mean through the original handle");
  // Float32 master weights serve a bfloat16 input as well, and get float32 gradients.
  nn::BatchNorm2D master(3);
  Tensor xb = x.to(galley::DType::BFloat16);
  xb.set_requires_grad(true);
  galley::sum(galley::mul(master(xb), xb)).backward();
  EXPECT_EQ(master.weight().grad().dtype(), galley::DType::Float32);
  EXPECT_EQ(xb.grad().dtype(), galley::DType::BFloat16);
}

TEST(BatchNorm, StateDictAndSafetensorsRoundTrip) {
  nn::BatchNorm2D bn(3);
  bn.weight().copy_(fvec({0.5f, 1.5f, -1.f}, {3}));
  for (int step = 0; step < 2; ++step) bn(testutil::rnd({4, 3, 2, 2}, 30 + step) * 3.f + 1.f);
  const std::string path = ::testing::TempDir() + "/galley_batch_norm_state.safetensors";
  galley::io::save_safetensors(path, bn.state_dict());
  nn::BatchNorm2D loaded(3);
  loaded.load_state_dict(galley::io::load_safetensors(path));
  for (auto& [name, t] : bn.state_dict()) {
    const Tensor other = loaded.state_dict().at(name);
    EXPECT_EQ(other.dtype(), t.dtype()) << name;
    if (t.dtype() == galley::DType::Int64)
      EXPECT_EQ(other.to_vector<int64_t>(), t.to_vector<int64_t>()) << name;
    else
      EXPECT_EQ(other.to_vector(), t.to_vector()) << name;
  }
  bn.eval();
  loaded.eval();
  Tensor x = testutil::rnd({2, 3, 2, 2}, 40);
  EXPECT_EQ(loaded(x).to_vector(), bn(x).to_vector());
  std::remove(path.c_str());
}

TEST(BatchNorm, StatisticsHaveTheSameBitsForAnyThreadCount) {
  const int threads = galley::num_threads();
  // Long planes with more channels than threads (a channel at a time), long planes of 2
  // channels (a channel at a time below 3 threads, memory order at 3), short planes (memory
  // order), and no planes.
  for (const Shape& shape :
       {Shape{8, 4, 64, 65}, Shape{6, 2, 24, 24}, Shape{16, 8, 7, 7}, Shape{5000, 6}}) {
    Tensor x = testutil::rnd(shape, 3) * 2.f + 10.f;
    std::vector<std::vector<float>> results;
    for (int t : {1, 2, 3}) {
      galley::set_num_threads(t);
      Tensor rm = galley::zeros({shape[1]}), rv = galley::ones({shape[1]});
      Tensor xg = x.clone();
      xg.set_requires_grad(true);
      Tensor y = galley::batch_norm(xg, rm, rv, Tensor(), Tensor(), {.training = true});
      galley::sum(galley::mul(y, x)).backward();
      std::vector<float> r = rm.to_vector(), v = rv.to_vector(), g = xg.grad().to_vector();
      r.insert(r.end(), v.begin(), v.end());
      r.insert(r.end(), g.begin(), g.end());
      results.push_back(r);
    }
    EXPECT_EQ(results[0], results[1]) << galley::shape_str(shape);
    EXPECT_EQ(results[0], results[2]) << galley::shape_str(shape);
  }
  galley::set_num_threads(threads);
}

TEST(BatchNorm, FusedReluHasTheBitsOfAReluAfterIt) {
  // The fused backward masks the gradient where the forward's ReLU stopped its output (a float32
  // host kernel recomputes that from x); a separate ReLU masks it by its output. Same bits, on
  // planes long (a channel at a time) and short (memory order).
  for (const Shape& shape : {Shape{4, 3, 24, 24}, Shape{8, 5, 7, 7}}) {
    const int64_t C = shape[1];
    Tensor x = testutil::rnd(shape, 11);
    Tensor w = testutil::rnd({C}, 12) + 1.5f, b = testutil::rnd({C}, 13);
    Tensor gy = testutil::rnd(shape, 14);
    std::vector<std::vector<float>> got;
    for (bool fused : {true, false}) {
      Tensor xg = x.clone().set_requires_grad(true);
      Tensor wg = w.clone().set_requires_grad(true), bg = b.clone().set_requires_grad(true);
      galley::BatchNormOptions o;
      o.training = true, o.relu = fused;
      Tensor y = galley::batch_norm(xg, Tensor(), Tensor(), wg, bg, o);
      if (!fused) y = galley::relu(y);
      galley::sum(galley::mul(y, gy)).backward();
      std::vector<float> r = y.to_vector(), g = xg.grad().to_vector(), gw = wg.grad().to_vector(),
                         gb = bg.grad().to_vector();
      r.insert(r.end(), g.begin(), g.end());
      r.insert(r.end(), gw.begin(), gw.end());
      r.insert(r.end(), gb.begin(), gb.end());
      got.push_back(r);
    }
    EXPECT_EQ(got[0], got[1]) << galley::shape_str(shape);
  }
}

TEST(BatchNorm, StatisticsOfDataFarFromZero) {
  // Shifted sums: a mean 1e4 times the spread loses nothing of the variance.
  Tensor x = testutil::rnd({16, 2, 8, 8}, 4) + 1e4f;
  Tensor rm = galley::zeros({2}), rv = galley::zeros({2});
  galley::batch_norm(x, rm, rv, Tensor(), Tensor(), {.training = true, .momentum = 1.0});
  const ChannelStats s = channel_stats(x);
  const double n = double(s.count);
  expect_all_near(rv, {s.var[0] * n / (n - 1), s.var[1] * n / (n - 1)}, 1e-4, "variance");
}

TEST(BatchNorm, ErrorsNameTheLayerOrOpAndTheShapes) {
  nn::BatchNorm2D bn(3);
  expect_contains(error_of([&] {
                    bn(galley::zeros({2, 4, 3, 3}));
                  }),
                  {"BatchNorm2D(3", "[N, 3, H, W]", "[2, 4, 3, 3]"});
  expect_contains(error_of([&] {
                    bn(galley::zeros({1, 3, 1, 1}));
                  }),
                  {"BatchNorm2D(3", "more than 1 value per channel", "[1, 3, 1, 1]"});
  nn::BatchNorm1D bn1(4);
  expect_contains(error_of([&] {
                    bn1(galley::zeros({2, 4, 3, 3}));
                  }),
                  {"BatchNorm1D(4", "[N, 4] or [N, 4, L]"});
  const Tensor x = galley::zeros({2, 3});
  expect_contains(error_of([&] {
                    galley::batch_norm(x, galley::zeros({3}, galley::DType::BFloat16),
                                       galley::ones({3}), Tensor(), Tensor());
                  }),
                  {"batch_norm", "running_mean", "bfloat16", "float32"});
  expect_contains(error_of([&] {
                    galley::batch_norm(x, galley::zeros({4}), galley::ones({4}), Tensor(),
                                       Tensor());
                  }),
                  {"batch_norm", "running_mean", "[4]", "3 channels", "[2, 3]"});
  expect_contains(error_of([&] {
                    galley::batch_norm(x, Tensor(), Tensor(),
                                       galley::ones({3}, galley::DType::Float16), Tensor());
                  }),
                  {"batch_norm", "weight", "float16", "float32 input [2, 3]"});
  expect_contains(error_of([&] {
                    galley::batch_norm(galley::zeros({3}), Tensor(), Tensor(), Tensor(), Tensor());
                  }),
                  {"batch_norm", "[N, C]", "[3]"});
  expect_contains(error_of([&] { galley::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor()); }),
                  {"batch_norm", "running_mean", "evaluation mode"});
}

// ----------------------------------------------------------------------------- models::ResNet

TEST(ResNet, Resnet20HasTheLayoutOfTheExampleAndPyTorchsNames) {
  galley::models::ResNet net({.in_channels = 1, .num_classes = 10});
  // 19 convolutions (stem + 18 in 9 blocks) + 2 projections, 21 BatchNorms, one linear layer.
  size_t convs = 0, bns = 0;
  for (const auto& [name, p] : net.named_parameters()) {
    if (p.dim() == 4) ++convs;
  }
  for (const auto& [name, b] : net.named_buffers())
    if (name.size() > 12 && name.compare(name.size() - 12, 12, "running_mean") == 0) ++bns;
  EXPECT_EQ(convs, 21u);
  EXPECT_EQ(bns, 21u);
  std::set<std::string> names;
  for (const auto& [name, t] : net.named_state()) names.insert(name);
  for (const char* n :
       {"conv.weight", "bn.running_mean", "layer1_0.conv1.weight", "layer1_2.bn2.bias",
        "layer2_0.shortcut_conv.weight", "layer2_0.shortcut_bn.num_batches_tracked",
        "layer3_2.conv2.weight", "fc.weight", "fc.bias"})
    EXPECT_EQ(names.count(n), 1u) << n;
  EXPECT_EQ(names.count("layer1_0.shortcut_conv.weight"), 0u) << "identity shortcut in stage 1";
  EXPECT_EQ(names.count("conv.bias"), 0u) << "convolutions before a BatchNorm have no bias";
  // ResNet-20's 0.27M parameters, as many as models_torch.py's ResNet(in_channels=1) has.
  int64_t params = 0;
  for (const Tensor& p : net.parameters()) params += p.numel();
  EXPECT_EQ(params, 272186);

  Tensor x = galley::randn({2, 1, 28, 28});
  Tensor y = net(x);
  EXPECT_EQ(y.shape(), (galley::Shape{2, 10}));
  net.eval();
  EXPECT_EQ(net(x).shape(), (galley::Shape{2, 10}));
}

TEST(ResNet, ShapeOptionsAndErrors) {
  galley::models::ResNet net(
      {.in_channels = 3, .num_classes = 7, .width = 4, .stages = 2, .blocks_per_stage = 1});
  EXPECT_EQ(net(galley::randn({2, 3, 8, 8})).shape(), (galley::Shape{2, 7}));
  expect_contains(error_of([&] {
                    net(galley::randn({2, 1, 8, 8}));
                  }),
                  {"ResNet(in_channels=3", "[N, 3, H, W]", "[2, 1, 8, 8]"});
  expect_contains(error_of([] { galley::models::ResNet bad({.stages = 0}); }),
                  {"ResNet(", "stages=0", "1 to 8 stages"});
  expect_contains(error_of([] { galley::models::BasicBlock bad(4, 8, 0); }),
                  {"BasicBlock(4, 8)", "stride 0"});
  // An error inside a block names the block.
  expect_contains(error_of([&] {
                    net(galley::randn({1, 3, 2, 2}));
                  }),
                  {"BasicBlock", "more than 1 value per channel"});
}

// Layers form a tree: a layer may be shared by several parents, never registered under one of
// its own descendants (walking the parameters would never end).
TEST(LayerErrors, ACycleOfLayersIsRefused) {
  struct Box : galley::nn::Layer {
    using Layer::register_layer;
  };
  Box a, b, c, shared;
  b.register_layer("c", c);
  a.register_layer("b", b);
  a.register_layer("shared", shared);
  b.register_layer("shared", shared);  // shared, not a cycle
  testutil::expect_contains(testutil::error_of([&] { c.register_layer("a", a); }),
                            {"'a'", "contains this layer", "cycle"});
  testutil::expect_contains(testutil::error_of([&] { b.register_layer("a", a); }), {"cycle"});
  EXPECT_EQ(a.parameters().size(), 0u);
}

// One name, one entry: a parameter, a buffer and a layer of one layer never share a name (a
// buffer named as a parameter gave the state dict two entries under one key).
TEST(LayerErrors, ANameIsRegisteredOnce) {
  struct Box : galley::nn::Layer {
    using Layer::register_buffer;
    using Layer::register_layer;
    using Layer::register_parameter;
  };
  Box box, child;
  box.register_parameter("w", galley::ones({2}));
  box.register_buffer("count", galley::zeros({1}));
  box.register_layer("child", child);
  for (const char* name : {"w", "count", "child"}) {
    testutil::expect_contains(
        testutil::error_of([&] { box.register_buffer(name, galley::zeros({1})); }),
        {"buffer", std::string("'") + name + "'", "already registered"});
    testutil::expect_contains(
        testutil::error_of([&] { box.register_parameter(name, galley::zeros({1})); }),
        {"parameter", std::string("'") + name + "'", "already registered"});
    testutil::expect_contains(testutil::error_of([&] { box.register_layer(name, child); }),
                              {"layer", std::string("'") + name + "'", "already registered"});
  }
  EXPECT_EQ(box.state_dict().size(), 2u);
}

// An undefined tensor in a state dict is refused naming the layer and the entry, before anything
// is written; a Flatten or ReLU layer's error names the layer, as the other layers' do.
TEST(Layer, LoadStateDictNamesAnUndefinedEntry) {
  galley::nn::BatchNorm2D bn(2);
  auto sd = bn.state_dict();
  sd["running_mean"] = galley::full({2}, 3.f);
  sd["weight"] = Tensor();
  testutil::expect_contains(testutil::error_of([&] { bn.load_state_dict(sd); }),
                            {"BatchNorm", "load_state_dict", "'weight'", "undefined"});
  EXPECT_EQ(bn.state_dict().at("running_mean").to_vector(), (std::vector<float>{0.f, 0.f}));
  galley::nn::Flatten flat(2);
  testutil::expect_contains(testutil::error_of([&] { flat(galley::ones({2})); }),
                            {"Flatten", "flatten"});
  galley::nn::ReLU relu;
  testutil::expect_contains(testutil::error_of([&] { relu(Tensor()); }), {"ReLU"});
}

// A batch the op refuses (a residual of another shape, one value per channel) is not counted:
// num_batches_tracked and, with momentum unset, the cumulative average stay as they were, and
// the next batch takes the weight 1 / (batches so far + 1).
TEST(BatchNorm, ARefusedBatchIsNotCounted) {
  galley::nn::BatchNorm2D bn(2, {.momentum = std::nullopt});
  Tensor a = testutil::rnd({3, 2, 2, 2}, 5), b = testutil::rnd({3, 2, 2, 2}, 6);
  bn(a);
  const std::vector<float> mean_a = bn.running_mean().to_vector();
  EXPECT_THROW(bn.forward(std::vector<Tensor>{b, galley::zeros({3, 2, 2, 1})}), galley::Error);
  EXPECT_THROW(bn(galley::ones({1, 2, 1, 1})), galley::Error);
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{1});
  EXPECT_EQ(bn.running_mean().to_vector(), mean_a);
  bn(b);
  EXPECT_EQ(bn.num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{2});
  // The cumulative average of the two batches' means.
  const std::vector<float> av = a.to_vector(), bv = b.to_vector();
  for (int64_t c = 0; c < 2; ++c) {
    double sa = 0, sb = 0;
    for (int64_t i = 0; i < 24; ++i)
      if ((i / 4) % 2 == c) sa += av[size_t(i)], sb += bv[size_t(i)];
    EXPECT_NEAR(bn.running_mean().to_vector()[size_t(c)], (sa / 12 + sb / 12) / 2, 1e-6) << c;
  }
}

// The handle register_parameter returns stays valid as more are registered (the storage used
// to be a vector, whose growth moved it: a layer keeping the reference read freed memory).
TEST(LayerApi, RegisteredHandlesStayValidAsMoreAreRegistered) {
  struct Many : nn::Layer {
    Many() {
      first = &register_parameter("p0", galley::full({2}, 3.f));
      for (int i = 1; i < 100; ++i) register_parameter("p" + std::to_string(i), galley::zeros({1}));
      kept = &register_buffer("b0", galley::full({1}, 5.f));
      for (int i = 1; i < 100; ++i) register_buffer("b" + std::to_string(i), galley::zeros({1}));
    }
    Tensor* first = nullptr;
    Tensor* kept = nullptr;
  };
  Many m;
  EXPECT_EQ(m.first->to_vector(), (std::vector<float>{3.f, 3.f}));
  EXPECT_TRUE(m.first->is_same(m.named_parameters().front().second));
  EXPECT_EQ(m.kept->to_vector(), (std::vector<float>{5.f}));
}

// requires_grad = false freezes the registered parameter even where the value takes a gradient
// (another layer's weight), as PyTorch's Parameter(v, requires_grad=False); the value's owner
// keeps training its own, on the same data.
TEST(LayerApi, AParameterRegisteredFrozenTakesNoGradient) {
  nn::Linear source(2, 2);
  struct Frozen : nn::Layer {
    explicit Frozen(const Tensor& w) { weight = &register_parameter("w", w, false); }
    Tensor* weight = nullptr;
  };
  Frozen frozen(source.weight());
  EXPECT_FALSE(frozen.weight->requires_grad());
  EXPECT_TRUE(source.weight().requires_grad());
  EXPECT_EQ(frozen.weight->raw_data(), source.weight().raw_data());  // the same data
  galley::sum(galley::mul(*frozen.weight, source.weight())).backward();
  EXPECT_FALSE(frozen.weight->grad().defined());
  EXPECT_TRUE(source.weight().grad().defined());
  expect_contains(error_of([] {
                    struct Ints : nn::Layer {
                      Ints() {
                        register_parameter("n",
                                           galley::zeros({2}, {.dtype = galley::DType::Int64}));
                      }
                    };
                    Ints bad;
                  }),
                  {"parameter 'n'", "int64", "float32"});
}

// A layer registered in two places lists its buffers and generators once, under their first
// names, as PyTorch's named_buffers() does (DataParallel copied the shared buffers twice, and a
// checkpoint kept the shared generator twice); state_dict keeps both names, as PyTorch's does.
TEST(LayerApi, ASharedLayersBuffersAndGeneratorsAreListedOnce) {
  auto bn = std::make_shared<nn::BatchNorm1D>(2);
  nn::Sequential twice(bn, bn);
  const auto buffers = twice.named_buffers();
  ASSERT_EQ(buffers.size(), 3u);
  for (const auto& [name, t] : buffers) EXPECT_EQ(name.compare(0, 2, "0."), 0) << name;
  EXPECT_EQ(twice.state_dict().count("1.running_mean"), 1u);
  auto drop = std::make_shared<nn::Dropout>(0.5f);
  nn::Sequential drops(drop, drop);
  const auto gens = drops.named_generators();
  ASSERT_EQ(gens.size(), 1u);
  EXPECT_EQ(gens[0].first.compare(0, 2, "0."), 0) << gens[0].first;
}

TEST(LayerApi, Conv2DDescribesItsDilationGroupsAndBias) {
  nn::Conv2D conv(4, 6, 3, {.stride = 2, .padding = 2, .dilation = 2, .groups = 2, .bias = false});
  EXPECT_EQ(conv.repr(),
            "Conv2D(4, 6, kernel=3, stride=2, padding=2, dilation=2, groups=2, bias=false)");
  EXPECT_EQ(nn::Conv2D(3, 8, 3).repr(), "Conv2D(3, 8, kernel=3, stride=1, padding=0)");
}

// Context added on the way out (Sequential naming the layer) keeps a cause nested in the error
// (it was dropped), and the error's type.
TEST(Errors, AddedContextKeepsTheNestedCauseAndTheType) {
  struct Thrower : nn::Layer {
    Tensor forward(const Tensor&) override {
      try {
        throw std::runtime_error("the cause");
      } catch (...) {
        std::throw_with_nested(galley::OutOfMemoryError("thrower failed"));
      }
    }
    std::string repr() const override { return "Thrower"; }
  };
  nn::Sequential model(std::make_shared<nn::ReLU>(), std::make_shared<Thrower>());
  try {
    model(galley::ones({2}));
    ADD_FAILURE() << "no exception";
  } catch (const galley::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("thrower failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Sequential"), std::string::npos) << e.what();
    testutil::expect_nested<std::runtime_error>(e, "the cause");
  }
}

// The host's heap exhausted inside a layer (a kernel's std::vector, not a tensor) reaches the
// caller as galley's OutOfMemoryError, which a training loop catches to lower its batch, with
// the layers' context and the bad_alloc nested. Before, it left as a bare std::bad_alloc.
TEST(Errors, AHostAllocationFailureInALayerIsAnOutOfMemoryError) {
  struct Hungry : nn::Layer {
    Tensor forward(const Tensor&) override { throw std::bad_alloc(); }
    std::string repr() const override { return "Hungry"; }
  };
  nn::Sequential model(std::make_shared<nn::ReLU>(), std::make_shared<Hungry>());
  try {
    model(galley::ones({2}));
    ADD_FAILURE() << "no exception";
  } catch (const galley::OutOfMemoryError& e) {
    expect_contains(e.what(), {"Sequential[1]", "host allocation failed"});
    testutil::expect_nested<std::bad_alloc>(e, std::bad_alloc().what());
  }
}

// A std::bad_array_new_length (a size out of range) is a plain galley::Error at every boundary,
// not an OutOfMemoryError, which a training loop would answer by lowering its batch for ever.
TEST(Errors, ABadArrayLengthIsNotOutOfMemory) {
  auto type_of = [](auto&& rethrow) {
    try {
      try {
        throw std::bad_array_new_length();
      } catch (...) {
        rethrow();
      }
    } catch (const galley::OutOfMemoryError&) {
      return std::string("OutOfMemoryError");
    } catch (const galley::Error&) {
      return std::string("Error");
    } catch (...) {
      return std::string("other");
    }
    return std::string("nothing");
  };
  EXPECT_EQ(type_of([] { galley::detail::rethrow_with_prefix("p: "); }), "Error");
  EXPECT_EQ(type_of([] { galley::detail::raise_nested("p"); }), "Error");
}

// A user's own exception type from a user's layer passes through galley's layers as it was
// thrown: a caller catches it by its type.
TEST(Errors, AUsersOwnExceptionPassesThroughTheLayersUnchanged) {
  struct StopTraining {
    int at = 0;
  };
  struct Stopper : nn::Layer {
    Tensor forward(const Tensor&) override { throw StopTraining{7}; }
  };
  nn::Sequential model(std::make_shared<nn::ReLU>(), std::make_shared<Stopper>());
  try {
    model(galley::ones({2}));
    ADD_FAILURE() << "no exception";
  } catch (const StopTraining& s) {
    EXPECT_EQ(s.at, 7);
  }
}
