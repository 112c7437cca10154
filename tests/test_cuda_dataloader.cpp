// The DataLoader delivering batches to a GPU: the same batches as on the host, with and without
// page-locked buffers and workers, recycled safely while the consumer's kernels still read the
// previous batch. Compiled always; the GPU tests skip with the reason without a GPU.
#include <gtest/gtest.h>

#include "galley/galley.h"
#include "test_util.h"

using galley::Device;
using galley::Tensor;
using galley::data::DataLoader;

namespace {
galley::data::TensorDataset dataset(int64_t n) {
  Tensor x = galley::randn({n, 3, 8, 8});
  std::vector<int64_t> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = i % 10;
  return galley::data::TensorDataset(x, Tensor::from_vector(y, {n}));
}
}  // namespace

TEST(CudaDataLoader, BatchesOnTheGpuEqualTheHostBatches) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  auto ds = dataset(203);  // a short last batch
  for (bool pin : {false, true})
    for (int workers : {0, 1, 3}) {
      const std::string what =
          "pin_memory=" + std::to_string(pin) + " workers=" + std::to_string(workers);
      DataLoader host(ds, {.batch_size = 16, .shuffle = true, .seed = 3, .num_workers = workers});
      DataLoader dev(ds, {.batch_size = 16,
                          .shuffle = true,
                          .seed = 3,
                          .num_workers = workers,
                          .pin_memory = pin,
                          .device = gpu});
      for (int epoch = 0; epoch < 2; ++epoch) {
        auto h = host.begin();
        size_t n = 0;
        for (auto& [x, y] : dev) {
          ASSERT_EQ(x.device(), gpu) << what;
          // A kernel reading the batch right away sees the copied values.
          Tensor doubled = galley::add(x, x);
          auto want = h->data.to_vector();
          for (float& v : want) v += v;
          EXPECT_EQ(doubled.to_vector(), want) << what << " batch " << n;
          EXPECT_EQ(y.to_vector<int64_t>(), h->label.to_vector<int64_t>()) << what;
          ++h;
          ++n;
        }
        EXPECT_EQ(n, dev.size()) << what;
      }
    }
}

TEST(CudaDataLoader, ABatchKeptByTheConsumerStaysIntact) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  auto ds = dataset(64);
  DataLoader dev(ds, {.batch_size = 8, .num_workers = 2, .pin_memory = true, .device = gpu});
  std::vector<Tensor> kept;
  std::vector<std::vector<float>> values;
  for (auto& [x, y] : dev) {
    kept.push_back(x);
    values.push_back(x.to_vector());
  }
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i].to_vector(), values[i]) << i;
  EXPECT_GT(dev.stats().reallocations, 0u);
}
