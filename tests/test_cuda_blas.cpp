// cuBLAS GEMM and cuDNN convolution against the CPU kernels (the oracle), with the algorithms
// cuDNN really picks: the fastest, those a memory cap or a failing allocator leaves, the
// deterministic ones, and from several threads at once. Compiled always; skipped with the
// reason when there is no GPU (or the build has no CUDA backend).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "galley/runtime/memory.h"
#include "kernels/conv2d.h"
#include "kernels/gemm.h"
#ifdef GALLEY_HAVE_CUDA
#include "src/ops/conv2d.h"
#include "src/runtime/device_memory.h"
#endif

using galley::Device;
using galley::Tensor;
using galley::kernels::Conv2dGeometry;

namespace {

// Restores a process-wide switch when a test ends, whatever way it ends.
class Tf32Setting {
 public:
  explicit Tf32Setting(bool on) : prev_(galley::cuda::allow_tf32()) {
    galley::cuda::set_allow_tf32(on);
  }
  ~Tf32Setting() { galley::cuda::set_allow_tf32(prev_); }

 private:
  bool prev_;
};

class DeterministicSetting {
 public:
  explicit DeterministicSetting(bool on) : prev_(galley::cuda::deterministic()) {
    galley::cuda::set_deterministic(on);
  }
  ~DeterministicSetting() { galley::cuda::set_deterministic(prev_); }

 private:
  bool prev_;
};

#ifdef GALLEY_HAVE_CUDA
namespace kcuda = galley::kernels::cuda;
const Device gpu = Device::cuda(0);

// float32 sums of a few hundred terms agree with the CPU to about 1e-6 of the largest value;
// cuDNN's Winograd and FFT algorithms transform their operands and lose more (about 1e-5).
constexpr float kGemmTolerance = 1e-5f;
constexpr float kConvTolerance = 1e-4f;

// Max |a - b| relative to the largest |b|.
void expect_close(const Tensor& device_result, const Tensor& cpu_result, float tolerance,
                  const std::string& what) {
  auto a = device_result.to(Device::cpu()).to_vector(), b = cpu_result.to_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  float scale = 1e-6f, worst = 0;
  for (float v : b) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst, tolerance * scale)
      << what << ": worst error " << worst << " of largest " << scale;
}

galley::kernels::Conv2dGeometry geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                                         int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                                         int64_t groups) {
  galley::kernels::Conv2dGeometry g{};
  g.n = n, g.c = c, g.h = h, g.w = w, g.o = o, g.kh = k, g.kw = k;
  g.stride = stride, g.pad = pad, g.dilation = dilation, g.groups = groups;
  g.oh = (g.h + 2 * g.pad - g.dilation * (g.kh - 1) - 1) / g.stride + 1;
  g.ow = (g.w + 2 * g.pad - g.dilation * (g.kw - 1) - 1) / g.stride + 1;
  return g;
}

std::string str(const galley::kernels::Conv2dGeometry& g) {
  return galley::detail::str_cat(g.n, "x", g.c, "x", g.h, "x", g.w, " conv ", g.o, "x",
                                 g.c / g.groups, "x", g.kh, "x", g.kw, " stride ", g.stride,
                                 " pad ", g.pad, " dilation ", g.dilation, " groups ", g.groups);
}

// A convolution's inputs and its CPU results, and the same on the GPU with room for its
// results there.
struct ConvCase {
  galley::kernels::Conv2dGeometry g;
  Tensor x, w, b, gy;    // host inputs
  Tensor y, gx, gw, gb;  // CPU results
  Tensor dx, dw, db, dgy;
  Tensor dy, dgx, dgw, dgb;

  explicit ConvCase(const galley::kernels::Conv2dGeometry& geo) : g(geo) {
    x = galley::randn({g.n, g.c, g.h, g.w});
    w = galley::randn({g.o, g.c / g.groups, g.kh, g.kw});
    b = galley::randn({g.o});
    gy = galley::randn({g.n, g.o, g.oh, g.ow});
    y = Tensor::empty({g.n, g.o, g.oh, g.ow});
    gx = Tensor::empty(x.shape()), gw = Tensor::empty(w.shape()), gb = Tensor::empty({g.o});
    galley::kernels::cpu::conv2d_forward(g, x.data_ptr<float>(), w.data_ptr<float>(),
                                         b.data_ptr<float>(), y.data_ptr<float>());
    galley::kernels::cpu::conv2d_backward(g, x.data_ptr<float>(), w.data_ptr<float>(),
                                          gy.data_ptr<float>(), gx.data_ptr<float>(),
                                          gw.data_ptr<float>(), gb.data_ptr<float>());
    dx = x.to(gpu), dw = w.to(gpu), db = b.to(gpu), dgy = gy.to(gpu);
    dy = Tensor::empty(y.shape(), galley::DType::Float32, gpu);
    dgx = Tensor::empty(x.shape(), galley::DType::Float32, gpu);
    dgw = Tensor::empty(w.shape(), galley::DType::Float32, gpu);
    dgb = Tensor::empty({g.o}, galley::DType::Float32, gpu);
  }

  void run(const galley::kernels::Workspace& ws, void* stream) {
    const galley::DType f32 = galley::DType::Float32;
    kcuda::conv2d_forward(0, g, f32, dx.data_ptr<float>(), dw.data_ptr<float>(),
                          db.data_ptr<float>(), dy.data_ptr<float>(), ws, stream);
    kcuda::conv2d_backward(0, g, f32, dx.data_ptr<float>(), dw.data_ptr<float>(),
                           dgy.data_ptr<float>(), dgx.data_ptr<float>(), dgw.data_ptr<float>(),
                           dgb.data_ptr<float>(), ws, stream);
  }

  // After the device has finished.
  void expect_matches(const std::string& what) {
    expect_close(dy, y, kConvTolerance, what + ": forward");
    expect_close(dgx, gx, kConvTolerance, what + ": backward data");
    expect_close(dgw, gw, kConvTolerance, what + ": backward filter");
    expect_close(dgb, gb, kConvTolerance, what + ": backward bias");
  }
};

// galley::kernels::Workspace from the caching allocator, as the op layer supplies it; the blocks
// are kept until the test has waited for the stream that uses them.
struct TestScratch {
  std::vector<Tensor> blocks;
  int requests = 0;
  galley::kernels::Workspace workspace(size_t limit = size_t(1) << 30) {
    galley::kernels::Workspace ws;
    ws.limit = limit;
    ws.allocate = [this](size_t bytes) {
      ++requests;
      blocks.push_back(Tensor::empty({int64_t((bytes + 3) / 4)}, galley::DType::Float32, gpu));
      return blocks.back().raw_data();
    };
    return ws;
  }
};

void* compute_stream() {
  return galley::detail::compute_stream(gpu);
}
#endif
}  // namespace

#ifndef GALLEY_HAVE_CUDA
#define REQUIRE_GPU() GTEST_SKIP() << "this build has no CUDA backend"
#else
#define REQUIRE_GPU()             \
  if (!galley::cuda::available()) \
  GTEST_SKIP() << "no CUDA device here: the GPU path is compiled but cannot run"
#endif

TEST(CudaBlas, DeterministicSwitchReadsBack) {
  {
    DeterministicSetting on(true);
    EXPECT_TRUE(galley::cuda::deterministic());
    galley::cuda::set_deterministic(false);
    EXPECT_FALSE(galley::cuda::deterministic());
  }
  EXPECT_FALSE(galley::cuda::deterministic());  // the default, restored
}

// cuBLAS takes int sizes: a product past them is an error before anything is queued (the casts
// wrapped: 2^32 + 5 rows computed 5). Needs the backend, not a device (nothing runs).
TEST(CudaBlas, SizesPastCublasIntsAreErrors) {
#ifndef GALLEY_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  namespace gk = galley::kernels::cuda;
  const int64_t big = (int64_t(1) << 32) + 5;
  for (auto call : std::vector<std::function<void()> >{
           [&] {
             gk::gemm(0, false, false, big, 4, 4, 1.f, nullptr, 4, nullptr, 4, 0.f, nullptr, 4,
                      nullptr);
           },
           [&] {
             gk::gemm(0, true, false, 4, 4, big, 1.f, nullptr, 4, nullptr, 4, 0.f, nullptr, 4,
                      nullptr);
           },
           [&] {
             gk::gemm_16bit(0, galley::DType::BFloat16, false, false, 4, big, 4, nullptr, big,
                            nullptr, big, false, nullptr, big, nullptr);
           }}) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const galley::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("matrix product"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(big)), std::string::npos) << msg;
    }
  }
#endif
}

TEST(CudaBlas, GemmMatchesTheCpuForEveryTransposition) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  Tf32Setting exact(false);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t m = 37, n = 53, k = 29;
      Tensor a = galley::randn({ta ? k : m, ta ? m : k}),
             b = galley::randn({tb ? n : k, tb ? k : n});
      Tensor c = galley::randn({m, n});
      Tensor expected = c.clone();
      galley::kernels::cpu::gemm(ta, tb, m, n, k, 0.5f, a.data_ptr<float>(), a.size(1),
                                 b.data_ptr<float>(), b.size(1), 2.f, expected.data_ptr<float>(),
                                 n);
      Tensor da = a.to(gpu), db = b.to(gpu), dc = c.to(gpu);
      kcuda::gemm(0, ta, tb, m, n, k, 0.5f, da.data_ptr<float>(), a.size(1), db.data_ptr<float>(),
                  b.size(1), 2.f, dc.data_ptr<float>(), n, compute_stream());
      galley::cuda::synchronize(gpu);
      expect_close(dc, expected, kGemmTolerance,
                   ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"));
    }
#endif
}

// bfloat16 and float16 operands on tensor cores, float32 sums: on small integers every product
// and sum is exact in both, so the result must equal the float32 GEMM's bit for bit, for every
// transposition, with and without accumulating into C.
TEST(CudaBlas, Gemm16BitMatchesTheFloat32GemmOnExactValues) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  Tf32Setting exact(false);
  auto small_integers = [](galley::Shape shape, int seed) {  // -4 .. 4
    std::vector<float> v(size_t(shape[0] * shape[1]));
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(int((i * 7 + size_t(seed) * 13) % 9) - 4);
    return Tensor::from_vector(v, shape);
  };
  for (galley::DType dtype : {galley::DType::BFloat16, galley::DType::Float16})
    for (bool accumulate : {false, true})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int64_t m = 37, n = 53, k = 70;
          Tensor a = small_integers({ta ? k : m, ta ? m : k}, 1),
                 b = small_integers({tb ? n : k, tb ? k : n}, 2), c = small_integers({m, n}, 3);
          Tensor expected = c.clone();
          galley::kernels::cpu::gemm(ta, tb, m, n, k, 1.f, a.data_ptr<float>(), a.size(1),
                                     b.data_ptr<float>(), b.size(1), accumulate ? 1.f : 0.f,
                                     expected.data_ptr<float>(), n);
          Tensor da = a.to(dtype).to(gpu), db = b.to(dtype).to(gpu), dc = c.to(gpu);
          kcuda::gemm_16bit(0, dtype, ta, tb, m, n, k, da.raw_data(), a.size(1), db.raw_data(),
                            b.size(1), accumulate, dc.data_ptr<float>(), n, compute_stream());
          galley::cuda::synchronize(gpu);
          const std::string what =
              galley::detail::str_cat(galley::dtype_name(dtype), " gemm ", ta ? "T" : "N",
                                      tb ? "T" : "N", accumulate ? " accumulating" : "");
          EXPECT_EQ(dc.to(Device::cpu()).to_vector(), expected.to_vector()) << what;
        }
#endif
}

// 16-bit convolutions, every operand in the dtype, against the CPU's float32 kernels on the same
// (rounded) values: the GPU's result is rounded once from float32 sums, so it is within half an
// ulp of the dtype of the float32 result, plus the sums' own differences.
TEST(CudaBlas, Convolution16BitMatchesTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  const std::vector<galley::kernels::Conv2dGeometry> shapes = {
      geometry(2, 3, 32, 32, 64, 3, 1, 0, 1, 1), geometry(8, 32, 28, 28, 32, 3, 1, 1, 1, 1),
      geometry(4, 64, 14, 14, 128, 1, 1, 0, 1, 1), geometry(2, 16, 15, 15, 16, 3, 1, 1, 1, 16),
      geometry(2, 4, 9, 11, 6, 3, 2, 1, 1, 2)};
  for (galley::DType dtype : {galley::DType::BFloat16, galley::DType::Float16}) {
    const float tolerance = dtype == galley::DType::BFloat16 ? 1.6e-2f : 2e-3f;
    for (const galley::kernels::Conv2dGeometry& g : shapes) {
      auto rounded = [dtype](Tensor t) { return t.to(dtype).to(galley::DType::Float32); };
      Tensor x = rounded(galley::randn({g.n, g.c, g.h, g.w})),
             w = rounded(galley::randn({g.o, g.c / g.groups, g.kh, g.kw})),
             gy = rounded(galley::randn({g.n, g.o, g.oh, g.ow}));
      Tensor y = Tensor::empty(gy.shape()), gx = Tensor::empty(x.shape()),
             gw = Tensor::empty(w.shape());
      galley::kernels::cpu::conv2d_forward(g, x.data_ptr<float>(), w.data_ptr<float>(), nullptr,
                                           y.data_ptr<float>());
      galley::kernels::cpu::conv2d_backward(g, x.data_ptr<float>(), w.data_ptr<float>(),
                                            gy.data_ptr<float>(), gx.data_ptr<float>(),
                                            gw.data_ptr<float>(), nullptr);
      Tensor dx = x.to(dtype).to(gpu), dw = w.to(dtype).to(gpu), dgy = gy.to(dtype).to(gpu);
      Tensor dy = Tensor::empty(y.shape(), dtype, gpu), dgx = Tensor::empty(x.shape(), dtype, gpu),
             dgw = Tensor::empty(w.shape(), dtype, gpu);
      TestScratch scratch;
      kcuda::conv2d_forward(0, g, dtype, dx.raw_data(), dw.raw_data(), nullptr, dy.raw_data(),
                            scratch.workspace(), compute_stream());
      kcuda::conv2d_backward(0, g, dtype, dx.raw_data(), dw.raw_data(), dgy.raw_data(),
                             dgx.raw_data(), dgw.raw_data(), nullptr, scratch.workspace(),
                             compute_stream());
      galley::cuda::synchronize(gpu);
      const std::string what = galley::dtype_name(dtype) + " " + str(g) + ", " +
                               kcuda::conv2d_algorithms(0, g, dtype, size_t(1) << 30);
      std::cout << what << "\n";
      auto wide = [](const Tensor& t) { return t.to(Device::cpu()).to(galley::DType::Float32); };
      expect_close(wide(dy), y, tolerance, what + ": forward");
      expect_close(wide(dgx), gx, tolerance, what + ": backward data");
      expect_close(wide(dgw), gw, tolerance, what + ": backward filter");
    }
  }
#endif
}

// A bias is cuDNN's to add in float32 only; a 16-bit one is the op layer's, and asking the
// launcher for one is an error that says so, not a silent misread of the bias's bytes.
TEST(CudaBlas, Convolution16BitRefusesABias) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  const galley::kernels::Conv2dGeometry g = geometry(1, 2, 5, 5, 3, 3, 1, 1, 1, 1);
  Tensor x = Tensor::empty({1, 2, 5, 5}, galley::DType::BFloat16, gpu),
         w = Tensor::empty({3, 2, 3, 3}, galley::DType::BFloat16, gpu),
         b = Tensor::empty({3}, galley::DType::Float32, gpu),
         y = Tensor::empty({1, 3, 5, 5}, galley::DType::BFloat16, gpu);
  TestScratch scratch;
  try {
    kcuda::conv2d_forward(0, g, galley::DType::BFloat16, x.raw_data(), w.raw_data(),
                          b.data_ptr<float>(), y.raw_data(), scratch.workspace(), compute_stream());
    FAIL() << "a bfloat16 convolution took a bias";
  } catch (const galley::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias"), std::string::npos) << e.what();
  }
#endif
}

// The shapes cover what makes cuDNN choose differently: 3x3 stride 1 with many channels
// (Winograd), 5x5 and 7x7 (FFT), 1x1 (a plain GEMM), strides, dilation, groups, depthwise, even
// and non-square kernels and images.
TEST(CudaBlas, ConvolutionForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  Tf32Setting exact(false);
  const std::vector<galley::kernels::Conv2dGeometry> shapes = {
      geometry(2, 3, 32, 32, 64, 3, 1, 0, 1, 1),   geometry(2, 4, 9, 11, 6, 3, 2, 1, 1, 2),
      geometry(1, 2, 10, 10, 3, 3, 1, 2, 2, 1),    geometry(8, 32, 28, 28, 32, 3, 1, 1, 1, 1),
      geometry(4, 16, 32, 32, 16, 5, 1, 2, 1, 1),  geometry(4, 8, 24, 24, 8, 7, 1, 3, 1, 1),
      geometry(4, 64, 14, 14, 128, 1, 1, 0, 1, 1), geometry(2, 16, 15, 15, 16, 3, 1, 1, 1, 16),
      geometry(3, 5, 17, 13, 7, 4, 3, 0, 1, 1)};
  for (bool det : {false, true}) {
    DeterministicSetting setting(det);
    for (const galley::kernels::Conv2dGeometry& g : shapes) {
      ConvCase cs(g);
      TestScratch scratch;
      cs.run(scratch.workspace(), compute_stream());
      galley::cuda::synchronize(gpu);
      const std::string what =
          str(g) + (det ? " (deterministic), " : ", ") +
          kcuda::conv2d_algorithms(0, g, galley::DType::Float32, size_t(1) << 30);
      std::cout << what << "\n";
      cs.expect_matches(what);
    }
  }
#endif
}

// With no workspace at all, and with an allocator that refuses every request, the convolution
// still runs, on algorithms that need no workspace.
TEST(CudaBlas, ConvolutionFallsBackWhenWorkspaceIsShort) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  Tf32Setting exact(false);
  const galley::kernels::Conv2dGeometry g = geometry(8, 32, 32, 32, 32, 5, 1, 2, 1, 1);
  std::cout << "fastest: "
            << kcuda::conv2d_algorithms(0, g, galley::DType::Float32, size_t(1) << 30) << "\n"
            << "without workspace: " << kcuda::conv2d_algorithms(0, g, galley::DType::Float32, 0)
            << "\n";
  {
    ConvCase cs(g);
    galley::kernels::Workspace none;  // limit 0, nothing to allocate with
    cs.run(none, compute_stream());
    galley::cuda::synchronize(gpu);
    cs.expect_matches(str(g) + " without workspace");
  }
  {
    ConvCase cs(g);
    int refused = 0;
    galley::kernels::Workspace failing;
    failing.limit = size_t(1) << 30;
    failing.allocate = [&](size_t bytes) -> void* {
      ++refused;
      throw galley::OutOfMemoryError(galley::detail::str_cat("test: no room for ", bytes));
    };
    cs.run(failing, compute_stream());
    galley::cuda::synchronize(gpu);
    cs.expect_matches(str(g) + " with every allocation refused");
    std::cout << "allocations refused: " << refused << "\n";
  }
#endif
}

// Through the op layer, whose workspace limit comes from the cap: capped at what is reserved
// now, the workspace must fit in the cached free space or fall back to none.
TEST(CudaBlas, ConvolutionRunsUnderATightMemoryCap) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  Tf32Setting exact(false);
  const galley::kernels::Conv2dGeometry g = geometry(16, 32, 32, 32, 32, 5, 1, 2, 1, 1);
  ConvCase cs(g);
  galley::cuda::synchronize(gpu);
  galley::empty_cache(gpu);
  const galley::MemoryStats before = galley::memory_stats(gpu);
  struct CapGuard {
    size_t prev;
    ~CapGuard() { galley::set_memory_limit(gpu, prev); }
  } guard{before.limit};
  const size_t cap = before.reserved;
  galley::set_memory_limit(gpu, cap);
  std::cout << "cap " << cap << " bytes, " << before.allocated << " in use; fastest: "
            << kcuda::conv2d_algorithms(0, g, galley::DType::Float32, size_t(1) << 30)
            << "; under the cap: "
            << kcuda::conv2d_algorithms(0, g, galley::DType::Float32,
                                        cap - std::min(cap, before.allocated))
            << "\n";
  galley::detail::conv2d_forward(gpu, g, galley::DType::Float32, cs.dx.data_ptr<float>(),
                                 cs.dw.data_ptr<float>(), cs.db.data_ptr<float>(),
                                 cs.dy.data_ptr<float>());
  galley::detail::conv2d_backward(gpu, g, galley::DType::Float32, cs.dx.data_ptr<float>(),
                                  cs.dw.data_ptr<float>(), cs.dgy.data_ptr<float>(),
                                  cs.dgx.data_ptr<float>(), cs.dgw.data_ptr<float>(),
                                  cs.dgb.data_ptr<float>());
  galley::cuda::synchronize(gpu);
  EXPECT_LE(galley::memory_stats(gpu).reserved, cap);
  cs.expect_matches(str(g) + " under a tight cap");
#endif
}

// Several threads, each on its own stream, run products and convolutions on one device at
// once; a second round of threads takes over the first round's handles.
TEST(CudaBlas, ThreadsShareADeviceSafely) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  Tf32Setting exact(false);
  constexpr int kThreads = 4, kRounds = 2, kIterations = 5;
  const int64_t m = 96, n = 80, k = 200;
  const std::vector<galley::kernels::Conv2dGeometry> shapes = {
      geometry(4, 16, 20, 20, 24, 3, 1, 1, 1, 1), geometry(2, 8, 17, 17, 8, 5, 2, 2, 1, 2)};
  for (int round = 0; round < kRounds; ++round) {
    struct Work {
      Tensor a, b, c, expected;  // host
      Tensor da, db, dc;
      std::vector<ConvCase> convs;
      std::string error;
    };
    std::vector<Work> work(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      Work& wk = work[t];
      wk.a = galley::randn({m, k}), wk.b = galley::randn({k, n});
      wk.expected = Tensor::empty({m, n});
      galley::kernels::cpu::gemm(false, false, m, n, k, 1.f, wk.a.data_ptr<float>(), k,
                                 wk.b.data_ptr<float>(), n, 0.f, wk.expected.data_ptr<float>(), n);
      wk.da = wk.a.to(gpu), wk.db = wk.b.to(gpu);
      wk.dc = Tensor::empty({m, n}, galley::DType::Float32, gpu);
      for (const galley::kernels::Conv2dGeometry& g : shapes) wk.convs.emplace_back(g);
    }
    galley::cuda::synchronize(gpu);  // the uploads, queued on the compute stream, are done
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        Work& wk = work[t];
        void* stream = nullptr;
        TestScratch scratch;  // outlives the work queued on `stream`, even after an error
        try {
          galley::detail::make_current(gpu);
          stream = galley::detail::create_stream(gpu);
          for (int i = 0; i < kIterations; ++i) {
            kcuda::gemm(0, false, false, m, n, k, 1.f, wk.da.data_ptr<float>(), k,
                        wk.db.data_ptr<float>(), n, 0.f, wk.dc.data_ptr<float>(), n, stream);
            for (ConvCase& cs : wk.convs) cs.run(scratch.workspace(), stream);
          }
        } catch (const std::exception& e) {
          wk.error = e.what();
        }
        if (!stream) return;
        try {
          galley::detail::Event done(gpu);
          done.record(stream);
          done.synchronize();
        } catch (const std::exception& e) {
          if (wk.error.empty()) wk.error = e.what();
        }
        galley::detail::destroy_stream(gpu, stream);
      });
    for (auto& th : threads) th.join();
    galley::cuda::synchronize(gpu);
    for (int t = 0; t < kThreads; ++t) {
      const std::string who = galley::detail::str_cat("round ", round, ", thread ", t);
      ASSERT_TRUE(work[t].error.empty()) << who << ": " << work[t].error;
      expect_close(work[t].dc, work[t].expected, kGemmTolerance, who + ": gemm");
      for (ConvCase& cs : work[t].convs) cs.expect_matches(who + ": " + str(cs.g));
    }
  }
#endif
}

TEST(CudaBlas, DeterministicConvolutionsRepeatTheirBits) {
  REQUIRE_GPU();
#ifdef GALLEY_HAVE_CUDA
  Tf32Setting exact(false);
  DeterministicSetting det(true);
  const galley::kernels::Conv2dGeometry g = geometry(16, 16, 24, 24, 16, 3, 1, 1, 1, 1);
  ConvCase cs(g);
  TestScratch scratch;
  cs.run(scratch.workspace(), compute_stream());
  galley::cuda::synchronize(gpu);
  const auto gx = cs.dgx.to(Device::cpu()).to_vector(), gw = cs.dgw.to(Device::cpu()).to_vector();
  cs.run(scratch.workspace(), compute_stream());
  galley::cuda::synchronize(gpu);
  const auto gx2 = cs.dgx.to(Device::cpu()).to_vector(), gw2 = cs.dgw.to(Device::cpu()).to_vector();
  const std::string algos = kcuda::conv2d_algorithms(0, g, galley::DType::Float32, size_t(1) << 30);
  EXPECT_EQ(0, std::memcmp(gx.data(), gx2.data(), gx.size() * sizeof(float))) << algos;
  EXPECT_EQ(0, std::memcmp(gw.data(), gw2.data(), gw.size() * sizeof(float))) << algos;
  cs.expect_matches(str(g) + " (deterministic), " + algos);
#endif
}
