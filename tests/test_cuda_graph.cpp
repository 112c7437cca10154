// CUDA graphs: a captured SimpleCNN training step (forward, backward, Adam) replayed gives the
// parameters and losses of eager steps; host copies inside a capture are a clear error; replays
// allocate nothing. Compiled always; the GPU tests skip with the reason without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "galley/galley.h"
#include "models.h"
#include "test_util.h"

using galley::Device;
using galley::DType;
using galley::Tensor;
using galley::cuda::Graph;

TEST(CudaGraph, MisuseIsAClearErrorWithOrWithoutAGpu) {
  Graph g;
  EXPECT_FALSE(g.captured());
  testutil::expect_contains(testutil::error_of([&] { g.replay(); }),
                            {"replay", "nothing has been captured"});
  testutil::expect_contains(testutil::error_of([&] { g.capture(Device::cpu(), [] {}); }),
                            {"cpu", "not a GPU"});
  if (galley::cuda::available()) return;
  testutil::expect_contains(testutil::error_of([&] { g.capture(Device::cuda(0), [] {}); }),
                            {"cuda:0"});
  EXPECT_FALSE(g.captured());
}

namespace {
// Batch k of a fixed sequence, on the host.
std::pair<Tensor, Tensor> batch(int k, int64_t n) {
  galley::manual_seed(100 + k);
  Tensor x = galley::randn({n, 3, 32, 32});
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = (i * 3 + k) % 10;
  return {x, Tensor::from_vector(labels, {n})};
}
}  // namespace

TEST(CudaGraph, ReplayedTrainingStepsMatchEagerSteps) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t n = 32;
  const int steps = 6;
  galley::manual_seed(7);
  testmodels::SimpleCNN eager, graphed;
  graphed.load_state_dict(eager.state_dict());
  eager.to(gpu);
  graphed.to(gpu);
  galley::optim::Adam oe(eager.parameters()), og(graphed.parameters());
  galley::nn::CrossEntropyLoss loss_fn;

  std::vector<float> eager_losses;
  for (int k = 0; k < steps; ++k) {
    auto [x, y] = batch(k, n);
    Tensor loss = loss_fn(eager(x.to(gpu)), y.to(gpu));
    loss.backward();
    oe.step();
    oe.clear_grad();
    eager_losses.push_back(loss.item());
  }

  Tensor sx = galley::zeros({n, 3, 32, 32}, DType::Float32, gpu);
  Tensor sy = galley::zeros({n}, DType::Int64, gpu);
  Tensor loss;
  auto step = [&] {
    loss = loss_fn(graphed(sx), sy);
    loss.backward();
    og.step();
    og.clear_grad();
  };
  std::vector<float> graph_losses;
  {
    auto [x, y] = batch(0, n);
    sx.copy_(x.to(gpu));
    sy.copy_(y.to(gpu));
    step();  // eager: creates the optimizer state, picks the cuDNN algorithms
    graph_losses.push_back(loss.item());
  }
  Graph graph;
  graph.capture(gpu, step);
  ASSERT_TRUE(graph.captured());
  EXPECT_EQ(graph.device(), gpu);
  const auto before = galley::memory_stats(gpu);
  for (int k = 1; k < steps; ++k) {
    auto [x, y] = batch(k, n);
    sx.copy_(x.to(gpu));
    sy.copy_(y.to(gpu));
    graph.replay();
    graph_losses.push_back(loss.item());
  }
  // Replays write into the graph's own memory: nothing new is allocated.
  EXPECT_EQ(galley::memory_stats(gpu).device_allocs, before.device_allocs);

  for (int k = 0; k < steps; ++k)
    EXPECT_NEAR(graph_losses[k], eager_losses[k], 1e-5 * std::max(1.f, std::abs(eager_losses[k])))
        << "step " << k;
  auto pe = eager.parameters(), pg = graphed.parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    auto a = pe[i].to_vector(), b = pg[i].to_vector();
    double worst = 0;
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, double(std::abs(a[j] - b[j])));
    EXPECT_LE(worst, 1e-5) << "parameter " << i;
  }
  // The step count advanced on the device during replays: the saved state says 6 steps.
  EXPECT_EQ(og.state_dict().get_int("state.0.step", "test"), steps);
}

// A mixed-precision step captured whole: the forward and the loss under bfloat16 autocast (the
// parameters' bfloat16 copies converted inside the captured scope, tensor-core products), the
// float32 gradients and Adam, replayed, gives the eager autocast step's losses and parameters.
TEST(CudaGraph, ReplayedBFloat16AutocastStepsMatchEagerSteps) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t n = 32;
  const int steps = 6;
  galley::manual_seed(8);
  testmodels::SimpleCNN eager, graphed;
  graphed.load_state_dict(eager.state_dict());
  eager.to(gpu);
  graphed.to(gpu);
  galley::optim::Adam oe(eager.parameters()), og(graphed.parameters());
  galley::nn::CrossEntropyLoss loss_fn;
  auto autocast_loss = [&](testmodels::SimpleCNN& model, const Tensor& x, const Tensor& y) {
    galley::amp::Autocast autocast(DType::BFloat16);
    return loss_fn(model(x), y);
  };

  std::vector<float> eager_losses;
  for (int k = 0; k < steps; ++k) {
    auto [x, y] = batch(k, n);
    Tensor loss = autocast_loss(eager, x.to(gpu), y.to(gpu));
    loss.backward();
    oe.step();
    oe.clear_grad();
    eager_losses.push_back(loss.item());
  }

  Tensor sx = galley::zeros({n, 3, 32, 32}, DType::Float32, gpu);
  Tensor sy = galley::zeros({n}, DType::Int64, gpu);
  Tensor loss;
  auto step = [&] {
    loss = autocast_loss(graphed, sx, sy);
    loss.backward();
    og.step();
    og.clear_grad();
  };
  std::vector<float> graph_losses;
  {
    auto [x, y] = batch(0, n);
    sx.copy_(x.to(gpu));
    sy.copy_(y.to(gpu));
    step();  // eager: the optimizer state, the cuDNN plans of the bfloat16 shapes
    graph_losses.push_back(loss.item());
  }
  Graph graph;
  graph.capture(gpu, step);
  ASSERT_TRUE(graph.captured());
  for (int k = 1; k < steps; ++k) {
    auto [x, y] = batch(k, n);
    sx.copy_(x.to(gpu));
    sy.copy_(y.to(gpu));
    graph.replay();
    graph_losses.push_back(loss.item());
  }
  // The same bfloat16 products in the same order: only the algorithms' own nondeterminism
  // separates them.
  for (int k = 0; k < steps; ++k)
    EXPECT_NEAR(graph_losses[k], eager_losses[k], 1e-3 * std::max(1.f, std::abs(eager_losses[k])))
        << "step " << k;
  auto pe = eager.parameters(), pg = graphed.parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    EXPECT_EQ(pg[i].dtype(), DType::Float32) << "master weights stay float32";
    auto a = pe[i].to_vector(), b = pg[i].to_vector();
    double worst = 0;
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, double(std::abs(a[j] - b[j])));
    EXPECT_LE(worst, 1e-3) << "parameter " << i;
  }
}

TEST(CudaGraph, AHostCopyInsideTheStepIsAClearErrorAndLeavesNoCapture) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor a = galley::ones({1000}, DType::Float32, gpu);
  Graph graph;
  testutil::expect_contains(
      testutil::error_of([&] { graph.capture(gpu, [&] { (void)galley::add(a, a).item(); }); }),
      {"cuda:0", "capture", "read values back"});
  EXPECT_FALSE(graph.captured());
  // The stream is usable eagerly afterwards.
  EXPECT_EQ(galley::add(a, a).to_vector()[999], 2.f);
}

TEST(CudaGraph, ReplaysSeeNewValuesOfStaticInputs) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = galley::zeros({4097}, DType::Float32, gpu);
  Tensor y;
  Graph graph;
  graph.capture(gpu, [&] { y = galley::relu(galley::mul(x, x)); });
  for (float v : {1.f, -3.f, 0.5f}) {
    x.fill_(v);
    graph.replay();
    EXPECT_EQ(y.to_vector()[4096], v * v);
  }
}

TEST(CudaGraph, EmptyingTheCacheLeavesTheGraphsMemoryAlone) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = galley::zeros({1 << 20}, DType::Float32, gpu);
  Tensor y;
  Graph graph;
  // The temporary (x * x) is freed inside the capture: its block stays the graph's.
  graph.capture(gpu, [&] { y = galley::relu(galley::add(galley::mul(x, x), x)); });
  galley::empty_cache(gpu);
  // Had the graph's free blocks gone back to the driver, this could land on them and the
  // replay would overwrite it.
  Tensor junk = galley::full({1 << 22}, -7.f, DType::Float32, gpu);
  x.fill_(2.f);
  graph.replay();
  EXPECT_EQ(y.to_vector()[12345], 6.f);
  for (float v : junk.to_vector()) ASSERT_EQ(v, -7.f);
}

TEST(CudaGraph, OptimizerStateMadeInsideACaptureIsAnError) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor w = galley::ones({8}, DType::Float32, gpu).set_requires_grad();
  galley::optim::Adam opt({w});
  Graph graph;
  testutil::expect_contains(testutil::error_of([&] {
                              graph.capture(gpu, [&] {
                                galley::sum(galley::mul(w, w)).backward();
                                opt.step();
                              });
                            }),
                            {"Adam", "cuda:0", "capture", "eagerly once"});
  EXPECT_FALSE(graph.captured());
}

// The documented pattern: fresh host data goes into the graph's static input with copy_ before
// each replay.
TEST(CudaGraph, CopyingHostDataIntoTheStaticInputBeforeEachReplay) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = galley::zeros({1000}, DType::Float32, gpu);
  Tensor y;
  Graph graph;
  graph.capture(gpu, [&] { y = galley::add(x, x); });
  for (float v : {1.f, 4.f}) {
    x.copy_(galley::full({1000}, v));
    graph.replay();
    EXPECT_EQ(y.to_vector()[999], 2 * v);
  }
}
