// The CUDA runtime: device memory through the caching allocator, copies, fills, the cap.
// Compiled always; the GPU tests skip with the reason when no GPU is present.
#include <gtest/gtest.h>

#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "test_util.h"

using galley::Device;
using galley::Tensor;

#define REQUIRE_GPU()                                                                     \
  if (!galley::cuda::available())                                                         \
  GTEST_SKIP() << "no CUDA device here (galley::cuda_device_count() == 0): the GPU path " \
                  "is compiled but cannot run"

TEST(CudaWithoutGpu, DeviceTensorsAreAClearErrorNotACrash) {
  if (galley::cuda::available()) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(galley::cuda_device_count(), 0);
  EXPECT_EQ(galley::all_devices(), std::vector<Device>{Device::cpu()});
  testutil::expect_contains(
      testutil::error_of([] { galley::zeros({4}, galley::DType::Float32, Device::cuda(0)); }),
      {"cuda:0"});
  testutil::expect_contains(testutil::error_of([] { galley::ones({2}).to(Device::cuda(1)); }),
                            {"cuda:1"});
}

TEST(Cuda, HostToDeviceAndBackIsExact) {
  REQUIRE_GPU();
  Tensor h = galley::randn({3, 5, 7});
  Tensor d = h.to(Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  EXPECT_EQ(d.shape(), h.shape());
  EXPECT_EQ(d.to(Device::cpu()).to_vector(), h.to_vector());
  EXPECT_EQ(d.to_vector(), h.to_vector());  // copy_to_host from the device
}

TEST(Cuda, FillAndItem) {
  REQUIRE_GPU();
  Tensor d = galley::full({1000003}, 2.5f, galley::DType::Float32, Device::cuda(0));
  for (float v : d.to_vector()) ASSERT_EQ(v, 2.5f);
  EXPECT_EQ(galley::full({1}, -3.f, galley::DType::Float32, Device::cuda(0)).item(), -3.f);
}

TEST(Cuda, AllocatorReusesAndCountsDeviceMemory) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  galley::empty_cache(gpu);
  const auto before = galley::memory_stats(gpu);
  { Tensor a = galley::zeros({1 << 20}, galley::DType::Float32, gpu); }
  { Tensor b = galley::zeros({1 << 20}, galley::DType::Float32, gpu); }
  const auto after = galley::memory_stats(gpu);
  EXPECT_EQ(after.device_allocs, before.device_allocs + 1);  // the second reused the first
  EXPECT_GE(after.reuses, before.reuses + 1);
  EXPECT_EQ(after.allocated, before.allocated);
}

TEST(Cuda, GoingOverTheCapIsAnOutOfMemoryError) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  galley::set_memory_limit(gpu, size_t(64) << 20);
  try {
    galley::zeros({int64_t(100) << 20}, galley::DType::Float32, gpu);  // 400 MB
    ADD_FAILURE() << "no error over a 64 MiB cap";
  } catch (const galley::OutOfMemoryError& e) {
    testutil::expect_contains(e.what(), {"cuda:0", "requested", "in use", "cap 64.00 MiB"});
  }
  galley::set_memory_limit(gpu, 0);
}

TEST(Cuda, DeviceNameAndMemory) {
  REQUIRE_GPU();
  EXPECT_FALSE(galley::cuda::device_name(0).empty());
  EXPECT_GT(galley::cuda::total_memory(0), size_t(1) << 30);
  galley::cuda::synchronize(Device::cuda(0));
}
