// Micro-benchmarks of the CPU ops behind the SimpleCNN train step, through galley's public API.
//
//   bench_kernels [--benchmark_filter=conv] [--threads=T]
//
// Shapes are those of the SimpleCNN (Conv2D(3, 64, 3) on 32x32, MaxPool2D(2), Linear(14400, 10))
// at batch 64 and 256, plus a square GEMM. Counters: GFLOP/s for conv and GEMM, GB/s (bytes read
// + written once) for the memory-bound ops. Backward benchmarks time only the backward call.
// --threads=T calls galley::set_num_threads(T) first (default: galley's default).
#include <benchmark/benchmark.h>
#include <galley/galley.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace nn = galley::nn;
using galley::Tensor;

namespace {

constexpr int64_t kC = 3, kO = 64, kK = 3, kH = 32, kOH = kH - kK + 1, kPH = kOH / 2;
constexpr int64_t kFeat = kO * kPH * kPH, kClasses = 10;

galley::Generator& gen() {
  static galley::Generator g(42);
  return g;
}

Tensor labels(int64_t n) {
  std::vector<int64_t> v(n);
  for (auto& l : v) l = static_cast<int64_t>(gen().next_u64() % kClasses);
  return Tensor::from_vector(v, {n});
}

void set_rate(benchmark::State& st, double flops, double bytes) {
  if (flops > 0)
    st.counters["GFLOP/s"] = benchmark::Counter(flops * st.iterations() / 1e9,
                                                benchmark::Counter::kIsRate);
  if (bytes > 0)
    st.counters["GB/s"] = benchmark::Counter(bytes * st.iterations() / 1e9,
                                             benchmark::Counter::kIsRate);
  st.SetItemsProcessed(st.iterations() * st.range(0));  // samples
}

// Conv2D(3, 64, 3) forward on [N, 3, 32, 32].
void BM_conv2d_forward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kC, kH, kH}, gen());
  Tensor w = galley::randn({kO, kC, kK, kK}, gen()), b = galley::randn({kO}, gen());
  galley::NoGradGuard ng;
  for (auto _ : st) {
    Tensor y = galley::conv2d(x, w, b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_rate(st, 2.0 * n * kO * kOH * kOH * kC * kK * kK, 0);
}

// Backward of the same conv: weight and bias gradients, plus the input gradient when
// range(1) is 1 (the SimpleCNN does not need it: its input is data).
void BM_conv2d_backward(benchmark::State& st) {
  int64_t n = st.range(0);
  bool need_gx = st.range(1) != 0;
  Tensor x = galley::randn({n, kC, kH, kH}, gen());
  if (need_gx) x.set_requires_grad(true);
  Tensor w = galley::randn({kO, kC, kK, kK}, gen()).set_requires_grad(true);
  Tensor b = galley::randn({kO}, gen()).set_requires_grad(true);
  Tensor gy = galley::randn({n, kO, kOH, kOH}, gen());
  for (auto _ : st) {
    Tensor y = galley::conv2d(x, w, b);
    auto t0 = std::chrono::steady_clock::now();
    y.backward(gy);
    st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    if (need_gx) x.set_grad(Tensor());
  }
  double gemm = 2.0 * n * kO * kOH * kOH * kC * kK * kK;
  set_rate(st, need_gx ? 2 * gemm : gemm, 0);
}

// ReLU forward on the conv output.
void BM_relu(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen());
  galley::NoGradGuard ng;
  for (auto _ : st) {
    Tensor y = galley::relu(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_rate(st, 0, 2.0 * 4 * x.numel());
}

// ReLU backward (mask the incoming gradient).
void BM_relu_backward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen()).set_requires_grad(true);
  Tensor gy = galley::randn({n, kO, kOH, kOH}, gen());
  for (auto _ : st) {
    Tensor y = galley::relu(x);
    auto t0 = std::chrono::steady_clock::now();
    y.backward(gy);
    st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    x.set_grad(Tensor());
  }
  set_rate(st, 0, 3.0 * 4 * x.numel());
}

// MaxPool2D(2) forward on [N, 64, 30, 30].
void BM_max_pool2d_forward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen());
  galley::NoGradGuard ng;
  for (auto _ : st) {
    Tensor y = galley::max_pool2d(x, {.kernel_size = 2});
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_rate(st, 0, 4.0 * x.numel() * 1.25);
}

void BM_max_pool2d_backward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen()).set_requires_grad(true);
  Tensor gy = galley::randn({n, kO, kPH, kPH}, gen());
  for (auto _ : st) {
    Tensor y = galley::max_pool2d(x, {.kernel_size = 2});
    auto t0 = std::chrono::steady_clock::now();
    y.backward(gy);
    st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    x.set_grad(Tensor());
  }
  set_rate(st, 0, 4.0 * (x.numel() + gy.numel() * 2));
}

// Linear(14400, 10) forward: [N, 14400] x [10, 14400]^T.
void BM_linear_forward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kFeat}, gen());
  Tensor w = galley::randn({kClasses, kFeat}, gen()), b = galley::randn({kClasses}, gen());
  galley::NoGradGuard ng;
  for (auto _ : st) {
    Tensor y = galley::linear(x, w, b);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_rate(st, 2.0 * n * kFeat * kClasses, 4.0 * (n + kClasses) * kFeat);
}

// Its backward: input, weight and bias gradients.
void BM_linear_backward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kFeat}, gen()).set_requires_grad(true);
  Tensor w = galley::randn({kClasses, kFeat}, gen()).set_requires_grad(true);
  Tensor b = galley::randn({kClasses}, gen()).set_requires_grad(true);
  Tensor gy = galley::randn({n, kClasses}, gen());
  for (auto _ : st) {
    Tensor y = galley::linear(x, w, b);
    auto t0 = std::chrono::steady_clock::now();
    y.backward(gy);
    st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    b.set_grad(Tensor());
  }
  set_rate(st, 4.0 * n * kFeat * kClasses, 4.0 * (2 * n + 2 * kClasses) * kFeat);
}

// Square GEMM [s, s] x [s, s] (range(0) = s).
void BM_matmul(benchmark::State& st) {
  int64_t s = st.range(0);
  Tensor a = galley::randn({s, s}, gen()), b = galley::randn({s, s}, gen());
  galley::NoGradGuard ng;
  for (auto _ : st) {
    Tensor c = galley::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s * s * s * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// Fused softmax cross-entropy, forward + backward, on [N, 10] logits.
void BM_cross_entropy(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor logits = galley::randn({n, kClasses}, gen()).set_requires_grad(true);
  Tensor y = labels(n);
  for (auto _ : st) {
    Tensor loss = galley::cross_entropy(logits, y);
    loss.backward();
    logits.set_grad(Tensor());
  }
  set_rate(st, 0, 4.0 * 3 * n * kClasses);
}

// Adam step over the SimpleCNN's parameters (1728 + 64 + 144000 + 10 floats).
void BM_adam_step(benchmark::State& st) {
  std::vector<Tensor> params = {galley::randn({kO, kC, kK, kK}, gen()),
                                galley::randn({kO}, gen()),
                                galley::randn({kClasses, kFeat}, gen()),
                                galley::randn({kClasses}, gen())};
  int64_t total = 0;
  for (auto& p : params) {
    p.set_requires_grad(true);
    p.set_grad(galley::randn(p.shape(), gen()));
    total += p.numel();
  }
  galley::optim::Adam opt(params, {.learning_rate = 1e-3});
  for (auto _ : st) opt.step();
  // Reads p, g, m, v; writes p, m, v.
  st.counters["GB/s"] =
      benchmark::Counter(7.0 * 4 * total * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["params"] = static_cast<double>(total);
}

void batches(benchmark::internal::Benchmark* b) {
  b->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_conv2d_forward)->Apply(batches);
BENCHMARK(BM_conv2d_backward)
    ->ArgsProduct({{64, 256}, {0, 1}})
    ->ArgNames({"batch", "grad_input"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_relu)->Apply(batches);
BENCHMARK(BM_relu_backward)->Apply(batches)->UseManualTime();
BENCHMARK(BM_max_pool2d_forward)->Apply(batches);
BENCHMARK(BM_max_pool2d_backward)->Apply(batches)->UseManualTime();
BENCHMARK(BM_linear_forward)->Apply(batches);
BENCHMARK(BM_linear_backward)->Apply(batches)->UseManualTime();
BENCHMARK(BM_matmul)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cross_entropy)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_adam_step)->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  // Our own flag, removed before Google Benchmark sees the rest.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strncmp(argv[i], "--threads=", 10) == 0)
      galley::set_num_threads(std::atoi(argv[i] + 10));
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::AddCustomContext("galley_threads", std::to_string(galley::num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
