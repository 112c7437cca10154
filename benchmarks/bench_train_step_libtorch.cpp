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
using bench::parse;
using bench::usage;

int main(int argc, char** argv) {
  Args a;
  if (const auto status = parse(argc, argv, a)) return *status;
  if (a.device != "cpu" || a.graph || a.amp != "off") {
    std::fprintf(stderr, "%s: the libtorch reference runs on the CPU in float32 only\n", argv[0]);
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
  bench::Report r{"libtorch", TORCH_VERSION};
  r.threads = a.threads;
  r.rates = bench::time_blocks(a, step, [&] { (void)loss.item<float>(); });
  r.final_loss = loss.item<float>();
  bench::Phases ph;
  if (a.phases)
    ph = bench::time_phases(
        a, [&] { return model->forward(x); },
        [&](const torch::Tensor& out) { loss = loss_fn(out, y); }, [&] { loss.backward(); },
        [&] {
          opt.step();
          opt.zero_grad();
        });
  bench::print_report(a, r, ph);
  return 0;
}
