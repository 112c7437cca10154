// DataParallel on GPUs: one GPU trains like the CPU, several GPUs (NCCL) like one GPU on the
// whole batch. Compiled always; the GPU tests skip with the reason when the GPUs are missing.
#include <gtest/gtest.h>

#include <vector>

#include "amp_test_util.h"
#include "galley/galley.h"
#include "models.h"
#include "test_util.h"

using galley::Device;
using galley::Tensor;

namespace {

std::vector<std::pair<Tensor, Tensor>> batches(int count, int64_t size) {
  galley::Generator gen(11);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> labels(size);
    for (auto& l : labels) l = static_cast<int64_t>(gen.next_u64() % 10);
    out.emplace_back(galley::randn({size, 3, 32, 32}, gen), Tensor::from_vector(labels, {size}));
  }
  return out;
}

// Parameters of replica 0 after one Adam step per batch, the batches given on the host.
std::vector<std::vector<float>> train(const std::vector<Device>& devices,
                                      const std::map<std::string, Tensor>& init,
                                      const std::vector<std::pair<Tensor, Tensor>>& data) {
  galley::DataParallel<testmodels::SimpleCNN> model(devices);
  model.load_state_dict(init);
  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-3});
  galley::nn::CrossEntropyLoss loss_fn;
  for (auto& [x, y] : data) {
    loss_fn(model(x), y.to(devices[0])).backward();
    opt.step();
    opt.clear_grad();
  }
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : model.named_parameters()) out.push_back(p.to_vector());
  return out;
}

double worst(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      w = std::max(w,
                   double(std::abs(a[i][j] - b[i][j])) / std::max(1.0, double(std::abs(b[i][j]))));
  return w;
}

}  // namespace

TEST(CudaDataParallel, MixingGpuAndCpuReplicasIsAClearError) {
  testutil::expect_contains(
      testutil::error_of([] {
        galley::DataParallel<testmodels::SimpleCNN> m({Device::cpu(), Device::cuda(0)});
      }),
      {"DataParallel", "cuda:0", "cpu", "different kinds"});
}

TEST(CudaDataParallel, OneGpuTrainsLikeTheCpu) {
  if (galley::cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device here";
  testmodels::SimpleCNN init_model;
  const auto init = init_model.state_dict();
  const auto data = batches(5, 33);
  EXPECT_LE(worst(train({Device::cuda(0)}, init, data), train({Device::cpu()}, init, data)), 1e-4);
}

TEST(CudaDataParallel, SeveralGpusTrainLikeOneGpuOnTheWholeBatch) {
  const int n = galley::cuda_device_count();
  if (n < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << n;
  testmodels::SimpleCNN init_model;
  const auto init = init_model.state_dict();
  const auto data = batches(10, 33);  // uneven split across the GPUs
  std::vector<Device> gpus;
  for (int i = 0; i < std::min(n, 4); ++i) gpus.push_back(Device::cuda(i));
  EXPECT_LE(worst(train(gpus, init, data), train({Device::cuda(0)}, init, data)), 1e-5);
}

namespace {

// x * weight + bias, a ReLU, again: elementwise ops only, converted to bfloat16 when built.
class BFloat16Elementwise : public galley::nn::Layer {
 public:
  BFloat16Elementwise() {
    w1_ = register_parameter("w1", galley::randn({6}) * 0.5f + 1.f);
    b1_ = register_parameter("b1", galley::randn({6}) * 0.1f);
    w2_ = register_parameter("w2", galley::randn({6}) * 0.5f + 1.f);
    b2_ = register_parameter("b2", galley::randn({6}) * 0.1f);
    to(galley::DType::BFloat16);
  }
  Tensor forward(const Tensor& x) override { return galley::relu(x * w1_ + b1_) * w2_ + b2_; }

 private:
  Tensor w1_, b1_, w2_, b2_;
};

}  // namespace

TEST(CudaDataParallel, ABFloat16ModelOnSeveralGpusKeepsItsReplicasIdentical) {
  const int n = galley::cuda_device_count();
  if (n < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << n;
  std::vector<Device> gpus;
  for (int i = 0; i < std::min(n, 4); ++i) gpus.push_back(Device::cuda(i));
  galley::DataParallel<BFloat16Elementwise> model(gpus);
  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-2});
  galley::nn::CrossEntropyLoss loss_fn;
  galley::Generator gen(5);
  for (int s = 0; s < 5; ++s) {
    std::vector<int64_t> labels(20);
    for (auto& l : labels) l = static_cast<int64_t>(gen.next_u64() % 6);
    Tensor x = galley::randn({20, 6}, gen).to(galley::DType::BFloat16);
    loss_fn(model(x).to(galley::DType::Float32), Tensor::from_vector(labels, {20}).to(gpus[0]))
        .backward();
    opt.step();
    opt.clear_grad();
  }
  const auto first = model.module(0).parameters();
  for (size_t r = 1; r < model.num_replicas(); ++r) {
    const auto mine = model.module(r).parameters();
    for (size_t k = 0; k < first.size(); ++k) {
      EXPECT_EQ(mine[k].dtype(), galley::DType::BFloat16);
      EXPECT_EQ(mine[k].to(galley::DType::Float32).to_vector(),
                first[k].to(galley::DType::Float32).to_vector())
          << "replica " << r << " parameter " << k;
    }
  }
}

// Over NCCL: an Inf in the last GPU's share of the batch reaches every replica's gradients
// through the all-reduce, so the scaler skips the step on every GPU (replica 0's gradients hold
// the Inf, not only the last one's), and the next, clean, step keeps the replicas identical.
TEST(CudaDataParallel, GradScalerSkipsTheSameStepOnEveryGpu) {
  const int n = galley::cuda_device_count();
  if (n < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << n;
  amp_test::expect_replicas_skip_together({Device::cuda(0), Device::cuda(1)},
                                          galley::DType::Float16);
}
