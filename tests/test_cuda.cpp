// The CUDA runtime: device memory through the caching allocator, copies, fills, the cap.
// Compiled always; the GPU tests skip with the reason when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "test_util.h"

using galley::Device;
using galley::Tensor;

TEST(Cuda, AHostAccessorOnDeviceMemoryIsAClearError) {
  REQUIRE_GPU();
  const galley::Tensor t = galley::ones({4}, galley::DType::Float32, galley::Device::cuda(0));
  testutil::expect_contains(testutil::error_of([&] { t.data<float>(); }),
                            {"data<float32>", "cuda:0", ".to(Device::cpu())"});
  EXPECT_NE(t.data_ptr<float>(), nullptr);  // the device pointer, for kernels
  EXPECT_EQ(t.to(galley::Device::cpu()).data<float>()[3], 1.f);
}

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

TEST(PinnedMemory, PinnedHostTensorsHoldTheirValuesWithOrWithoutAGpu) {
  Tensor h = galley::randn({4, 33});
  Tensor p = h.pin_memory();
  // Page-locked only where a CUDA device exists; an ordinary host copy otherwise.
  EXPECT_EQ(p.is_pinned(), galley::cuda::available());
  EXPECT_EQ(p.device(), Device::cpu());
  EXPECT_EQ(p.to_vector(), h.to_vector());
  EXPECT_TRUE(p.pin_memory().is_same(p) || !p.is_pinned());
  Tensor e = Tensor::empty_pinned({0});
  EXPECT_EQ(e.numel(), 0);
  testutil::expect_contains(testutil::error_of([] {
                              Tensor::empty_pinned({2, -1});
                            }),
                            {"empty_pinned", "negative"});
}

TEST(Cuda, PinnedCopiesRoundTrip) {
  REQUIRE_GPU();
  Tensor h = galley::randn({1 << 20}).pin_memory();
  ASSERT_TRUE(h.is_pinned());
  Tensor d = h.to(Device::cuda(0));
  Tensor back = Tensor::empty_pinned({1 << 20});
  d.copy_to_host(back.raw_data());
  EXPECT_EQ(back.to_vector(), h.to_vector());
}

TEST(Cuda, CopiesWithinTheGpuStayInStreamOrder) {
  REQUIRE_GPU();
  // A device-to-device copy no longer waits for the device: what follows it on the compute
  // stream must still see the copied values.
  Tensor a = galley::randn({1 << 18}).to(Device::cuda(0));
  Tensor b = a.clone();
  Tensor c = galley::add(b, b);
  std::vector<float> want = a.to_vector();
  for (float& v : want) v += v;
  EXPECT_EQ(c.to_vector(), want);
}

TEST(Cuda, ABadLabelIsReportedAtTheNextSynchronisation) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor logits = galley::randn({4, 10}).to(gpu);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, 12, 3, 4}, {4}, gpu);
  // The step itself does not wait for the check...
  Tensor loss;
  EXPECT_NO_THROW(loss = galley::cross_entropy(logits, labels));
  // ...the first read-back raises it, naming the row and the label.
  testutil::expect_contains(testutil::error_of([&] { (void)loss.item(); }),
                            {"cross_entropy", "cuda:0", "label 12", "row 1", "[0, 10)"});
  // Reported once; good labels work afterwards.
  Tensor ok = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}, gpu);
  EXPECT_TRUE(std::isfinite(galley::cross_entropy(logits, ok).item()));
}

TEST(Cuda, MeanCrossEntropyCountsRowsOnTheDevice) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor logits = galley::randn({6, 5});
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{1, -100, 3, -100, 4, 0}, {6});
  for (bool all_ignored : {false, true}) {
    Tensor y = all_ignored ? galley::full({6}, -100.f).to(galley::DType::Int64) : labels;
    Tensor xc = logits.clone().set_requires_grad(), xg = logits.to(gpu).set_requires_grad();
    Tensor lc = galley::cross_entropy(xc, y), lg = galley::cross_entropy(xg, y.to(gpu));
    lc.backward();
    lg.backward();
    EXPECT_NEAR(lg.item(), lc.item(), 1e-5);
    const auto gc = xc.grad().to_vector(), gg = xg.grad().to_vector();
    for (size_t i = 0; i < gc.size(); ++i) EXPECT_NEAR(gg[i], gc[i], 1e-6) << i;
  }
}

TEST(Cuda, FillWorksForEveryDType) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  EXPECT_EQ(galley::full({1001}, 7.f, galley::DType::Int64, gpu).to_vector<int64_t>(),
            std::vector<int64_t>(1001, 7));
  EXPECT_EQ(galley::full({1001}, -1.f, galley::DType::Int64, gpu).to_vector<int64_t>(),
            std::vector<int64_t>(1001, -1));
  EXPECT_EQ(galley::full({13}, 200.f, galley::DType::UInt8, gpu).to_vector<uint8_t>(),
            std::vector<uint8_t>(13, 200));
  Tensor h = galley::full({7}, 1.5f, galley::DType::Float16, gpu).to(Device::cpu());
  EXPECT_EQ(h.to(galley::DType::Float32).to_vector(), std::vector<float>(7, 1.5f));
}

TEST(Cuda, AHostBufferMayChangeRightAfterItsCopyToTheGpu) {
  REQUIRE_GPU();
  // A copy from pageable memory returns once CUDA has staged the data, without waiting for the
  // GPU: the buffer is the caller's again at once.
  std::vector<float> host(1 << 20, 1.f);
  Tensor d = Tensor::empty({1 << 20}, galley::DType::Float32, Device::cuda(0));
  d.copy_from_host(host.data());
  std::fill(host.begin(), host.end(), 2.f);
  for (float v : d.to_vector()) ASSERT_EQ(v, 1.f);
}

// copy_ goes by the (source, destination) device pair: host to GPU (pageable and page-locked),
// GPU to host, within a GPU and between GPUs, each in stream order.
TEST(Cuda, CopyIntoATensorWorksForEveryDevicePair) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Tensor h = galley::randn({257, 33});
  Tensor d = galley::zeros({257, 33}, galley::DType::Float32, gpu);
  d.copy_(h);  // pageable host -> GPU
  EXPECT_EQ(d.to_vector(), h.to_vector());
  Tensor pinned = galley::randn({257, 33}).pin_memory();
  d.copy_(pinned);  // page-locked host -> GPU
  EXPECT_EQ(d.to_vector(), pinned.to_vector());
  Tensor d2 = galley::zeros({257, 33}, galley::DType::Float32, gpu);
  d2.copy_(d);  // within the GPU
  Tensor back = galley::zeros({257, 33});
  back.copy_(d2);  // GPU -> host
  EXPECT_EQ(back.to_vector(), pinned.to_vector());
  EXPECT_THROW(d.copy_(galley::zeros({33, 257})), galley::Error);
  if (galley::cuda_device_count() > 1) {
    Tensor other = galley::zeros({257, 33}, galley::DType::Float32, Device::cuda(1));
    other.copy_(d);  // between GPUs
    EXPECT_EQ(other.to_vector(), pinned.to_vector());
  }
}

// A page-locked source is staged: the caller may overwrite it as soon as copy_ returns, even
// while the GPU is still busy with earlier work.
TEST(Cuda, APinnedSourceMayChangeRightAfterItsCopy) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor busy = galley::randn({2048, 2048}).to(gpu);
  Tensor pinned = galley::full({1 << 22}, 1.f).pin_memory();
  Tensor d = galley::zeros({1 << 22}, galley::DType::Float32, gpu);
  for (int i = 0; i < 4; ++i) busy = galley::matmul(busy, busy);  // keep the GPU's queue long
  d.copy_(pinned);
  pinned.fill_(2.f);
  for (float v : d.to_vector()) ASSERT_EQ(v, 1.f);
}

// A model already on the GPU loads a host state dict in place (resume on a GPU), and so do an
// optimizer's moments.
TEST(Cuda, LoadingHostStateIntoAModelAndOptimizerOnTheGpu) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  galley::nn::Linear cpu_model(5, 3);
  galley::nn::Linear gpu_model(5, 3);
  gpu_model.to(gpu);
  gpu_model.load_state_dict(cpu_model.state_dict());
  EXPECT_EQ(gpu_model.weight().device(), gpu);
  EXPECT_EQ(gpu_model.weight().to_vector(), cpu_model.weight().to_vector());

  galley::optim::Adam cpu_opt(cpu_model.parameters(), {.learning_rate = 1e-2});
  Tensor x = galley::randn({8, 5});
  galley::sum(cpu_model(x)).backward();
  cpu_opt.step();
  galley::optim::Adam gpu_opt(gpu_model.parameters(), {.learning_rate = 1e-2});
  gpu_model.load_state_dict(cpu_model.state_dict());
  gpu_opt.load_state_dict(cpu_opt.state_dict());
  cpu_opt.clear_grad();
  gpu_opt.clear_grad();
  galley::sum(cpu_model(x)).backward();
  galley::sum(gpu_model(x.to(gpu))).backward();
  cpu_opt.step();
  gpu_opt.step();
  const auto want = cpu_model.weight().to_vector(), got = gpu_model.weight().to_vector();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
}

// Running out of the capped memory inside a layer is still an OutOfMemoryError, with the layer
// named: what lets a job sharing a GPU catch it and back off.
TEST(Cuda, OutOfMemoryInsideALayerStaysAnOutOfMemoryError) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  galley::nn::Conv2D conv(3, 64, 3);
  conv.to(gpu);
  Tensor x = galley::randn({64, 3, 64, 64}).to(gpu);
  galley::set_memory_limit(gpu, galley::memory_stats(gpu).reserved + (size_t(8) << 20));
  try {
    (void)conv(x);
    ADD_FAILURE() << "a 63 MiB output fitted in 8 MiB";
  } catch (const galley::OutOfMemoryError& e) {
    testutil::expect_contains(e.what(), {"Conv2D(3, 64", "out of memory on cuda:0"});
  }
  galley::set_memory_limit(gpu, 0);
}

// 16-bit parameters on a GPU: the multi-tensor kernels compute what the CPU kernels compute (in
// float32, with float32 state) and round the parameter once; either compiler may fuse a
// multiply-add, so the bits may differ by one unit in the parameter's last place.
TEST(Cuda, SixteenBitOptimizersMatchTheCpu) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  using galley::DType;
  using Make = std::function<std::unique_ptr<galley::optim::Optimizer>(std::vector<Tensor>)>;
  const std::vector<std::pair<std::string, Make>> cases = {
      {"SGD nesterov",
       [](std::vector<Tensor> p) {
         return std::make_unique<galley::optim::SGD>(
             p,
             galley::optim::SGDOptions{
                 .learning_rate = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
       }},
      {"Adam amsgrad",
       [](std::vector<Tensor> p) {
         return std::make_unique<galley::optim::Adam>(
             p, galley::optim::AdamOptions{.learning_rate = 1e-2, .amsgrad = true});
       }},
      {"AdamW", [](std::vector<Tensor> p) {
         return std::make_unique<galley::optim::AdamW>(
             p, galley::optim::AdamOptions{.learning_rate = 1e-2, .weight_decay = 1e-2});
       }}};
  for (DType dtype : {DType::BFloat16, DType::Float16})
    for (auto& [name, make] : cases) {
      const double ulp = dtype == DType::BFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
      // Sizes across the kernels' chunks, with a float32 parameter mixed in.
      std::vector<Tensor> host, dev;
      for (int64_t n : {int64_t(20011), int64_t(3), int64_t(8192)}) {
        Tensor h = galley::randn({n}).to(n == 3 ? DType::Float32 : dtype);
        Tensor d = h.to(gpu);
        h.set_requires_grad(true);
        d.set_requires_grad(true);
        host.push_back(h);
        dev.push_back(d);
      }
      auto ho = make(host), dg = make(dev);
      for (int step = 0; step < 3; ++step) {
        for (size_t k = 0; k < host.size(); ++k) {
          Tensor g = galley::randn(host[k].shape()).to(host[k].dtype());
          host[k].set_grad(g);
          dev[k].set_grad(g.to(gpu));
        }
        ho->step();
        dg->step();
      }
      for (size_t k = 0; k < host.size(); ++k) {
        EXPECT_EQ(dev[k].dtype(), host[k].dtype());
        const auto want = host[k].to(DType::Float32).to_vector();
        const auto got = dev[k].to(DType::Float32).to_vector();
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 3 * ulp * std::max(1.f, std::fabs(want[i])))
              << name << " " << galley::dtype_name(dtype) << " tensor " << k << " element " << i;
      }
    }
}

TEST(Cuda, SixteenBitClippingAndTheNonFiniteCheckMatchTheCpu) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  using galley::DType;
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    std::vector<Tensor> host, dev;
    for (int64_t n : {int64_t(20011), int64_t(5), int64_t(8192)}) {
      Tensor h = galley::zeros({n}, n == 5 ? DType::Float32 : dtype);
      Tensor d = h.to(gpu);
      h.set_requires_grad(true);
      d.set_requires_grad(true);
      Tensor g = galley::randn({n}).to(h.dtype());
      h.set_grad(g);
      d.set_grad(g.to(gpu));
      host.push_back(h);
      dev.push_back(d);
    }
    const float want = galley::nn::clip_grad_norm_(host, 1.0);
    const float got = galley::nn::clip_grad_norm_(dev, 1.0);
    EXPECT_NEAR(got, want, 1e-5 * want) << galley::dtype_name(dtype);
    for (size_t k = 0; k < host.size(); ++k) {
      EXPECT_EQ(dev[k].grad().dtype(), host[k].grad().dtype());
      if (got == want)
        EXPECT_EQ(dev[k].grad().to(DType::Float32).to_vector(),
                  host[k].grad().to(DType::Float32).to_vector());
    }
    // A non-finite 16-bit gradient on the GPU is found and named.
    auto v = dev[0].grad().to(DType::Float32).to_vector();
    v[12345] = std::numeric_limits<float>::infinity();
    dev[0].set_grad(Tensor::from_vector(v, {20011}).to(dtype).to(gpu));
    testutil::expect_contains(testutil::error_of([&] { galley::nn::clip_grad_norm_(dev, 1.0); }),
                              {"is inf", "number 0"});
  }
}

TEST(Cuda, AnOptimizerRefusesAGradientOnAnotherDevice) {
  REQUIRE_GPU();
  Tensor p = galley::ones({3}).to(Device::cuda(0));
  p.set_requires_grad(true);
  testutil::expect_contains(testutil::error_of([&] { p.set_grad(galley::ones({3})); }),
                            {"set_grad", "cpu", "cuda:0"});
  testutil::expect_contains(testutil::error_of([&] { (p * 2.f).backward(galley::ones({3})); }),
                            {"backward", "cpu", "cuda:0"});
  testutil::force_grad(p, galley::ones({3}));  // on the host, however it came there
  galley::optim::SGD opt({p}, {.learning_rate = 0.1});
  testutil::expect_contains(testutil::error_of([&] { opt.step(); }),
                            {"parameter 0", "cpu", "cuda:0", "same device"});
  EXPECT_EQ(p.to(Device::cpu()).to_vector(), std::vector<float>(3, 1.f));
}
