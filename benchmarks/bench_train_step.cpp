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
//
// --profile [--trace PATH] then times `repeats` more pairs of blocks, one plain and one under a
// galley::profiler::Profiler (record_shapes on), alternating so that drift on a shared machine
// hits both alike; prints the median and the fastest time per step of each and their ratios
// (the profiler's overhead), the cost of one recorded op and the overhead it implies per step
// (steady where the blocks' ratio is not on a loaded machine), the top ops of key_averages(),
// and writes the Chrome trace to PATH if given.
#include <galley/galley.h>

#include "bench_args.h"
#include "models.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace nn = galley::nn;
using galley::Tensor;

using bench::Args;
using bench::parse;

namespace {
struct ProfileArgs {
  bool on = false;
  std::string trace;
};
int run(const Args& a, const ProfileArgs& p);
}  // namespace

int main(int argc, char** argv) {
  // --profile and --trace are this benchmark's own; the rest go to the shared parser.
  ProfileArgs p;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--profile") {
      p.on = true;
    } else if (s == "--trace" && i + 1 < argc) {
      p.trace = argv[++i];
      if (p.trace.empty()) {
        std::fprintf(stderr, "%s: --trace needs a file name\n", argv[0]);
        return 2;
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (!p.trace.empty() && !p.on) {
    std::fprintf(stderr, "%s: --trace needs --profile\n", argv[0]);
    return 2;
  }
  // A trace that cannot be written is said before the run, not after it (opened to append, so
  // an existing file is left as it is until the trace replaces it).
  if (!p.trace.empty() && !std::ofstream(p.trace, std::ios::app)) {
    std::fprintf(stderr, "%s: --trace %s: cannot write there\n", argv[0], p.trace.c_str());
    return 2;
  }
  Args a;
  if (const auto status = parse(static_cast<int>(rest.size()), rest.data(), a)) {
    if (*status == 0)
      std::printf("       [--profile [--trace PATH]]  time steps with and without the profiler\n");
    return *status;
  }
  try {
    return run(a, p);
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "bench_train_step: %s\n", e.what());
    return 1;
  }
}

namespace {
// Median seconds per step over `a.repeats` blocks of `a.iters` steps, with and without a
// profiler, the blocks alternating.
void profile_overhead(const Args& a, const ProfileArgs& p, const std::function<void()>& step,
                      const std::function<void()>& sync) {
  namespace prof = galley::profiler;
  prof::Profiler profiler({.record_shapes = true, .start = false});
  std::vector<double> off, on;
  auto block = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < a.iters; ++i) step();
    sync();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.iters;
  };
  for (int r = 0; r < a.repeats; ++r) {
    off.push_back(block());
    profiler.start();
    on.push_back(block());
    profiler.stop();
  }
  // The fastest block is the one least disturbed by other load: its ratio is the steadier one.
  const double t_off = bench::median(off), t_on = bench::median(on);
  const double b_off = *std::min_element(off.begin(), off.end());
  const double b_on = *std::min_element(on.begin(), on.end());
  std::printf(
      "profile: median %.3f ms/step plain, %.3f profiled (ratio %.4f); fastest %.3f and "
      "%.3f (ratio %.4f, overhead %+.2f%%); %zu events\n",
      t_off * 1e3, t_on * 1e3, t_on / t_off, b_off * 1e3, b_on * 1e3, b_on / b_off,
      100.0 * (b_on / b_off - 1.0), profiler.events().size());
  // On a loaded machine the blocks' ratio is noisy; the cost of one event, from a loop of tiny
  // ops with and without a profiler, times the events per step bounds the overhead steadily.
  const int64_t events_per_step =
      static_cast<int64_t>(profiler.events().size()) / (int64_t(a.repeats) * a.iters);
  Tensor tiny = galley::ones({1});
  const int n = 20000;
  auto loop = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) (void)galley::neg(tiny);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n;
  };
  double plain_op = 1e9, profiled_op = 1e9;
  for (int r = 0; r < 7; ++r) {
    plain_op = std::min(plain_op, loop());
    prof::Profiler micro({.record_shapes = true});
    profiled_op = std::min(profiled_op, loop());
  }
  const double per_event = std::max(0.0, profiled_op - plain_op);
  std::printf(
      "profile: %.0f ns per recorded op (%.0f ns plain, %.0f ns profiled), %lld events per "
      "step: estimated overhead %.3f%% of the fastest plain step\n",
      per_event * 1e9, plain_op * 1e9, profiled_op * 1e9, static_cast<long long>(events_per_step),
      100.0 * per_event * events_per_step / b_off);
  std::printf("%s", profiler.key_averages().table(15).c_str());
  if (!p.trace.empty()) {
    profiler.export_chrome_trace(p.trace);
    std::printf("profile: trace written to %s\n", p.trace.c_str());
  }
}

int run(const Args& a, const ProfileArgs& p) {
  galley::set_num_threads(a.threads);
  galley::manual_seed(0);

  bench::Model m;
  try {
    m = bench::make_model(a.model);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  nn::Layer& model = *m.net;
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
  if (a.amp != "off" && a.phases) {
    std::fprintf(stderr, "--phases times float32 steps only; leave out --amp\n");
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

  // --amp: the forward and the loss under autocast, backward and the step outside (fp16 with a
  // loss scaler, as a training loop would).
  const bool amp = a.amp != "off";
  const galley::DType amp_dtype =
      a.amp == "fp16" ? galley::DType::Float16 : galley::DType::BFloat16;
  galley::amp::GradScaler scaler({.enabled = a.amp == "fp16"});
  Tensor loss;
  auto step = [&] {
    {
      galley::amp::Autocast autocast(amp_dtype, amp);
      Tensor out = model(x);
      loss = loss_fn(out, y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
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
  if (p.on) profile_overhead(a, p, timed, [&] { (void)loss.item(); });
  return 0;
}
}  // namespace
