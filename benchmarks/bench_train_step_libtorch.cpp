// Train-step throughput in libtorch (CPU), the C++ reference for bench_train_step, for the
// models of models_libtorch.h (the same as models.h).
// One step: forward, CrossEntropyLoss, backward, Adam(lr=1e-3) step, zero grad.
//
//   bench_train_step_libtorch --model vgg --batch 64 --threads 1 --warmup 5 --iters 20 --repeats 5
//   [--json]
//
// Prints samples/s: the median over `repeats` timed blocks of `iters` steps each.
#include <torch/torch.h>

#include "models_libtorch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string model = "simple";
  int batch = 64;
  int threads = 1;
  int warmup = 5;
  int iters = 20;
  int repeats = 5;
  bool json = false;
  bool phases = false;
};

void usage(const char* prog) {
  std::fprintf(stderr,
               "usage: %s [--model simple|fashion|vgg] [--batch N] [--threads T] [--warmup W] "
               "[--iters I] [--repeats R] "
               "[--json] [--phases]\n",
               prog);
}

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&](int& v) {
      if (i + 1 >= argc) return false;
      v = std::atoi(argv[++i]);
      return v > 0 || (s == "--warmup" && v == 0);
    };
    if (s == "--model") {
      if (i + 1 >= argc) return false;
      a.model = argv[++i];
    } else if (s == "--batch") {
      if (!next(a.batch)) return false;
    } else if (s == "--threads") {
      if (!next(a.threads)) return false;
    } else if (s == "--warmup") {
      if (!next(a.warmup)) return false;
    } else if (s == "--iters") {
      if (!next(a.iters)) return false;
    } else if (s == "--repeats") {
      if (!next(a.repeats)) return false;
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--phases") {
      a.phases = true;
    } else {
      return false;
    }
  }
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) {
    usage(argv[0]);
    return 2;
  }
  torch::set_num_threads(a.threads);
  torch::manual_seed(0);

  bench::TorchModel m;
  try {
    m = bench::make_torch_model(a.model);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  torch::nn::Sequential model = m.net;
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  torch::nn::CrossEntropyLoss loss_fn;

  torch::Tensor x = torch::randn({a.batch, m.input[0], m.input[1], m.input[2]});
  torch::Tensor y = torch::randint(0, 10, {a.batch}, torch::kInt64);

  torch::Tensor loss;
  auto step = [&] {
    torch::Tensor out = model->forward(x);
    loss = loss_fn(out, y);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };

  for (int i = 0; i < a.warmup; ++i) step();

  std::vector<double> rates;
  for (int r = 0; r < a.repeats; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < a.iters; ++i) step();
    (void)loss.item<float>();
    rates.push_back(double(a.batch) * a.iters / seconds_since(t0));
  }
  double med = median(rates);
  float final_loss = loss.item<float>();

  double ph[4] = {0, 0, 0, 0};
  if (a.phases) {
    int n = a.iters * a.repeats;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      torch::Tensor out = model->forward(x);
      ph[0] += seconds_since(t0);
      t0 = Clock::now();
      loss = loss_fn(out, y);
      ph[1] += seconds_since(t0);
      t0 = Clock::now();
      loss.backward();
      ph[2] += seconds_since(t0);
      t0 = Clock::now();
      opt.step();
      opt.zero_grad();
      ph[3] += seconds_since(t0);
    }
    for (double& p : ph) p = 1e3 * p / n;
  }

  if (a.json) {
    std::printf(
        "{\"impl\": \"libtorch\", \"version\": \"%s\", \"model\": \"%s\", \"batch\": %d, "
        "\"threads\": %d, "
        "\"warmup\": %d, \"iters\": %d, \"repeats\": %d, \"samples_per_s\": %.3f, "
        "\"samples_per_s_all\": [",
        TORCH_VERSION, a.model.c_str(), a.batch, a.threads, a.warmup, a.iters, a.repeats, med);
    for (size_t i = 0; i < rates.size(); ++i) std::printf("%s%.3f", i ? ", " : "", rates[i]);
    std::printf("], \"step_ms\": %.4f, \"final_loss\": %.6f", 1e3 * a.batch / med, final_loss);
    if (a.phases)
      std::printf(
          ", \"phases_ms\": {\"forward\": %.4f, \"loss\": %.4f, \"backward\": %.4f, "
          "\"optimizer\": %.4f}",
          ph[0], ph[1], ph[2], ph[3]);
    std::printf("}\n");
  } else {
    std::printf("libtorch %s %s batch=%d threads=%d: %.1f samples/s (%.2f ms/step, loss %.4f)\n",
                TORCH_VERSION, a.model.c_str(), a.batch, a.threads, med, 1e3 * a.batch / med,
                final_loss);
    if (a.phases)
      std::printf("  forward %.2f ms  loss %.2f ms  backward %.2f ms  optimizer %.2f ms\n", ph[0],
                  ph[1], ph[2], ph[3]);
  }
  return 0;
}
