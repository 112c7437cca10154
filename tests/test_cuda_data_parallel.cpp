// DataParallel on GPUs: one GPU trains like the CPU, several GPUs (NCCL) like one GPU on the
// whole batch. Compiled always; the GPU tests skip with the reason when the GPUs are missing.
#include <gtest/gtest.h>

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
