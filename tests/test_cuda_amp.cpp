// Automatic mixed precision on the GPU against the CPU: autocast's ops in both low-precision
// dtypes, and the loss scaler's verdict and step. Each test skips itself without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "amp_test_util.h"
#include "galley/galley.h"
#include "test_util.h"

namespace amp = galley::amp;
using amp_test::expect_near;
using amp_test::param;
using galley::Device;
using galley::DType;
using galley::Tensor;

TEST(AutocastGpu, OpsMatchTheCpu) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = galley::randn({2, 3, 8, 8}), w = param({4, 3, 3, 3}, 21), b = param({4}, 22);
  Tensor a = galley::randn({6, 5}), lw = param({3, 5}, 23), lb = param({3}, 24);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 2, 1, 0, 2, 1}, {6});
  for (DType low : {DType::BFloat16, DType::Float16}) {
    const std::string d = galley::dtype_name(low);
    Tensor c_cpu, c_gpu, l_cpu, l_gpu, e_cpu, e_gpu;
    {
      amp::Autocast autocast(low);
      c_cpu = galley::conv2d(x, w, b, {.padding = 1});
      c_gpu = galley::conv2d(x.to(gpu), w.to(gpu), b.to(gpu), {.padding = 1});
      l_cpu = galley::linear(a, lw, lb);
      l_gpu = galley::linear(a.to(gpu), lw.to(gpu), lb.to(gpu));
      e_cpu = galley::cross_entropy(l_cpu, labels);
      e_gpu = galley::cross_entropy(l_gpu, labels.to(gpu));
    }
    EXPECT_EQ(c_gpu.dtype(), low) << d;
    EXPECT_EQ(e_gpu.dtype(), DType::Float32) << d;
    expect_near(c_gpu.to(Device::cpu()), c_cpu, 1e-2f, d + " conv2d");
    expect_near(l_gpu.to(Device::cpu()), l_cpu, 1e-2f, d + " linear");
    expect_near(e_gpu.to(Device::cpu()), e_cpu, 1e-2f, d + " cross_entropy");
  }
}

TEST(GradScalerGpu, SkipsAndStepsLikeTheCpu) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (bool poison : {true, false}) {
    Tensor w_cpu = param({3, 4}, 31), w_gpu = w_cpu.detach().to(gpu).set_requires_grad();
    std::vector<float> xv = galley::randn({5, 4}).to_vector();
    if (poison) xv[7] = INFINITY;
    Tensor x = Tensor::from_vector(xv, {5, 4});
    std::vector<float> after[2];
    bool stepped[2];
    for (int k = 0; k < 2; ++k) {
      Tensor w = k ? w_gpu : w_cpu;
      galley::optim::SGD opt({w}, {.learning_rate = 0.1});
      amp::GradScaler scaler;
      Tensor loss = galley::sum(galley::matmul(k ? x.to(gpu) : x, galley::transpose(w, 0, 1)));
      scaler.scale(loss).backward();
      stepped[k] = scaler.step(opt);
      scaler.update();
      after[k] = w.to(Device::cpu()).to_vector();
    }
    EXPECT_EQ(stepped[0], !poison);
    EXPECT_EQ(stepped[1], stepped[0]) << "the GPU's verdict differs from the CPU's";
    for (size_t i = 0; i < after[0].size(); ++i) EXPECT_NEAR(after[1][i], after[0][i], 1e-5f);
  }
}
