// galley's CUDA batch normalisation against cuDNN's, kernel against kernel, on the BatchNorm
// shapes of the `resnet` model (16 channels of 28x28, 32 of 14x14, 64 of 7x7) at batch 64 and
// 256, in float32 and training mode:
//   forward   galley: batch_norm_stats (with the running update) + batch_norm_forward;
//             cuDNN: cudnnBatchNormalizationForwardTraining (the same work in one call);
//   backward  galley: batch_norm_backward (gx, gweight, gbias);
//             cuDNN: cudnnBatchNormalizationBackward from its saved mean and 1 / sqrt(var + eps).
// cuDNN runs in both spatial modes (the persistent one may take a faster path; on NCHW data it
// may also run the plain one). Each figure is the median over --repeats blocks of --iters calls
// (host clock, the GPU synchronised around each block), in microseconds a call. One JSON object
// a line with --json, else a table; `cudnn_over_galley` above 1 means galley's kernel is faster.
// On cuda:0; exit status 2 where there is no GPU (or no CUDA backend in the build).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "kernels/batch_norm.h"

namespace {

using galley::Device;
using galley::Tensor;
using galley::kernels::BatchNormGeometry;
using galley::kernels::BatchNormParams;
using galley::kernels::BatchNormRunning;
namespace gk = galley::kernels::cuda;

struct Options {
  int iters = 50;
  int repeats = 5;
  bool json = false;
};

[[noreturn]] void usage(const char* argv0, const std::string& why) {
  if (!why.empty()) std::fprintf(stderr, "%s: %s\n", argv0, why.c_str());
  std::fprintf(stderr, "usage: %s [--iters I] [--repeats R] [--json]   (on cuda:0)\n", argv0);
  std::exit(why.empty() ? 0 : 1);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], a + " needs a value");
      return argv[++i];
    };
    auto count = [&](const std::string& v) {
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (!end || *end || n < 1 || n > 100000) usage(argv[0], a + ": expected 1..100000, got " + v);
      return int(n);
    };
    if (a == "--iters") {
      o.iters = count(value());
    } else if (a == "--repeats") {
      o.repeats = count(value());
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--help" || a == "-h") {
      usage(argv[0], "");
    } else {
      usage(argv[0], "unknown argument " + a);
    }
  }
  return o;
}

// Median microseconds a call of f over `repeats` blocks of `iters` calls.
double time_us(const Options& o, const Device& gpu, const std::function<void()>& f) {
  f();  // the first call's set-up (descriptors, handles) is not timed
  galley::cuda::synchronize(gpu);
  std::vector<double> us;
  for (int r = 0; r < o.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) f();
    galley::cuda::synchronize(gpu);
    const std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
    us.push_back(dt.count() / o.iters);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

float* ptr(const Tensor& t) {
  return static_cast<float*>(t.raw_data());
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (!galley::cuda::available()) {
    std::fprintf(stderr, "%s: no CUDA device here (or this build has no CUDA backend)\n", argv[0]);
    return 2;
  }
  const Device gpu = Device::cuda(0);
  galley::Generator gen(2024);
  const float eps = 1e-5f, momentum = 0.1f;
  if (!o.json)
    std::printf("%-16s %10s %10s %10s %8s   %10s %10s %10s %8s\n", "shape [N, C, HW]", "fwd galley",
                "cuDNN", "persist.", "ratio", "bwd galley", "cuDNN", "persist.", "ratio");
  for (int64_t batch : {64, 256})
    for (const auto& [c, hw] :
         {std::pair<int64_t, int64_t>{16, 28 * 28}, {32, 14 * 14}, {64, 7 * 7}}) {
      const BatchNormGeometry g{batch, c, hw};
      auto on_gpu = [&](galley::Shape s, float scale) {
        return (galley::randn(s, gen) * scale).to(gpu);
      };
      const Tensor x = on_gpu({batch, c, hw}, 2.f), gy = on_gpu({batch, c, hw}, 1.f);
      const Tensor w = on_gpu({c}, 1.f), b = on_gpu({c}, 1.f);
      const Tensor y = galley::zeros({batch, c, hw}).to(gpu),
                   gx = galley::zeros({batch, c, hw}).to(gpu);
      const Tensor rm = galley::zeros({c}).to(gpu), rv = galley::ones({c}).to(gpu);
      const Tensor mean = galley::zeros({c}).to(gpu), var = galley::zeros({c}).to(gpu);
      const Tensor gw = galley::zeros({c}).to(gpu), gb = galley::zeros({c}).to(gpu);
      const BatchNormParams p{ptr(mean), ptr(var), eps, ptr(w), ptr(b)};
      const BatchNormRunning running{ptr(rm), ptr(rv), momentum};
      const auto f32 = galley::DType::Float32;
      galley::cuda::synchronize(gpu);

      const double galley_fwd = time_us(o, gpu, [&] {
        gk::batch_norm_stats(f32, ptr(x), g, running, ptr(mean), ptr(var), nullptr);
        gk::batch_norm_forward(f32, ptr(x), g, p, false, ptr(y), nullptr, nullptr);
      });
      const double galley_bwd = time_us(o, gpu, [&] {
        gk::batch_norm_backward(f32, ptr(gy), ptr(x), nullptr, g, p, true, ptr(gx), ptr(gw),
                                ptr(gb), nullptr, nullptr);
      });
      double cudnn_fwd[2], cudnn_bwd[2];
      for (int persistent = 0; persistent < 2; ++persistent) {
        cudnn_fwd[persistent] = time_us(o, gpu, [&] {
          gk::batch_norm_cudnn_train_forward(0, ptr(x), g, running, ptr(w), ptr(b), eps, ptr(y),
                                             ptr(mean), ptr(var), persistent, nullptr);
        });
        cudnn_bwd[persistent] = time_us(o, gpu, [&] {
          gk::batch_norm_cudnn_backward(0, ptr(gy), ptr(x), g, ptr(w), eps, ptr(mean), ptr(var),
                                        ptr(gx), ptr(gw), ptr(gb), persistent, nullptr);
        });
      }
      const double best_fwd = std::min(cudnn_fwd[0], cudnn_fwd[1]);
      const double best_bwd = std::min(cudnn_bwd[0], cudnn_bwd[1]);
      if (o.json) {
        std::printf(
            "{\"bench\": \"batch_norm_gpu\", \"device\": \"cuda:0\", \"shape\": [%lld, %lld, "
            "%lld], "
            "\"iters\": %d, \"repeats\": %d, \"galley_forward_us\": %.2f, \"cudnn_forward_us\": "
            "%.2f, "
            "\"cudnn_persistent_forward_us\": %.2f, \"galley_backward_us\": %.2f, "
            "\"cudnn_backward_us\": %.2f, \"cudnn_persistent_backward_us\": %.2f, "
            "\"forward_cudnn_over_galley\": %.3f, \"backward_cudnn_over_galley\": %.3f}\n",
            (long long)batch, (long long)c, (long long)hw, o.iters, o.repeats, galley_fwd,
            cudnn_fwd[0], cudnn_fwd[1], galley_bwd, cudnn_bwd[0], cudnn_bwd[1],
            best_fwd / galley_fwd, best_bwd / galley_bwd);
      } else {
        const std::string shape = "[" + std::to_string(batch) + ", " + std::to_string(c) + ", " +
                                  std::to_string(hw) + "]";
        std::printf("%-16s %10.1f %10.1f %10.1f %7.2fx   %10.1f %10.1f %10.1f %7.2fx\n",
                    shape.c_str(), galley_fwd, cudnn_fwd[0], cudnn_fwd[1], best_fwd / galley_fwd,
                    galley_bwd, cudnn_bwd[0], cudnn_bwd[1], best_bwd / galley_bwd);
      }
      std::fflush(stdout);
    }
  return 0;
}
