// Every op on the GPU against the same op on the CPU (the oracle), forward and gradients, and a
// few SimpleCNN training steps on both. Compiled always; skipped with the reason without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "models.h"
#include "test_util.h"

using galley::Device;
using galley::Tensor;

namespace {

const Device gpu = Device::cuda(0);

// Worst |a - b| over max(1, |b|) for float tensors.
double worst_error(const Tensor& a, const Tensor& b) {
  auto va = a.to(Device::cpu()).to_vector(), vb = b.to(Device::cpu()).to_vector();
  EXPECT_EQ(va.size(), vb.size());
  double worst = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i)
    worst =
        std::max(worst, std::abs(double(va[i]) - vb[i]) / std::max(1.0, std::abs(double(vb[i]))));
  return worst;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn on CPU copies and GPU copies of `inputs`, with a random output gradient, and compares
// the outputs and every input gradient within `tol`.
void compare(const char* name, Fn fn, std::vector<Tensor> inputs, double tol = 1e-5) {
  std::vector<Tensor> on_cpu, on_gpu;
  for (auto& t : inputs) {
    on_cpu.push_back(t.clone().set_requires_grad(true));
    on_gpu.push_back(t.to(gpu).set_requires_grad(true));
  }
  Tensor yc = fn(on_cpu), yg = fn(on_gpu);
  ASSERT_EQ(yg.device(), gpu) << name;
  EXPECT_LE(worst_error(yg, yc), tol) << name << ": output";
  Tensor g = galley::randn(yc.shape());
  yc.backward(g);
  yg.backward(g.to(gpu));
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(on_gpu[i].grad().defined()) << name << ": no gradient for input " << i;
    EXPECT_LE(worst_error(on_gpu[i].grad(), on_cpu[i].grad()), tol) << name << ": input " << i;
  }
}

// `steps` optimizer steps of a CPU model and its GPU copy on the same batches (batch(step): the
// input and the labels, on the host); each step's cross-entropy losses must agree.
template <typename Batch>
void train_both(galley::nn::Layer& on_cpu, galley::nn::Layer& on_gpu, galley::optim::Optimizer& oc,
                galley::optim::Optimizer& og, int steps, Batch batch) {
  galley::nn::CrossEntropyLoss loss_fn;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step);
    Tensor lc = loss_fn(on_cpu(x), y), lg = loss_fn(on_gpu(x.to(gpu)), y.to(gpu));
    EXPECT_NEAR(lg.item(), lc.item(), 1e-4 * std::max(1.f, std::abs(lc.item()))) << "step " << step;
    lc.backward();
    lg.backward();
    oc.step();
    og.step();
    oc.clear_grad();
    og.clear_grad();
  }
}

}  // namespace

TEST(CudaOps, Elementwise) {
  REQUIRE_GPU();
  compare("add broadcast", [](auto& v) { return v[0] + v[1]; },
          {galley::randn({4, 3, 5}), galley::randn({3, 1})});
  compare("sub", [](auto& v) { return v[0] - v[1]; }, {galley::randn({7, 9}), galley::randn({9})});
  compare("mul", [](auto& v) { return v[0] * v[1]; },
          {galley::randn({5, 6}), galley::randn({5, 6})});
  compare("div", [](auto& v) { return v[0] / v[1]; },
          {galley::randn({5, 6}), galley::rand({6}) + 1.f});
  compare("scalar", [](auto& v) { return v[0] * 3.f + 1.f; }, {galley::randn({1000})});
  compare("exp log pow",
          [](auto& v) { return galley::pow(galley::log(galley::exp(v[0]) + 1.f), 2.f); },
          {galley::randn({333})});
  compare("relu", [](auto& v) { return galley::relu(v[0]); }, {galley::randn({1, 2049})});
}

TEST(CudaOps, BiasRelu) {
  REQUIRE_GPU();
  compare("bias_relu channels", [](auto& v) { return galley::bias_relu(v[0], v[1]); },
          {galley::randn({4, 64, 15, 15}), galley::randn({64})});
  compare("bias_relu features", [](auto& v) { return galley::bias_relu(v[0], v[1], -1); },
          {galley::randn({33, 128}), galley::randn({128})});
}

TEST(CudaOps, BiasReluKeepsNanLikeTheCpu) {
  REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector({nan, -0.f, -1.f, 2.f}, {1, 4});
  auto y = galley::bias_relu(x.to(gpu), galley::zeros({4}).to(gpu), -1).to_vector();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_FALSE(std::signbit(y[1]));
  EXPECT_EQ(y[2], 0.f);
  EXPECT_EQ(y[3], 2.f);
}

TEST(CudaOps, LinearAlgebra) {
  REQUIRE_GPU();
  compare("matmul", [](auto& v) { return galley::matmul(v[0], v[1]); },
          {galley::randn({17, 33}), galley::randn({33, 9})});
  compare("linear", [](auto& v) { return galley::linear(v[0], v[1], v[2]); },
          {galley::randn({8, 300}), galley::randn({10, 300}), galley::randn({10})});
}

// Dimensions of size 0 as on the host: cuDNN refuses an empty batch and inputs without channels
// (the op layer answers those itself), cuBLAS is not asked for a product without terms.
TEST(CudaOps, EmptyDimensionsLikeTheCpu) {
  REQUIRE_GPU();
  compare("conv2d, an empty batch",
          [](auto& v) { return galley::conv2d(v[0], v[1], v[2], {.padding = 1}); },
          {galley::randn({0, 3, 8, 8}), galley::randn({4, 3, 3, 3}), galley::randn({4})});
  compare("conv2d, inputs without channels",
          [](auto& v) { return galley::conv2d(v[0], v[1], v[2]); },
          {galley::randn({2, 0, 5, 5}), galley::randn({4, 0, 3, 3}), galley::randn({4})});
  compare("linear, no input features", [](auto& v) { return galley::linear(v[0], v[1], v[2]); },
          {galley::randn({4, 0}), galley::randn({3, 0}), galley::randn({3})});
  compare("linear bf16, no input features",
          [](auto& v) {
            const auto bf = galley::DType::BFloat16;
            return galley::linear(v[0].to(bf), v[1].to(bf), v[2].to(bf)).to(galley::DType::Float32);
          },
          {galley::randn({4, 0}), galley::randn({3, 0}), galley::randn({3})});
  compare("matmul, an empty inner dimension", [](auto& v) { return galley::matmul(v[0], v[1]); },
          {galley::randn({3, 0}), galley::randn({0, 5})});
  for (float v : galley::mean(galley::randn({3, 0}).to(gpu), 1).to(Device::cpu()).to_vector())
    EXPECT_TRUE(std::isnan(v)) << "a mean over nothing is NaN, as on the host";
}

// The edges of ops' domains as on the host: a class masked out with a -inf logit, x^0's
// gradient at 0 and NaN, BatchNorm of an empty batch (compare() would not see a NaN: checked
// value by value here).
TEST(CudaOps, DomainEdgesLikeTheCpu) {
  REQUIRE_GPU();
  // The loss, the logits', x's and the BatchNorm weight's gradients, on device d.
  auto on = [](Device d) {
    Tensor logits = Tensor::from_vector({-INFINITY, 0.f, 1.f}, {1, 3}).to(d);
    logits.set_requires_grad(true);
    Tensor x = Tensor::from_vector({0.f, 4.f, NAN}, {3}).to(d);
    x.set_requires_grad(true);
    Tensor w = galley::ones({3}).to(d).set_requires_grad(true);
    Tensor bn = galley::batch_norm(galley::randn({0, 3, 2, 2}).to(d), Tensor(), Tensor(), w,
                                   Tensor(), {.training = true});
    Tensor loss =
        galley::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{1}, {1}).to(d));
    galley::add(galley::add(loss, galley::sum(galley::pow(x, 0.f))), galley::sum(bn)).backward();
    return std::vector<Tensor>{loss, logits.grad(), x.grad(), w.grad()};
  };
  const std::vector<Tensor> host = on(Device::cpu()), device = on(gpu);
  for (size_t k = 0; k < host.size(); ++k) {
    const auto h = host[k].to_vector(), v = device[k].to(Device::cpu()).to_vector();
    ASSERT_EQ(v.size(), h.size()) << k;
    for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], h[i], 1e-6) << k << " " << i;
  }
}

TEST(CudaOps, ConvolutionAndPooling) {
  REQUIRE_GPU();
  compare(
      "conv2d", [](auto& v) { return galley::conv2d(v[0], v[1], v[2], {.padding = 1}); },
      {galley::randn({4, 3, 16, 16}), galley::randn({8, 3, 3, 3}), galley::randn({8})}, 1e-4);
  compare("max_pool2d", [](auto& v) { return galley::max_pool2d(v[0], {.kernel_size = 2}); },
          {galley::randn({4, 8, 30, 30})});
  compare("max_pool2d 3/2/1",
          [](auto& v) {
            return galley::max_pool2d(v[0], {.kernel_size = 3, .stride = 2, .padding = 1});
          },
          {galley::randn({2, 3, 9, 11})});
}

TEST(CudaOps, ReductionsSoftmaxAndLoss) {
  REQUIRE_GPU();
  compare("sum", [](auto& v) { return galley::sum(v[0]); }, {galley::randn({1000, 7})});
  compare("mean dim", [](auto& v) { return galley::mean(v[0], 1); }, {galley::randn({6, 50, 4})});
  compare("softmax", [](auto& v) { return galley::softmax(v[0], 1); }, {galley::randn({6, 50, 4})});
  compare("log_softmax", [](auto& v) { return galley::log_softmax(v[0], -1); },
          {galley::randn({64, 10})});
  // Logits near 1e6, rows and columns: (x - m) - log s, not x - (m + log s) rounded to m's ulp.
  compare("log_softmax offset", [](auto& v) { return galley::log_softmax(v[0], -1); },
          {galley::randn({64, 10}) * 2.f + 1e6f});
  compare("log_softmax offset dim 1", [](auto& v) { return galley::log_softmax(v[0], 1); },
          {galley::randn({6, 50, 4}) * 2.f + 1e6f});
  std::vector<int64_t> l(64);
  for (int i = 0; i < 64; ++i) l[i] = i % 10 == 3 ? -100 : i % 10;
  Tensor labels = Tensor::from_vector(l, {64});
  for (auto red : {galley::Reduction::Mean, galley::Reduction::Sum, galley::Reduction::None}) {
    compare("cross_entropy",
            [&](auto& v) {
              return galley::cross_entropy(v[0], labels.to(v[0].device()),
                                           {.reduction = red, .label_smoothing = 0.1f});
            },
            {galley::randn({64, 10})});
  }
  Tensor x = galley::randn({5, 7});
  EXPECT_EQ(galley::argmax(x.to(gpu), 1).to_vector<int64_t>(),
            galley::argmax(x, 1).to_vector<int64_t>());
}

TEST(CudaOps, SimpleCnnTrainsLikeTheCpu) {
  REQUIRE_GPU();
  galley::manual_seed(5);
  testmodels::SimpleCNN on_cpu, on_gpu;
  on_gpu.load_state_dict(on_cpu.state_dict());
  on_gpu.to(gpu);
  galley::optim::Adam oc(on_cpu.parameters()), og(on_gpu.parameters());
  train_both(on_cpu, on_gpu, oc, og, 5, [](int step) {
    std::vector<int64_t> l(16);
    for (int i = 0; i < 16; ++i) l[i] = (i * 7 + step) % 10;
    return std::make_pair(galley::randn({16, 3, 32, 32}), Tensor::from_vector(l, {16}));
  });
  auto pc = on_cpu.parameters(), pg = on_gpu.parameters();
  for (size_t k = 0; k < pc.size(); ++k)
    EXPECT_LE(worst_error(pg[k], pc[k]), 1e-4) << "parameter " << k;
}

// The BatchNorm layers' state on the GPU: three training steps update running_mean,
// running_var (unbiased) and num_batches_tracked as the CPU does, with a momentum and with the
// cumulative average (momentum None, whose weights come from the counter); then evaluation uses
// the running statistics alike. [N, C] inputs (BatchNorm1D) and [N, C, H, W] (BatchNorm2D).
TEST(CudaOps, BatchNormLayersKeepTheirStateLikeTheCpu) {
  REQUIRE_GPU();
  using galley::nn::BatchNormLayerOptions;
  for (bool planes : {false, true})
    for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
      const std::string name = std::string(planes ? "BatchNorm2D" : "BatchNorm1D") +
                               (momentum ? " momentum 0.1" : " momentum None");
      SCOPED_TRACE(name);
      const BatchNormLayerOptions o{.momentum = momentum};
      std::unique_ptr<galley::nn::Layer> on_cpu, on_gpu;
      if (planes) {
        on_cpu = std::make_unique<galley::nn::BatchNorm2D>(3, o);
        on_gpu = std::make_unique<galley::nn::BatchNorm2D>(3, o);
      } else {
        on_cpu = std::make_unique<galley::nn::BatchNorm1D>(3, o);
        on_gpu = std::make_unique<galley::nn::BatchNorm1D>(3, o);
      }
      on_gpu->to(gpu);
      galley::Generator gen(17);
      for (int step = 0; step < 3; ++step) {
        const galley::Shape shape = planes ? galley::Shape{5, 3, 4, 6} : galley::Shape{7, 3};
        Tensor x = galley::randn(shape, gen) * (1.f + step) + float(step);
        Tensor yc = (*on_cpu)(x), yg = (*on_gpu)(x.to(gpu));
        EXPECT_LE(worst_error(yg, yc), 1e-5) << "output of step " << step;
        Tensor g = galley::randn(shape, gen);
        yc.backward(g);
        yg.backward(g.to(gpu));
      }
      auto pc = on_cpu->named_parameters(), pg = on_gpu->named_parameters();
      for (size_t k = 0; k < pc.size(); ++k)
        EXPECT_LE(worst_error(pg[k].second.grad(), pc[k].second.grad()), 1e-4)
            << pc[k].first << "'s gradient";
      auto bc = on_cpu->named_buffers(), bg = on_gpu->named_buffers();
      ASSERT_EQ(bc.size(), 3u);
      for (size_t k = 0; k < bc.size(); ++k) {
        ASSERT_EQ(bg[k].first, bc[k].first);
        ASSERT_EQ(bg[k].second.dtype(), bc[k].second.dtype()) << bc[k].first;
        if (bc[k].second.dtype() == galley::DType::Int64)
          EXPECT_EQ(bg[k].second.to(Device::cpu()).to_vector<int64_t>(), std::vector<int64_t>{3});
        else
          EXPECT_LE(worst_error(bg[k].second, bc[k].second), 1e-5) << bc[k].first;
      }
      on_cpu->eval();
      on_gpu->eval();
      Tensor x = galley::randn(planes ? galley::Shape{2, 3, 4, 6} : galley::Shape{2, 3}, gen);
      EXPECT_LE(worst_error((*on_gpu)(x.to(gpu)), (*on_cpu)(x)), 1e-5) << "evaluation";
    }
}

// A ResNet (BatchNorm with the fused ReLU and residual sum, projection shortcuts, global
// average pooling) trains on the GPU as on the CPU: losses, parameters and running statistics
// after three SGD-momentum steps.
TEST(CudaOps, ResNetTrainsLikeTheCpu) {
  REQUIRE_GPU();
  galley::manual_seed(9);
  const galley::models::ResNetOptions o{.in_channels = 1, .width = 4, .blocks_per_stage = 1};
  galley::models::ResNet on_cpu(o), on_gpu(o);
  on_gpu.load_state_dict(on_cpu.state_dict());
  on_gpu.to(gpu);
  const galley::optim::SGDOptions so{.learning_rate = 0.05, .momentum = 0.9};
  galley::optim::SGD oc(on_cpu.parameters(), so), og(on_gpu.parameters(), so);
  galley::Generator gen(3);
  train_both(on_cpu, on_gpu, oc, og, 3, [&](int step) {
    std::vector<int64_t> l(8);
    for (int i = 0; i < 8; ++i) l[i] = (i * 3 + step) % 10;
    return std::make_pair(galley::randn({8, 1, 12, 12}, gen), Tensor::from_vector(l, {8}));
  });
  auto sc = on_cpu.state_dict(), sg = on_gpu.state_dict();
  for (auto& [name, t] : sc) {
    ASSERT_TRUE(sg.count(name)) << name;
    if (t.dtype() == galley::DType::Int64)
      EXPECT_EQ(sg[name].to(Device::cpu()).to_vector<int64_t>(), t.to_vector<int64_t>()) << name;
    else
      EXPECT_LE(worst_error(sg[name], t), 1e-3) << name;
  }
}

TEST(CudaOps, OptimizersUpdateManyTensorsLikeTheCpu) {
  REQUIRE_GPU();
  // 40 tensors (two launches' worth), sizes from 1 to past one block's chunk, odd sizes that
  // leave scalar tails, and a state_dict that reads the device's step count.
  std::vector<galley::Shape> shapes;
  for (int i = 0; i < 40; ++i) shapes.push_back({1 + (i * 977) % 9001});
  shapes.push_back({3, 4097});
  using Make = std::function<std::unique_ptr<galley::optim::Optimizer>(std::vector<Tensor>)>;
  const std::vector<std::pair<std::string, Make>> kinds = {
      {"Adam",
       [](auto p) {
         return std::make_unique<galley::optim::Adam>(
             p, galley::optim::AdamOptions{.weight_decay = 0.01});
       }},
      {"Adam amsgrad",
       [](auto p) {
         return std::make_unique<galley::optim::Adam>(p,
                                                      galley::optim::AdamOptions{.amsgrad = true});
       }},
      {"AdamW", [](auto p) { return std::make_unique<galley::optim::AdamW>(p); }},
      {"SGD", [](auto p) { return std::make_unique<galley::optim::SGD>(p); }},
      {"SGD nesterov",
       [](auto p) {
         return std::make_unique<galley::optim::SGD>(
             p, galley::optim::SGDOptions{.momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
       }},
  };
  for (const auto& [name, make] : kinds) {
    std::vector<Tensor> pc, pg;
    for (auto& s : shapes) {
      Tensor t = galley::randn(s);
      pc.push_back(t.clone().set_requires_grad(true));
      pg.push_back(t.to(gpu).set_requires_grad(true));
    }
    auto oc = make(pc), og = make(pg);
    for (int step = 0; step < 4; ++step) {
      for (size_t k = 0; k < pc.size(); ++k) {
        if (step == 2 && k % 7 == 3) continue;  // some tensors sit a step out
        Tensor g = galley::randn(pc[k].shape());
        pc[k].set_grad(g);
        pg[k].set_grad(g.to(gpu));
      }
      oc->step();
      og->step();
      oc->clear_grad();
      og->clear_grad();
    }
    for (size_t k = 0; k < pc.size(); ++k)
      EXPECT_LE(worst_error(pg[k], pc[k]), 2e-6) << name << " parameter " << k;
    auto sc = oc->state_dict(), sg = og->state_dict();
    EXPECT_EQ(sg.values, sc.values) << name;
  }
}

namespace {
// Parameters on the CPU and the same on the GPU, with the same random gradients.
void params_on_both(const std::vector<int64_t>& sizes, float scale, std::vector<Tensor>& pc,
                    std::vector<Tensor>& pg) {
  for (int64_t n : sizes) {
    Tensor g = galley::randn({n}) * scale;
    pc.push_back(galley::zeros({n}).set_requires_grad(true));
    pg.push_back(galley::zeros({n}).to(gpu).set_requires_grad(true));
    pc.back().set_grad(g);
    pg.back().set_grad(g.to(gpu));
  }
}
}  // namespace

TEST(CudaOps, ClipGradNormLikeTheCpu) {
  REQUIRE_GPU();
  // 70 tensors (two launches' worth of spans), sizes on both sides of a chunk, empty ones.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 70; ++i) sizes.push_back((i * 2741) % 20000);
  sizes.push_back(8192);
  sizes.push_back(8193);
  for (double p : {2.0, 1.0, 3.0, double(INFINITY)}) {
    for (double fraction : {0.25, 4.0}) {  // clipped, and left alone
      std::vector<Tensor> pc, pg;
      params_on_both(sizes, 1.f, pc, pg);
      // max_norm from the CPU's norm without clipping.
      const float norm = galley::nn::clip_grad_norm_(pc, 1e30, p);
      const float nc = galley::nn::clip_grad_norm_(pc, norm * fraction, p);
      const float ng = galley::nn::clip_grad_norm_(pg, norm * fraction, p);
      EXPECT_NEAR(ng, nc, 1e-6 * nc) << "norm_type " << p;
      for (size_t k = 0; k < pc.size(); ++k)
        ASSERT_LE(worst_error(pg[k].grad(), pc[k].grad()), 1e-6) << p << " tensor " << k;
    }
  }
  // The same gradients give the same bits at every call.
  std::vector<Tensor> pc, pg, pg2;
  galley::manual_seed(9);
  params_on_both(sizes, 1.f, pc, pg);
  galley::manual_seed(9);
  params_on_both(sizes, 1.f, pc, pg2);
  EXPECT_EQ(galley::nn::clip_grad_norm_(pg, 1.0), galley::nn::clip_grad_norm_(pg2, 1.0));
}

TEST(CudaOps, ClipGradNormOnTheGpuRaisesForNonFiniteGradientsAndChangesNothing) {
  REQUIRE_GPU();
  std::vector<Tensor> pc, pg;
  params_on_both({100, 30000, 7}, 1.f, pc, pg);
  auto v = pc[1].grad().to_vector();
  v[20000] = std::numeric_limits<float>::quiet_NaN();
  pg[1].set_grad(Tensor::from_vector(v, {30000}).to(gpu));
  auto before = pg[0].grad().to_vector();
  const std::string msg = testutil::error_of([&] { galley::nn::clip_grad_norm_(pg, 1.0); });
  testutil::expect_contains(msg, {"is nan", "cuda:0", "number 1 of the list"});
  EXPECT_EQ(pg[0].grad().to_vector(), before);
}

TEST(CudaOps, ClipGradValueLikeTheCpu) {
  REQUIRE_GPU();
  std::vector<Tensor> pc, pg;
  params_on_both({5, 8191, 8192, 40001, 0, 3}, 2.f, pc, pg);
  galley::nn::clip_grad_value_(pc, 0.7);
  galley::nn::clip_grad_value_(pg, 0.7);
  for (size_t k = 0; k < pc.size(); ++k)
    EXPECT_EQ(pg[k].grad().to_vector(), pc[k].grad().to_vector()) << "tensor " << k;
}

TEST(CudaOps, ANonFiniteLossIsReportedAtTheNextSynchronisation) {
  REQUIRE_GPU();
  Tensor w = galley::ones({3}).to(gpu).set_requires_grad(true);
  Tensor x = Tensor::from_vector({1.f, std::numeric_limits<float>::quiet_NaN(), 1.f}, {3}).to(gpu);
  Tensor loss = galley::sum(w * x);
  loss.backward();  // queued: no wait for the device
  testutil::expect_contains(testutil::error_of([&] { galley::cuda::synchronize(gpu); }),
                            {"backward: the loss is nan", "cuda:0", "set_check_loss_finite"});
  galley::cuda::synchronize(gpu);  // reported once
  // A finite loss reports nothing; with the guard off nothing is queued.
  galley::sum(w * w).backward();
  galley::cuda::synchronize(gpu);
  galley::set_check_loss_finite(false);
  galley::sum(w * x).backward();
  galley::cuda::synchronize(gpu);
  galley::set_check_loss_finite(true);
}

TEST(CudaOps, AnomalyDetectionNamesTheOpOnTheGpu) {
  REQUIRE_GPU();
  Tensor w = Tensor::from_vector({1.f, -2.f, 3.f}, {3}).to(gpu).set_requires_grad(true);
  galley::DetectAnomalyGuard on;
  testutil::expect_contains(testutil::error_of([&] { galley::log(w); }),
                            {"forward of log", "nan", "element 1", "[3]", "cuda:0"});
  Tensor z = galley::zeros({4}).to(gpu).set_requires_grad(true);
  Tensor loss = galley::sum(galley::pow(z, 0.5f));
  testutil::expect_contains(testutil::error_of([&] { loss.backward(); }),
                            {"backward of pow", "inf", "element 0", "cuda:0"});
}

// float32 to int64 and uint8 on the GPU: truncated and saturated as on the host (NaN to 0).
TEST(CudaOps, FloatToIntegerConversionsSaturateAsOnTheHost) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::from_vector(
      {std::nanf(""), inf, -inf, 1e30f, -1e30f, 2.9f, -2.9f, 300.f, -1.f, 255.5f}, {10});
  const Tensor gx = x.to(galley::Device::cuda(0));
  EXPECT_EQ(gx.to(galley::DType::Int64).to(galley::Device::cpu()).to_vector<int64_t>(),
            x.to(galley::DType::Int64).to_vector<int64_t>());
  EXPECT_EQ(gx.to(galley::DType::UInt8).to(galley::Device::cpu()).to_vector<uint8_t>(),
            x.to(galley::DType::UInt8).to_vector<uint8_t>());
}
