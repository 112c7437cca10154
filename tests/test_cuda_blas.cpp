// cuBLAS GEMM and cuDNN convolution against the CPU kernels (the oracle). Compiled always;
// skipped with the reason when there is no GPU (or the build has no CUDA backend).
#include <gtest/gtest.h>

#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"
#ifdef GALLEY_HAVE_CUDA
#include "kernels/cuda/blas.cuh"
#endif

using galley::Device;
using galley::Tensor;

namespace {
#ifdef GALLEY_HAVE_CUDA
const Device gpu = Device::cuda(0);

// Max |a - b| relative to the largest |b| (float32 sums of a few hundred terms).
void expect_close(const Tensor& device_result, const Tensor& cpu_result, const char* what) {
  auto a = device_result.to(Device::cpu()).to_vector(), b = cpu_result.to_vector();
  ASSERT_EQ(a.size(), b.size());
  float scale = 1e-6f, worst = 0;
  for (float v : b) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst, 1e-5f * scale) << what;
}
#endif
}  // namespace

#ifdef GALLEY_HAVE_CUDA
#define REQUIRE_GPU()             \
  if (!galley::cuda::available()) \
  GTEST_SKIP() << "no CUDA device here: the GPU path is compiled but cannot run"
#else
#define REQUIRE_GPU() GTEST_SKIP() << "this build has no CUDA backend"
#endif

TEST(CudaBlas, GemmMatchesTheCpuForEveryTransposition) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t m = 37, n = 53, k = 29;
      Tensor a = galley::randn({ta ? k : m, ta ? m : k}),
             b = galley::randn({tb ? n : k, tb ? k : n});
      Tensor c = galley::randn({m, n});
      Tensor expected = c.clone();
      galley::kernels::cpu::gemm(ta, tb, m, n, k, 0.5f, a.data<float>(), a.size(1), b.data<float>(),
                                 b.size(1), 2.f, expected.data<float>(), n);
      Tensor da = a.to(gpu), db = b.to(gpu), dc = c.to(gpu);
      galley::kernels::cuda::gemm(0, ta, tb, m, n, k, 0.5f, da.data<float>(), a.size(1),
                                  db.data<float>(), b.size(1), 2.f, dc.data<float>(), n, nullptr);
      galley::cuda::synchronize(gpu);
      expect_close(dc, expected, ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"));
    }
#endif
}

TEST(CudaBlas, ConvolutionForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  struct Case {
    int64_t n, c, h, w, o, k, stride, pad, dil, groups;
  };
  for (const Case& cs : {Case{2, 3, 32, 32, 64, 3, 1, 0, 1, 1}, Case{2, 4, 9, 11, 6, 3, 2, 1, 1, 2},
                         Case{1, 2, 10, 10, 3, 3, 1, 2, 2, 1}}) {
    galley::kernels::cpu::Conv2dGeometry g{};
    g.n = cs.n, g.c = cs.c, g.h = cs.h, g.w = cs.w, g.o = cs.o, g.kh = cs.k, g.kw = cs.k;
    g.stride = cs.stride, g.pad = cs.pad, g.dilation = cs.dil, g.groups = cs.groups;
    g.oh = (g.h + 2 * g.pad - g.dilation * (g.kh - 1) - 1) / g.stride + 1;
    g.ow = (g.w + 2 * g.pad - g.dilation * (g.kw - 1) - 1) / g.stride + 1;
    Tensor x = galley::randn({g.n, g.c, g.h, g.w}),
           w = galley::randn({g.o, g.c / g.groups, g.kh, g.kw});
    Tensor b = galley::randn({g.o}), gy = galley::randn({g.n, g.o, g.oh, g.ow});
    Tensor y = Tensor::empty({g.n, g.o, g.oh, g.ow}), gx = Tensor::empty(x.shape()),
           gw = Tensor::empty(w.shape()), gb = Tensor::empty({g.o});
    galley::kernels::cpu::conv2d_forward(g, x.data<float>(), w.data<float>(), b.data<float>(),
                                         y.data<float>());
    galley::kernels::cpu::conv2d_backward(g, x.data<float>(), w.data<float>(), gy.data<float>(),
                                          gx.data<float>(), gw.data<float>(), gb.data<float>());
    Tensor dx = x.to(gpu), dw = w.to(gpu), db = b.to(gpu), dgy = gy.to(gpu);
    Tensor dy = Tensor::empty(y.shape(), galley::DType::Float32, gpu);
    Tensor dgx = Tensor::empty(x.shape(), galley::DType::Float32, gpu);
    Tensor dgw = Tensor::empty(w.shape(), galley::DType::Float32, gpu);
    Tensor dgb = Tensor::empty({g.o}, galley::DType::Float32, gpu);
    std::vector<Tensor> scratch;
    auto ws = [&](size_t bytes) {
      scratch.push_back(Tensor::empty({int64_t((bytes + 3) / 4)}, galley::DType::Float32, gpu));
      return scratch.back().raw_data();
    };
    galley::kernels::cuda::conv2d_forward(0, g, dx.data<float>(), dw.data<float>(),
                                          db.data<float>(), dy.data<float>(), ws, nullptr);
    galley::kernels::cuda::conv2d_backward(0, g, dx.data<float>(), dw.data<float>(),
                                           dgy.data<float>(), dgx.data<float>(), dgw.data<float>(),
                                           dgb.data<float>(), ws, nullptr);
    galley::cuda::synchronize(gpu);
    expect_close(dy, y, "conv forward");
    expect_close(dgx, gx, "conv backward data");
    expect_close(dgw, gw, "conv backward filter");
    expect_close(dgb, gb, "conv backward bias");
  }
#endif
}
