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
using bench::parse;

namespace {
int run(const Args& a);
}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const auto status = parse(argc, argv, a)) return *status;
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

  bench::Report r{"galley", GALLEY_BENCH_VERSION, device.str(), a.graph};
  r.threads = galley::num_threads();
  r.rates = bench::time_blocks(a, timed, [&] { (void)loss.item(); });
  r.final_loss = loss.item();
  bench::Phases ph;
  if (a.phases)
    ph = bench::time_phases(
        a, [&] { return model(x); }, [&](const Tensor& out) { loss = loss_fn(out, y); },
        [&] { loss.backward(); },
        [&] {
          opt.step();
          opt.zero_grad();
        });
  bench::print_report(a, r, ph);
  return 0;
}
}  // namespace
