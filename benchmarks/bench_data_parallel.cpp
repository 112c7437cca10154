// DataParallel train-step throughput of the SimpleCNN over N CPU devices, and how much of the
// gradient all-reduce ran hidden behind backward.
//
// Usage: bench_data_parallel [--devices N] [--batch B] [--iters I] [--bucket-kb K] [--json]
#include <galley/galley.h>

#include "bench_args.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace nn = galley::nn;
using galley::Tensor;

class SimpleCNN : public nn::Layer {
 public:
  SimpleCNN() {
    register_layer("conv", conv_);
    register_layer("pool", pool_);
    register_layer("fc", fc_);
  }
  Tensor forward(const Tensor& x) override {
    return fc_(galley::flatten(pool_(galley::relu(conv_(x))), 1));
  }

 private:
  nn::Conv2D conv_{3, 64, 3};
  nn::MaxPool2D pool_{2};
  nn::Linear fc_{64 * 15 * 15, 10};
};

int main(int argc, char** argv) {
  int devices = 2, iters = 20;
  int64_t batch = 256, bucket_kb = 25 * 1024;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&] {
      return i + 1 < argc
                 ? argv[++i]
                 : (std::fprintf(stderr, "%s needs a value\n", k.c_str()), std::exit(64), argv[0]);
    };
    if (k == "-h" || k == "--help") {
      std::printf(
          "usage: %s [--devices N] [--batch B] [--iters I] [--bucket-kb K] [--json]\n"
          "DataParallel train-step throughput of the SimpleCNN over N CPU devices (default 2), "
          "batch B\n(default 256), I timed steps (default 20), all-reduce buckets of K KiB "
          "(default 25600).\n",
          argv[0]);
      return 0;
    } else if (k == "--devices" || k == "--batch" || k == "--iters" || k == "--bucket-kb") {
      // Whole numbers in range (atoi read "abc" as 0, and --iters 0 left no time to report).
      const long long most = k == "--devices" ? 256 : k == "--iters" ? 1 << 20 : 1LL << 31;
      const char* text = next();
      const auto v = bench::whole_number(text, 1, most);
      if (!v)
        return std::fprintf(stderr, "%s: %s %s: expected a whole number in [1, %lld]\n", argv[0],
                            k.c_str(), text, most),
               64;
      if (k == "--devices")
        devices = int(*v);
      else if (k == "--batch")
        batch = *v;
      else if (k == "--iters")
        iters = int(*v);
      else
        bucket_kb = *v;
    } else if (k == "--json")
      json = true;
    else
      return std::fprintf(stderr, "%s: unknown option %s (%s --help lists the options)\n", argv[0],
                          k.c_str(), argv[0]),
             64;
  }
  try {
    std::vector<galley::Device> devs;
    for (int i = 0; i < devices; ++i) devs.push_back(galley::Device::cpu(i));
    galley::DataParallel<SimpleCNN> model(devs, {.bucket_bytes = bucket_kb * 1024});
    galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-3});
    nn::CrossEntropyLoss loss_fn;
    Tensor x = galley::randn({batch, 3, 32, 32});
    std::vector<int64_t> l(batch);
    for (int64_t i = 0; i < batch; ++i) l[i] = i % 10;
    Tensor y = Tensor::from_vector(l, {batch});
    auto step = [&] {
      loss_fn(model(x), y).backward();
      opt.step();
      opt.clear_grad();
    };
    for (int i = 0; i < 3; ++i) step();
    std::vector<double> times;
    double hidden = 0, reduce_ms = 0, bwd_ms = 0;
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      step();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      auto s = model.last_stats();
      hidden += s.hidden_ms;
      reduce_ms += s.allreduce_ms;
      bwd_ms += s.backward_ms;
    }
    std::sort(times.begin(), times.end());
    const double sps = batch / times[times.size() / 2];
    const double frac = reduce_ms > 0 ? hidden / reduce_ms : 0;
    if (json)
      std::printf(
          "{\"devices\": %d, \"batch\": %lld, \"samples_per_s\": %.1f, \"allreduce_ms\": %.3f, "
          "\"backward_ms\": %.3f, \"hidden_fraction\": %.3f, \"threads\": %d}\n",
          devices, static_cast<long long>(batch), sps, reduce_ms / iters, bwd_ms / iters, frac,
          galley::num_threads());
    else
      std::printf(
          "devices %d  batch %lld  %.0f samples/s  all-reduce %.2f ms/step  backward %.2f "
          "ms/step  hidden %.0f%%\n",
          devices, static_cast<long long>(batch), sps, reduce_ms / iters, bwd_ms / iters,
          100 * frac);
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
