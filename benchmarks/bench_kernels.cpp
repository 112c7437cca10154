// Micro-benchmarks of the CPU ops behind the SimpleCNN train step, and of the activations,
// through galley's public API.
//
//   bench_kernels [--benchmark_filter=conv] [--threads=T]
//
// Shapes are those of the SimpleCNN (Conv2D(3, 64, 3) on 32x32, MaxPool2D(2), Linear(14400, 10))
// at batch 64 and 256, every convolution shape of the vgg and resnet models of models.h at batch
// 64 (BM_conv2d_layer_*, labelled with model and shape), plus a square GEMM and the activations on
// 1M elements. Counters: GFLOP/s for conv and GEMM, GB/s (bytes read + written once) for the
// memory-bound ops, and `of_peak`: that figure as a fraction of this machine's peak for the thread
// count, measured at start-up (single-precision FMA throughput of a tight loop with independent
// accumulators on every thread, and the bandwidth of a STREAM-like copy of arrays far larger than
// the caches; both printed in the context lines). Backward benchmarks time only the backward call.
// --threads=T calls galley::set_num_threads(T) first (default: galley's default).
#include <benchmark/benchmark.h>
#include <galley/galley.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace nn = galley::nn;
using galley::Tensor;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ----------------------------------------------------------------------------- machine peak
// Runs fn(thread_index) on `threads` threads at once; returns the wall time.
template <typename Fn>
double timed_on_threads(int threads, Fn fn) {
  std::vector<std::thread> pool;
  auto t0 = Clock::now();
  for (int t = 1; t < threads; ++t) pool.emplace_back(fn, t);
  fn(0);
  for (auto& th : pool) th.join();
  return seconds_since(t0);
}

// Single-precision FMAs per second of one thread's tight loop: 12 independent accumulators
// cover the FMA latency of every pipe, so the loop runs at the FMA units' throughput.
double fma_loop(int64_t iters) {
#if defined(__AVX512F__)
  constexpr int kLanes = 16;
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(float(k));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
  __m512 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm512_add_ps(sum, acc[k]);
  float out = _mm512_reduce_add_ps(sum);
#elif defined(__FMA__)
  constexpr int kLanes = 8;
  __m256 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm256_set1_ps(float(k));
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm256_fmadd_ps(acc[k], m, c);
  __m256 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm256_add_ps(sum, acc[k]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  float out = 0;
  for (float v : lanes) out += v;
#else
  constexpr int kLanes = 1;
  float acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = float(k);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = acc[k] * 0.999999f + 1e-7f;
  float out = 0;
  for (float v : acc) out += v;
#endif
  benchmark::DoNotOptimize(out);
  return 2.0 * 12 * kLanes * double(iters);  // flops
}

// Peak single-precision GFLOP/s of `threads` threads: the best of a few runs.
double measure_peak_gflops(int threads) {
  const int64_t iters = int64_t(1) << 23;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    double flops = 0;
    double s = timed_on_threads(threads, [&](int t) {
      double f = fma_loop(iters);
      if (t == 0) flops = f;
    });
    best = std::max(best, flops * threads / s / 1e9);
  }
  return best;
}

// Memory bandwidth of `threads` threads copying 2 x 256 MiB (bytes read + written), best of 3.
double measure_peak_gbs(int threads) {
  const size_t n = size_t(64) << 20;  // floats per array
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    double s = timed_on_threads(threads, [&](int t) {
      size_t lo = n * t / threads, hi = n * (t + 1) / threads;
      std::memcpy(b.data() + lo, a.data() + lo, (hi - lo) * sizeof(float));
    });
    if (rep > 0) best = std::max(best, 2.0 * n * sizeof(float) / s / 1e9);  // rep 0 faults pages
  }
  benchmark::DoNotOptimize(b.data());
  return best;
}

double g_peak_gflops = 0, g_peak_gbs = 0;

// ----------------------------------------------------------------------------- ops
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

// Sets GFLOP/s (when flops > 0, else GB/s) and its fraction of the machine's peak, from the
// seconds the timed calls took in all (wall time, whatever the thread count).
void set_rate(benchmark::State& st, double flops, double bytes, double seconds,
              bool samples = true) {
  if (seconds <= 0) return;
  if (flops > 0) {
    double g = flops * st.iterations() / seconds / 1e9;
    st.counters["GFLOP/s"] = g;
    if (g_peak_gflops > 0) st.counters["of_peak"] = g / g_peak_gflops;
  }
  if (bytes > 0) {
    double g = bytes * st.iterations() / seconds / 1e9;
    st.counters["GB/s"] = g;
    if (flops <= 0 && g_peak_gbs > 0) st.counters["of_peak"] = g / g_peak_gbs;
  }
  if (samples) st.SetItemsProcessed(st.iterations() * st.range(0));
}

// Times op() (no autograd graph recorded) over every iteration; returns the seconds.
template <typename Op>
double time_forward(benchmark::State& st, Op&& op) {
  galley::NoGradGuard ng;
  auto t0 = Clock::now();
  for (auto _ : st) {
    Tensor y = op();
    benchmark::DoNotOptimize(y.raw_data());
  }
  return seconds_since(t0);
}

// Times backward alone: each iteration records op()'s graph, times y.backward(gy) as the
// iteration's manual time, then clears the gradients of `leaves`. Returns the seconds of backward.
template <typename Op>
double time_backward(benchmark::State& st, Op&& op, const Tensor& gy,
                     const std::vector<Tensor>& leaves) {
  double secs = 0;
  for (auto _ : st) {
    Tensor y = op();
    auto t0 = Clock::now();
    y.backward(gy);
    const double dt = seconds_since(t0);
    st.SetIterationTime(dt);
    secs += dt;
    for (Tensor leaf : leaves) leaf.set_grad(Tensor());
  }
  return secs;
}

// Conv2D(3, 64, 3) forward on [N, 3, 32, 32].
void BM_conv2d_forward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kC, kH, kH}, gen());
  Tensor w = galley::randn({kO, kC, kK, kK}, gen()), b = galley::randn({kO}, gen());
  const double secs = time_forward(st, [&] { return galley::conv2d(x, w, b); });
  set_rate(st, 2.0 * n * kO * kOH * kOH * kC * kK * kK, 0, secs);
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
  std::vector<Tensor> leaves = {w, b};
  if (need_gx) leaves.push_back(x);
  const double secs = time_backward(
      st, [&] { return galley::conv2d(x, w, b); }, gy, leaves);
  double gemm = 2.0 * n * kO * kOH * kOH * kC * kK * kK;
  set_rate(st, need_gx ? 2 * gemm : gemm, 0, secs);
}

// The convolutions of the vgg and resnet models of models.h at batch 64, one benchmark argument
// per layer shape; padding (k - 1) / 2 as in those models. Forward, then backward with the
// gradients the model's step computes: a stem's input is the data, which takes no gradient, so a
// stem's backward is its weight (and bias) gradient alone.
struct LayerShape {
  const char* model;
  int64_t in, out, hw, k, stride;
  bool bias() const { return std::string(model) == "vgg"; }  // resnet's convs have none
  bool stem() const { return in <= 3; }  // the model's first layer: one or three input channels
};
constexpr LayerShape kLayerShapes[] = {
    {"vgg", 32, 32, 32, 3, 1},    {"vgg", 64, 64, 16, 3, 1},    {"vgg", 64, 128, 8, 3, 1},
    {"resnet", 1, 16, 28, 3, 1},  {"resnet", 16, 16, 28, 3, 1}, {"resnet", 16, 32, 28, 3, 2},
    {"resnet", 32, 32, 14, 3, 1}, {"resnet", 32, 64, 14, 3, 2}, {"resnet", 64, 64, 7, 3, 1},
    {"resnet", 16, 32, 28, 1, 2}, {"resnet", 32, 64, 14, 1, 2}, {"vgg", 3, 32, 32, 3, 1},
    {"vgg", 32, 64, 16, 3, 1},
};
constexpr int64_t kLayerShapeCount = sizeof(kLayerShapes) / sizeof(kLayerShapes[0]);
constexpr int64_t kLayerBatch = 64;

// The shape of benchmark argument 0, labelled "resnet 16->32 3x3/2 28x28".
const LayerShape& layer_shape(benchmark::State& st) {
  const LayerShape& l = kLayerShapes[st.range(0)];
  st.SetLabel(std::string(l.model) + " " + std::to_string(l.in) + "->" + std::to_string(l.out) +
              " " + std::to_string(l.k) + "x" + std::to_string(l.k) + "/" +
              std::to_string(l.stride) + " " + std::to_string(l.hw) + "x" + std::to_string(l.hw));
  return l;
}

// Multiply-adds x 2 of one forward of the layer at kLayerBatch.
double layer_flops(const LayerShape& l) {
  const int64_t oh = (l.hw + 2 * ((l.k - 1) / 2) - l.k) / l.stride + 1;
  return 2.0 * kLayerBatch * l.out * oh * oh * l.in * l.k * l.k;
}

// Bytes a pass of the layer at kLayerBatch must move at the least: each tensor it reads or writes
// once (elements of `elem` bytes). Forward: x, w (and b) read, y written; the weight gradient
// alone (a stem's backward): x and gy read, gw (and gb) written; the backward with the input
// gradient: gx and w besides. Of x, the 64-byte cache lines that hold a row some tap reads (a 1x1
// kernel at stride 2 reads every other row; rows of 56 bytes share their lines, so at 14x14 that
// is every line, at 28x28 five of seven); gx is written whole.
double layer_bytes(const LayerShape& l, bool input_grad, double elem) {
  const int64_t pad = (l.k - 1) / 2, oh = (l.hw + 2 * pad - l.k) / l.stride + 1;
  std::vector<bool> row_read(size_t(l.hw), false);
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t a = 0; a < l.k; ++a)
      if (const int64_t r = i * l.stride - pad + a; r >= 0 && r < l.hw) row_read[size_t(r)] = true;
  // The rows in memory order (each image's planes one after another), their lines counted once.
  const int64_t row_bytes = int64_t(elem) * l.hw;
  int64_t lines = 0, last = -1;
  for (int64_t plane = 0; plane < kLayerBatch * l.in; ++plane)
    for (int64_t r = 0; r < l.hw; ++r) {
      if (!row_read[size_t(r)]) continue;
      const int64_t begin = (plane * l.hw + r) * row_bytes, end = begin + row_bytes;
      const int64_t first = std::max(begin / 64, last + 1);
      last = (end - 1) / 64;
      lines += std::max<int64_t>(0, last - first + 1);
    }
  const double x = double(kLayerBatch) * l.in * l.hw * l.hw, x_read = 64.0 * double(lines),
               y = double(kLayerBatch) * l.out * oh * oh;
  const double w = double(l.out) * l.in * l.k * l.k, b = l.bias() ? double(l.out) : 0.0;
  return x_read + elem * (w + b + y + (input_grad ? x + w : 0.0));
}

// The roofline's memory bound on a pass, as a fraction of the FMA peak (in the flops of a direct
// convolution, as `of_peak`): its flops over the bytes it must move, times the copy bandwidth
// measured at start-up (arrays far larger than the caches), over the FMA peak. Below 1 the layer is
// memory-bound on this machine if its tensors come from memory; the benchmark reruns the same
// tensors, which may stay in the last-level cache, so a layer can run above its bound here.
void set_roofline(benchmark::State& st, double flops, double bytes) {
  if (g_peak_gflops > 0 && g_peak_gbs > 0 && bytes > 0)
    st.counters["roofline"] = flops / bytes * g_peak_gbs / g_peak_gflops;
}

galley::Conv2dOptions layer_options(const LayerShape& l) {
  return {.stride = l.stride, .padding = (l.k - 1) / 2};
}

// Benchmark argument 1: the dtype of activations and weights, 0 float32, 1 bfloat16 (on the CPU
// with AVX512-BF16, the dot-product kernels).
galley::DType layer_dtype(benchmark::State& st) {
  return st.range(1) ? galley::DType::BFloat16 : galley::DType::Float32;
}

Tensor layer_tensor(galley::Shape shape, galley::DType dtype, bool grad) {
  return galley::randn(std::move(shape), gen()).to(dtype).set_requires_grad(grad);
}

void BM_conv2d_layer_forward(benchmark::State& st) {
  const LayerShape& l = layer_shape(st);
  const galley::DType dt = layer_dtype(st);
  Tensor x = layer_tensor({kLayerBatch, l.in, l.hw, l.hw}, dt, false);
  Tensor w = layer_tensor({l.out, l.in, l.k, l.k}, dt, false);
  Tensor b = l.bias() ? layer_tensor({l.out}, dt, false) : Tensor();
  const double secs = time_forward(st, [&] { return galley::conv2d(x, w, b, layer_options(l)); });
  set_rate(st, layer_flops(l), 0, secs, /*samples=*/false);
  set_roofline(st, layer_flops(l), layer_bytes(l, false, galley::dtype_size(dt)));
  st.counters["bias"] = l.bias() ? 1 : 0;
}

// Seconds of the layer's backward with the weight gradient, and the input and bias gradients
// where asked for (and the layer has a bias).
double time_layer_backward(benchmark::State& st, const LayerShape& l, galley::DType dt,
                           bool input_grad, bool bias) {
  Tensor x = layer_tensor({kLayerBatch, l.in, l.hw, l.hw}, dt, input_grad);
  Tensor w = layer_tensor({l.out, l.in, l.k, l.k}, dt, true);
  Tensor b = bias ? layer_tensor({l.out}, dt, true) : Tensor();
  Tensor gy;
  {
    galley::NoGradGuard ng;
    gy = galley::randn(galley::conv2d(x, w, b, layer_options(l)).shape(), gen()).to(dt);
  }
  std::vector<Tensor> leaves = {w};
  if (bias) leaves.push_back(b);
  if (input_grad) leaves.push_back(x);
  return time_backward(
      st, [&] { return galley::conv2d(x, w, b, layer_options(l)); }, gy, leaves);
}

// Counters: input_grad, 1 where the backward computes the input gradient (0 for a stem's); bias,
// 1 where the layer has one (forward too).
void BM_conv2d_layer_backward(benchmark::State& st) {
  const LayerShape& l = layer_shape(st);
  const bool input_grad = !l.stem();
  const galley::DType dt = layer_dtype(st);
  const double secs = time_layer_backward(st, l, dt, input_grad, l.bias());
  set_rate(st, (input_grad ? 2 : 1) * layer_flops(l), 0, secs, /*samples=*/false);
  set_roofline(st, (input_grad ? 2 : 1) * layer_flops(l),
               layer_bytes(l, input_grad, galley::dtype_size(dt)));
  st.counters["input_grad"] = input_grad ? 1 : 0;
  st.counters["bias"] = l.bias() ? 1 : 0;
}

// The weight gradient alone (no bias, no input gradient) of every layer shape: the pass the
// weight-gradient kernels take, apart from the input gradient's.
void BM_conv2d_weight_grad_of_layer(benchmark::State& st) {
  const LayerShape& l = layer_shape(st);
  const double secs = time_layer_backward(st, l, layer_dtype(st), false, false);
  set_rate(st, layer_flops(l), 0, secs, /*samples=*/false);
}

// ReLU forward on the conv output.
void BM_relu(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen());
  const double secs = time_forward(st, [&] { return galley::relu(x); });
  set_rate(st, 0, 2.0 * 4 * x.numel(), secs);
}

// ReLU backward (mask the incoming gradient).
void BM_relu_backward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen()).set_requires_grad(true);
  Tensor gy = galley::randn({n, kO, kOH, kOH}, gen());
  const double secs = time_backward(st, [&] { return galley::relu(x); }, gy, {x});
  set_rate(st, 0, 3.0 * 4 * x.numel(), secs);
}

// BatchNorm in training mode with the fused ReLU on resnet's activations at batch 64 (range(0):
// 0 the first stage's [64,16,28,28], 1 the last's [64,64,7,7]; range(1): 1 for bfloat16
// activations, as under autocast): forward (statistics, normalise) and backward. GB/s of the
// tensors each pass must move: forward reads x twice and writes y; backward reads gy, x and y for
// the sums and again for the input gradient, and writes gx.
Tensor bn_input(benchmark::State& st) {
  Tensor x = st.range(0) == 0 ? galley::randn({64, 16, 28, 28}, gen())
                              : galley::randn({64, 64, 7, 7}, gen());
  return st.range(1) ? x.to(galley::DType::BFloat16) : x;
}
void BM_batch_norm(benchmark::State& st) {
  Tensor x = bn_input(st);
  const int64_t c = x.shape()[1];
  Tensor mean = galley::zeros({c}), var = galley::ones({c}), w = galley::ones({c}),
         b = galley::zeros({c});
  galley::BatchNormOptions o;
  o.training = true, o.relu = true;
  const double secs = time_forward(st, [&] { return galley::batch_norm(x, mean, var, w, b, o); });
  set_rate(st, 0, 3.0 * double(x.numel() * int64_t(galley::dtype_size(x.dtype()))), secs);
}
void BM_batch_norm_backward(benchmark::State& st) {
  Tensor x = bn_input(st).set_requires_grad(true);
  const int64_t c = x.shape()[1];
  Tensor mean = galley::zeros({c}), var = galley::ones({c});
  Tensor w = galley::ones({c}).set_requires_grad(true),
         b = galley::zeros({c}).set_requires_grad(true);
  Tensor gy = galley::randn(x.shape(), gen()).to(x.dtype());
  galley::BatchNormOptions o;
  o.training = true, o.relu = true;
  const double secs =
      time_backward(st, [&] { return galley::batch_norm(x, mean, var, w, b, o); }, gy, {x, w, b});
  set_rate(st, 0, 7.0 * double(x.numel() * int64_t(galley::dtype_size(x.dtype()))), secs);
}

// The activations on 1M float32 elements (4 MiB in, 4 MiB out), range(0) picking the op; GB/s of
// the bytes read and written once (forward: x and y; backward: grad, the saved x or y, and the
// input gradient).
constexpr int64_t kActivationElements = int64_t(1) << 20;

Tensor activation(int64_t op, const Tensor& x) {
  switch (op) {
    case 0:
      return galley::gelu(x);
    case 1:
      return galley::gelu(x, galley::GeluApproximate::Tanh);
    case 2:
      return galley::silu(x);
    case 3:
      return galley::sigmoid(x);
    case 4:
      return galley::tanh(x);
    default:
      return galley::leaky_relu(x);
  }
}
const char* activation_name(int64_t op) {
  static const char* names[] = {"gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "leaky_relu"};
  return names[op];
}

void BM_activation(benchmark::State& st) {
  Tensor x = galley::randn({kActivationElements}, gen()) * 3.f;
  const double secs = time_forward(st, [&] { return activation(st.range(0), x); });
  st.SetLabel(activation_name(st.range(0)));
  set_rate(st, 0, 2.0 * 4 * x.numel(), secs, false);
}

void BM_activation_backward(benchmark::State& st) {
  Tensor x = (galley::randn({kActivationElements}, gen()) * 3.f).set_requires_grad(true);
  Tensor gy = galley::randn({kActivationElements}, gen());
  const double secs = time_backward(st, [&] { return activation(st.range(0), x); }, gy, {x});
  st.SetLabel(activation_name(st.range(0)));
  set_rate(st, 0, 3.0 * 4 * x.numel(), secs, false);
}

// MaxPool2D(2) forward on [N, 64, 30, 30].
void BM_max_pool2d_forward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen());
  const double secs = time_forward(st, [&] { return galley::max_pool2d(x, {.kernel_size = 2}); });
  set_rate(st, 0, 4.0 * x.numel() * 1.25, secs);
}

void BM_max_pool2d_backward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kO, kOH, kOH}, gen()).set_requires_grad(true);
  Tensor gy = galley::randn({n, kO, kPH, kPH}, gen());
  const double secs =
      time_backward(st, [&] { return galley::max_pool2d(x, {.kernel_size = 2}); }, gy, {x});
  set_rate(st, 0, 4.0 * (x.numel() + gy.numel() * 2), secs);
}

// Linear(14400, 10) forward: [N, 14400] x [10, 14400]^T.
void BM_linear_forward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kFeat}, gen());
  Tensor w = galley::randn({kClasses, kFeat}, gen()), b = galley::randn({kClasses}, gen());
  const double secs = time_forward(st, [&] { return galley::linear(x, w, b); });
  set_rate(st, 2.0 * n * kFeat * kClasses, 4.0 * (n + kClasses) * kFeat, secs);
}

// Its backward: input, weight and bias gradients.
void BM_linear_backward(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor x = galley::randn({n, kFeat}, gen()).set_requires_grad(true);
  Tensor w = galley::randn({kClasses, kFeat}, gen()).set_requires_grad(true);
  Tensor b = galley::randn({kClasses}, gen()).set_requires_grad(true);
  Tensor gy = galley::randn({n, kClasses}, gen());
  const double secs = time_backward(st, [&] { return galley::linear(x, w, b); }, gy, {x, w, b});
  set_rate(st, 4.0 * n * kFeat * kClasses, 4.0 * (2 * n + 2 * kClasses) * kFeat, secs);
}

// Square GEMM [s, s] x [s, s] (range(0) = s), in float32 or bfloat16 (range(1)).
void BM_matmul(benchmark::State& st) {
  int64_t s = st.range(0);
  const galley::DType dt = layer_dtype(st);
  Tensor a = layer_tensor({s, s}, dt, false), b = layer_tensor({s, s}, dt, false);
  galley::NoGradGuard ng;
  auto t0 = Clock::now();
  for (auto _ : st) {
    Tensor c = galley::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_rate(st, 2.0 * s * s * s, 0, seconds_since(t0), /*samples=*/false);
}

// The fully connected layers of the benchmark models and of an MLP, forward and backward
// (input, weight and bias gradients), at batch 256, in float32 or bfloat16 (range(1)).
struct LinearShape {
  const char* label;
  int64_t in, out;
};
constexpr LinearShape kLinearShapes[] = {
    {"simple fc 14400->10", 14400, 10},
    {"fashion fc 3136->128", 3136, 128},
    {"mlp 1024->1024", 1024, 1024},
};
constexpr int64_t kLinearBatch = 256;

void BM_linear_layer(benchmark::State& st) {
  const LinearShape& l = kLinearShapes[st.range(0)];
  const galley::DType dt = layer_dtype(st);
  Tensor x = layer_tensor({kLinearBatch, l.in}, dt, true);
  Tensor w = layer_tensor({l.out, l.in}, dt, true), b = layer_tensor({l.out}, dt, true);
  Tensor gy = layer_tensor({kLinearBatch, l.out}, dt, false);
  double secs = 0;
  for (auto _ : st) {  // forward and backward together
    auto t0 = Clock::now();
    galley::linear(x, w, b).backward(gy);
    const double dt = seconds_since(t0);
    st.SetIterationTime(dt);
    secs += dt;
    for (Tensor leaf : {x, w, b}) leaf.set_grad(Tensor());
  }
  st.SetLabel(std::string(l.label) + (st.range(1) ? " bf16" : ""));
  set_rate(st, 3 * 2.0 * kLinearBatch * l.in * l.out, 0, secs, /*samples=*/false);
}

// Fused softmax cross-entropy, forward + backward, on [N, 10] logits.
void BM_cross_entropy(benchmark::State& st) {
  int64_t n = st.range(0);
  Tensor logits = galley::randn({n, kClasses}, gen()).set_requires_grad(true);
  Tensor y = labels(n);
  auto t0 = Clock::now();
  for (auto _ : st) {
    Tensor loss = galley::cross_entropy(logits, y);
    loss.backward();
    logits.set_grad(Tensor());
  }
  const double secs = seconds_since(t0);
  set_rate(st, 0, 4.0 * 3 * n * kClasses, secs);
}

// Adam step over the SimpleCNN's parameters (1728 + 64 + 144000 + 10 floats).
void BM_adam_step(benchmark::State& st) {
  std::vector<Tensor> params = {galley::randn({kO, kC, kK, kK}, gen()), galley::randn({kO}, gen()),
                                galley::randn({kClasses, kFeat}, gen()),
                                galley::randn({kClasses}, gen())};
  int64_t total = 0;
  for (auto& p : params) {
    p.set_requires_grad(true);
    p.set_grad(galley::randn(p.shape(), gen()));
    total += p.numel();
  }
  galley::optim::Adam opt(params, {.learning_rate = 1e-3});
  auto t0 = Clock::now();
  for (auto _ : st) opt.step();
  // Reads p, g, m, v; writes p, m, v.
  set_rate(st, 0, 7.0 * 4 * total, seconds_since(t0), /*samples=*/false);
  st.counters["params"] = static_cast<double>(total);
}

void batches(benchmark::internal::Benchmark* b) {
  b->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
}

// Every layer shape of kLayerShapes, in float32 and bfloat16.
void layer_shapes(benchmark::internal::Benchmark* b) {
  b->ArgsProduct({benchmark::CreateDenseRange(0, kLayerShapeCount - 1, 1), {0, 1}})
      ->ArgNames({"shape", "bf16"})
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_conv2d_forward)->Apply(batches)->UseRealTime();
BENCHMARK(BM_conv2d_backward)
    ->ArgsProduct({{64, 256}, {0, 1}})
    ->ArgNames({"batch", "grad_input"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_conv2d_layer_forward)->Apply(layer_shapes)->UseRealTime();
BENCHMARK(BM_conv2d_layer_backward)->Apply(layer_shapes)->UseManualTime();
BENCHMARK(BM_conv2d_weight_grad_of_layer)->Apply(layer_shapes)->UseManualTime();
BENCHMARK(BM_relu)->Apply(batches)->UseRealTime();
BENCHMARK(BM_relu_backward)->Apply(batches)->UseManualTime();
BENCHMARK(BM_batch_norm)->ArgsProduct({{0, 1}, {0, 1}})->ArgNames({"shape", "bf16"})->UseRealTime();
BENCHMARK(BM_batch_norm_backward)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"shape", "bf16"})
    ->UseManualTime();
BENCHMARK(BM_activation)
    ->DenseRange(0, 5)
    ->ArgName("op")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_activation_backward)
    ->DenseRange(0, 5)
    ->ArgName("op")
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_max_pool2d_forward)->Apply(batches)->UseRealTime();
BENCHMARK(BM_max_pool2d_backward)->Apply(batches)->UseManualTime();
BENCHMARK(BM_linear_forward)->Apply(batches)->UseRealTime();
BENCHMARK(BM_linear_backward)->Apply(batches)->UseManualTime();
BENCHMARK(BM_matmul)
    ->ArgsProduct({{256, 1024}, {0, 1}})
    ->ArgNames({"size", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_linear_layer)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->ArgNames({"shape", "bf16"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cross_entropy)->Arg(64)->Arg(256)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_adam_step)->UseRealTime()->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  // Our own flag, removed before Google Benchmark sees the rest. -h is taken as --help, which
  // Google Benchmark answers with its flags and exit status 0.
  static char help[] = "--help";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0)) {
      std::printf(
          "usage: %s [--threads=N] [Google Benchmark flags]\n"
          "Micro-benchmarks of galley's CPU ops; --threads=N sets galley's threads. Google "
          "Benchmark's flags:\n",
          argv[0]);
      std::fflush(stdout);
      rest.push_back(help);
    } else if (i > 0 && std::strncmp(argv[i], "--threads=", 10) == 0)
      galley::set_num_threads(std::atoi(argv[i] + 10));
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  const int threads = galley::num_threads();
  g_peak_gflops = measure_peak_gflops(threads);
  g_peak_gbs = measure_peak_gbs(threads);
  benchmark::AddCustomContext("galley_threads", std::to_string(threads));
  benchmark::AddCustomContext("peak_fp32_gflops", std::to_string(g_peak_gflops));
  benchmark::AddCustomContext("peak_copy_gbs", std::to_string(g_peak_gbs));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
