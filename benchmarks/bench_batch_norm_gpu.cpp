// galley's CUDA batch normalisation against cuDNN's, kernel against kernel, on the BatchNorm
// shapes of the `resnet` model (16 channels of 28x28, 32 of 14x14, 64 of 7x7) at batch 64 and
// 256, in float32 and training mode:
//   forward   galley: batch_norm_stats (with the running update) + batch_norm_forward;
//             cuDNN: cudnnBatchNormalizationForwardTraining (the same work in one call);
//   backward  galley: batch_norm_backward (gx, gweight, gbias);
//             cuDNN: cudnnBatchNormalizationBackward from its saved mean and 1 / sqrt(var + eps).
// cuDNN runs in both spatial modes (the persistent one may take a faster path, and may overflow:
// its flag is reported). Each way is timed twice, in microseconds a call, the median over
// --repeats blocks of --iters calls on the device's compute stream:
//   eager  the calls launched one by one from the host (what an eager training step pays: at
//          these sizes the launches can cost more than the kernels);
//   graph  the block captured once as a CUDA graph and replayed (the kernels' own time, as in a
//          captured step).
// `cudnn_over_galley` (the faster cuDNN mode over galley, per timing) above 1 means galley's
// kernels are faster. One JSON object a line with --json, else a table. A way that fails is
// reported with its error and the others still run; the exit status is then 1. On cuda:0; exit
// status 2 where there is no GPU (or no CUDA backend in the build).
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_args.h"
#include "galley/galley.h"
#include "galley/runtime/cuda.h"
#include "galley/runtime/graph.h"
#include "kernels/batch_norm.h"
#include "src/runtime/device_memory.h"

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

// Median microseconds a call of f over `repeats` blocks of `iters` calls: launched one by one
// (eager), or captured once as a graph of the block and replayed.
double median_us(const Options& o, const Device& gpu, const std::function<void()>& block) {
  std::vector<double> us;
  for (int r = 0; r < o.repeats; ++r) {
    const auto t0 = bench::Clock::now();
    block();
    galley::cuda::synchronize(gpu);
    us.push_back(1e6 * bench::seconds_since(t0) / o.iters);
  }
  return bench::median(us);
}

struct Timing {
  double eager = -1, graph = -1;  // microseconds a call; -1 where the way failed
  std::string error;
};

Timing time_both(const Options& o, const Device& gpu, const std::function<void()>& f) {
  Timing t;
  try {
    f();  // the first call's set-up (descriptors, handles) is neither timed nor captured
    galley::cuda::synchronize(gpu);
    t.eager = median_us(o, gpu, [&] {
      for (int i = 0; i < o.iters; ++i) f();
    });
    galley::cuda::Graph graph;
    graph.capture(gpu, [&] {
      for (int i = 0; i < o.iters; ++i) f();
    });
    graph.replay();
    galley::cuda::synchronize(gpu);
    t.graph = median_us(o, gpu, [&] { graph.replay(); });
  } catch (const std::exception& e) {
    t.error = e.what();
    try {
      galley::cuda::synchronize(gpu);
    } catch (const std::exception&) {
      // reported with the first error
    }
  }
  return t;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\')
      out += '\\', out += ch;
    else if (static_cast<unsigned char>(ch) < 0x20)
      out += ' ';
    else
      out += ch;
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (v < 0) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// The faster cuDNN mode over galley's; null where either failed.
std::string ratio(double galley, double cudnn, double persistent) {
  double best = -1;
  for (double v : {cudnn, persistent})
    if (v >= 0 && (best < 0 || v < best)) best = v;
  if (galley <= 0 || best < 0) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", best / galley);
  return buf;
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
  void* stream = galley::detail::compute_stream(gpu);
  galley::Generator gen(2024);
  const float eps = 1e-5f, momentum = 0.1f;
  const auto f32 = galley::DType::Float32;
  bool failed = false;
  if (!o.json)
    std::printf("%-16s %-8s %-6s %10s %10s %10s %8s\n", "shape [N, C, HW]", "pass", "timing",
                "galley", "cuDNN", "persist.", "ratio");
  for (int64_t batch : {64, 256})
    for (const auto& [c, hw] :
         {std::pair<int64_t, int64_t>{16, 28 * 28}, {32, 14 * 14}, {64, 7 * 7}}) {
      const BatchNormGeometry g{batch, c, hw};
      auto on_gpu = [&](galley::Shape s, float scale) {
        return (galley::randn(s, gen) * scale).to(gpu);
      };
      auto zeros = [&](galley::Shape s) { return galley::zeros(s).to(gpu); };
      const Tensor x = on_gpu({batch, c, hw}, 2.f), gy = on_gpu({batch, c, hw}, 1.f);
      const Tensor w = on_gpu({c}, 1.f), b = on_gpu({c}, 1.f);
      const Tensor y = zeros({batch, c, hw}), gx = zeros({batch, c, hw});
      const Tensor rm = zeros({c}), rv = galley::ones({c}).to(gpu);
      const Tensor mean = zeros({c}), var = zeros({c}), gw = zeros({c}), gb = zeros({c});
      const Tensor save_mean = zeros({c}), save_invstd = zeros({c});
      const BatchNormParams p{ptr(mean), ptr(var), eps, ptr(w), ptr(b)};
      const BatchNormRunning running{ptr(rm), ptr(rv), momentum};
      galley::cuda::synchronize(gpu);

      // [pass][way]: forward, backward x galley, cuDNN, cuDNN persistent.
      Timing t[2][3];
      t[0][0] = time_both(o, gpu, [&] {
        gk::batch_norm_stats(f32, ptr(x), g, running, ptr(mean), ptr(var), stream);
        gk::batch_norm_forward(f32, ptr(x), g, p, false, ptr(y), nullptr, stream);
      });
      t[1][0] = time_both(o, gpu, [&] {
        gk::batch_norm_backward(f32, ptr(gy), ptr(x), nullptr, g, p, true, ptr(gx), ptr(gw),
                                ptr(gb), nullptr, stream);
      });
      bool overflow = false;
      for (int persistent = 0; persistent < 2; ++persistent) {
        t[0][1 + persistent] = time_both(o, gpu, [&] {
          gk::batch_norm_cudnn_train_forward(0, ptr(x), g, running, ptr(w), ptr(b), eps, ptr(y),
                                             ptr(save_mean), ptr(save_invstd), persistent, stream);
        });
        t[1][1 + persistent] = time_both(o, gpu, [&] {
          gk::batch_norm_cudnn_backward(0, ptr(gy), ptr(x), g, ptr(w), eps, ptr(save_mean),
                                        ptr(save_invstd), ptr(gx), ptr(gw), ptr(gb), persistent,
                                        stream);
        });
        try {
          if (persistent) overflow = gk::batch_norm_cudnn_overflowed(0);
        } catch (const std::exception& e) {
          t[1][2].error += std::string(t[1][2].error.empty() ? "" : "; ") + e.what();
        }
      }
      std::string errors;
      const char* way_names[3] = {"galley", "cuDNN", "cuDNN persistent"};
      for (int pass = 0; pass < 2; ++pass)
        for (int way = 0; way < 3; ++way)
          if (!t[pass][way].error.empty()) {
            failed = true;
            errors += std::string(errors.empty() ? "" : "; ") + way_names[way] +
                      (pass ? " backward: " : " forward: ") + t[pass][way].error;
          }
      if (o.json) {
        std::string line = "{\"bench\": \"batch_norm_gpu\", \"device\": \"cuda:0\", \"shape\": [" +
                           std::to_string(batch) + ", " + std::to_string(c) + ", " +
                           std::to_string(hw) + "], \"iters\": " + std::to_string(o.iters) +
                           ", \"repeats\": " + std::to_string(o.repeats);
        const char* passes[2] = {"forward", "backward"};
        const char* keys[3] = {"galley", "cudnn", "cudnn_persistent"};
        for (int pass = 0; pass < 2; ++pass) {
          for (int way = 0; way < 3; ++way) {
            line += std::string(", \"") + keys[way] + "_" + passes[pass] +
                    "_us\": " + json_number(t[pass][way].eager);
            line += std::string(", \"") + keys[way] + "_" + passes[pass] +
                    "_graph_us\": " + json_number(t[pass][way].graph);
          }
          line += std::string(", \"") + passes[pass] + "_cudnn_over_galley\": " +
                  ratio(t[pass][0].eager, t[pass][1].eager, t[pass][2].eager);
          line += std::string(", \"") + passes[pass] + "_graph_cudnn_over_galley\": " +
                  ratio(t[pass][0].graph, t[pass][1].graph, t[pass][2].graph);
        }
        line += std::string(", \"cudnn_persistent_overflow\": ") + (overflow ? "true" : "false");
        line += ", \"errors\": " + (errors.empty() ? std::string("null") : json_string(errors));
        std::printf("%s}\n", line.c_str());
      } else {
        const std::string shape = "[" + std::to_string(batch) + ", " + std::to_string(c) + ", " +
                                  std::to_string(hw) + "]";
        for (int pass = 0; pass < 2; ++pass)
          for (int graph = 0; graph < 2; ++graph) {
            auto v = [&](int way) { return graph ? t[pass][way].graph : t[pass][way].eager; };
            std::printf("%-16s %-8s %-6s %10.1f %10.1f %10.1f %8s\n", shape.c_str(),
                        pass ? "backward" : "forward", graph ? "graph" : "eager", v(0), v(1), v(2),
                        ratio(v(0), v(1), v(2)).c_str());
          }
        if (overflow) std::printf("  cuDNN's persistent mode flagged an overflow\n");
        if (!errors.empty()) std::printf("  errors: %s\n", errors.c_str());
      }
      std::fflush(stdout);
    }
  return failed ? 1 : 0;
}
