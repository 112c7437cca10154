// Train-step throughput in libtorch (CPU), the C++ reference for bench_train_step, for the
// models of models_libtorch.h (the same as models.h).
// One step: forward, CrossEntropyLoss, backward, Adam(lr=1e-3) step, zero grad.
//
//   bench_train_step_libtorch --model vgg --batch 64 --threads 1 --warmup 5 --iters 20 --repeats 5
//   [--json]
//
// Prints samples/s: the median over `repeats` timed blocks of `iters` steps each.
#include <torch/torch.h>

#include "bench_args.h"
#include "models_libtorch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

using bench::Args;
using bench::Clock;
using bench::median;
using bench::parse;
using bench::seconds_since;
using bench::usage;

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a) || a.device != "cpu" || a.graph) {
    if (a.device != "cpu" || a.graph)
      std::fprintf(stderr, "the libtorch reference runs on the CPU only\n");
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
