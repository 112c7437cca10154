// Train-step throughput in galley for the models of models.h, on the CPU or a GPU.
//
// One step: forward, CrossEntropyLoss, backward, Adam(lr=1e-3) step, zero grad, on a fixed
// random batch. train_step_torch.py and bench_train_step_libtorch.cpp run the same step in
// PyTorch and libtorch; run_cpu.py runs them side by side.
//
//   bench_train_step --model vgg --batch 64 --threads 1 --warmup 5 --iters 20 --repeats 5
//                    [--json] [--phases] [--device cuda:0] [--graph]
//
// On a GPU, --graph captures the whole step (forward, loss, backward, Adam) in a CUDA graph
// after the warm-up and times its replays; each timed block ends by reading the loss, which
// waits for the GPU.
//
// Prints samples/s: the median over `repeats` timed blocks of `iters` steps each. With --phases
// it also times forward / loss / backward / optimizer separately (averages over iters*repeats
// extra steps).
#include <galley/galley.h>

#include "bench_args.h"
#include "models.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace nn = galley::nn;
using galley::Tensor;

using bench::Args;
using bench::Clock;
using bench::median;
using bench::parse;
using bench::seconds_since;
using bench::usage;

namespace {
int run(const Args& a);
}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) {
    usage(argv[0]);
    return 2;
  }
  try {
    return run(a);
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "bench_train_step: %s\n", e.what());
    return 1;
  }
}

namespace {
int run(const Args& a) {
  galley::set_num_threads(a.threads);
  galley::manual_seed(0);

  bench::Model m;
  try {
    m = bench::make_model(a.model);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  nn::Sequential& model = *m.net;
  galley::Device device = galley::Device::cpu();
  if (a.device.rfind("cuda", 0) == 0)
    device = galley::Device::cuda(a.device.size() > 5 ? std::atoi(a.device.c_str() + 5) : 0);
  else if (a.device != "cpu") {
    std::fprintf(stderr, "--device %s: expected cpu or cuda:N\n", a.device.c_str());
    return 2;
  }
  if (a.graph && (!device.is_cuda() || a.warmup < 1 || a.phases)) {
    std::fprintf(stderr, "--graph needs a CUDA device, --warmup >= 1 and no --phases\n");
    return 2;
  }
  model.to(device);
  galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-3});
  nn::CrossEntropyLoss loss_fn;

  galley::Generator gen(1);
  Tensor x = galley::randn({a.batch, m.input[0], m.input[1], m.input[2]}, gen);
  std::vector<int64_t> labels(a.batch);
  for (auto& l : labels) l = static_cast<int64_t>(gen.next_u64() % 10);
  Tensor y = Tensor::from_vector(labels, {a.batch}).to(device);
  x = x.to(device);

  Tensor loss;
  auto step = [&] {
    Tensor out = model(x);
    loss = loss_fn(out, y);
    loss.backward();
    opt.step();
    opt.zero_grad();
  };

  for (int i = 0; i < a.warmup; ++i) step();
  galley::cuda::Graph graph;
  std::function<void()> timed = step;
  if (a.graph) {
    graph.capture(device, step);
    timed = [&] { graph.replay(); };
    timed();  // the first replay uploads the graph
  }
  if (loss.defined()) (void)loss.item();

  std::vector<double> rates;
  for (int r = 0; r < a.repeats; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < a.iters; ++i) timed();
    (void)loss.item();
    rates.push_back(double(a.batch) * a.iters / seconds_since(t0));
  }
  double med = median(rates);
  float final_loss = loss.item();

  double ph[4] = {0, 0, 0, 0};
  if (a.phases) {
    int n = a.iters * a.repeats;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      Tensor out = model(x);
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
        "{\"impl\": \"galley\", \"version\": \"%s\", \"model\": \"%s\", \"batch\": %d, "
        "\"device\": \"%s\", \"graph\": %s, \"threads\": %d, "
        "\"warmup\": %d, \"iters\": %d, \"repeats\": %d, \"samples_per_s\": %.3f, "
        "\"samples_per_s_all\": [",
        GALLEY_BENCH_VERSION, a.model.c_str(), a.batch, device.str().c_str(),
        a.graph ? "true" : "false", galley::num_threads(), a.warmup, a.iters, a.repeats, med);
    for (size_t i = 0; i < rates.size(); ++i) std::printf("%s%.3f", i ? ", " : "", rates[i]);
    std::printf("], \"step_ms\": %.4f, \"final_loss\": %.6f", 1e3 * a.batch / med, final_loss);
    if (a.phases)
      std::printf(
          ", \"phases_ms\": {\"forward\": %.4f, \"loss\": %.4f, \"backward\": %.4f, "
          "\"optimizer\": %.4f}",
          ph[0], ph[1], ph[2], ph[3]);
    std::printf("}\n");
  } else {
    std::printf("galley %s %s batch=%d %s%s threads=%d: %.1f samples/s (%.2f ms/step, loss %.4f)\n",
                GALLEY_BENCH_VERSION, a.model.c_str(), a.batch, device.str().c_str(),
                a.graph ? " graph" : "", galley::num_threads(), med, 1e3 * a.batch / med,
                final_loss);
    if (a.phases)
      std::printf("  forward %.2f ms  loss %.2f ms  backward %.2f ms  optimizer %.2f ms\n", ph[0],
                  ph[1], ph[2], ph[3]);
  }
  return 0;
}
}  // namespace
