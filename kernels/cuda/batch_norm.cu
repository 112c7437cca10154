// Batch normalisation on the GPU: the CUDA side of kernels/cpu/batch_norm.cpp.
//
// The per-channel sums (the statistics; the gradient sums of backward) run on a grid of
// chunks x channels: block (q, c) walks chunk q of channel c's outer * inner elements, each
// thread adds shifted float32 values, and the block adds its threads by a fixed tree in double.
// One chunk per channel finishes in the same block; several write double partials to scratch
// that a second launch adds in chunk order, one thread per channel. The split depends on the
// shape alone, never atomics: the same bits at every run and on every GPU. The normalisation and
// the input gradient are elementwise with the per-channel coefficients worked out per element
// from the float32 arrays (a few flops beside the memory traffic). For [N, C] (inner == 1) the
// sums walk a channel's elements C apart, uncoalesced: fine for the feature counts BatchNorm1D
// sees, a column-sum layout would be the next step for wide ones.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/batch_norm.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/unary_math.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

// What a channel-sum kernel adds for element k of channel c: its two terms.
template <typename T>
struct StatsTerms {
  const T* x;
  // The values are shifted by the channel's first element: no cancellation far from zero.
  __device__ void init(int64_t c, int64_t inner) { sh = to_float(x[c * inner]); }
  __device__ float shift() const { return sh; }
  __device__ float2 operator()(int64_t k) const {
    const float d = to_float(x[k]) - sh;
    return make_float2(d, d * d);
  }
  float sh = 0.f;
};

template <typename T>
struct GradTerms {
  const T* gy;
  const T* x;
  const T* y;  // null: no relu mask
  const float* mean;
  __device__ void init(int64_t c, int64_t) { m = mean[c]; }
  __device__ float shift() const { return 0.f; }
  __device__ float2 operator()(int64_t k) const {
    const float g = (!y || !(to_float(y[k]) <= 0.f)) ? to_float(gy[k]) : 0.f;
    return make_float2(g, g * (to_float(x[k]) - m));
  }
  float m = 0.f;
};

// What is done with a channel's two sums (s, q) once complete.
struct StatsFinish {
  int64_t n;
  float* mean;
  float* var;
  BatchNormRunning running;
  __device__ void operator()(int64_t c, double s, double q, float shift) const {
    const double nd = double(n), ms = s / nd;
    const double v = fmax(0.0, q / nd - ms * ms);
    mean[c] = float(shift + ms);
    var[c] = float(v);
    if (running.mean) {
      const double m = running.momentum;
      running.mean[c] = float((1 - m) * running.mean[c] + m * mean[c]);
      running.var[c] = float((1 - m) * running.var[c] + m * v * nd / fmax(nd - 1, 1.0));
    }
  }
};

struct GradFinish {
  const float* var;
  float eps;
  float* gweight;
  float* gbias;
  __device__ void operator()(int64_t c, double s, double q, float) const {
    const double invstd = 1.0 / sqrt(double(var[c]) + eps);
    if (gweight) gweight[c] = float(q * invstd);
    if (gbias) gbias[c] = float(s);
  }
};

// Block (q, c): chunk q, elements j in [q * per_chunk, (q + 1) * per_chunk), of channel c's
// outer * inner elements j = o * inner + i at offset (o * channels + c) * inner + i. With
// `partials` the block's sums go to partials[2 * (q * channels + c)], else (one chunk) it
// finishes the channel itself.
template <typename Terms, typename Finish, typename Index>
__global__ void __launch_bounds__(kThreads)
    channel_sums_kernel(Terms terms, Finish finish, Index outer, Index channels, Index inner,
                        Index per_chunk, double* __restrict__ partials) {
  __shared__ double scratch[32];
  const Index per_channel = outer * inner, plane = channels * inner;
  const Index j0 = Index(blockIdx.x) * per_chunk;
  const Index j1 = per_channel - j0 < per_chunk ? per_channel : j0 + per_chunk;
  const Index step = blockDim.x;
  const Index step_o = step / inner, step_i = step % inner;
  // Every thread of the block runs the same channels (block_sum has barriers).
  for (Index c = blockIdx.y; c < channels; c += gridDim.y) {
    Terms t = terms;
    t.init(int64_t(c), int64_t(inner));
    double s = 0.0, q = 0.0;  // (in double, as the host sums)
    Index j = j0 + threadIdx.x;
    if (j < j1) {
      const Index o = j / inner;
      Index i = j - o * inner;
      Index k = (o * channels + c) * inner + i;
      for (; j < j1; j += step) {
        const float2 v = t(int64_t(k));
        s += v.x;
        q += v.y;
        i += step_i;
        k += step_o * plane + step_i;
        if (i >= inner) i -= inner, k += plane - inner;
      }
    }
    const double bs = block_sum(s, scratch);
    const double bq = block_sum(q, scratch);
    if (threadIdx.x == 0) {
      if (partials) {
        partials[2 * (Index(blockIdx.x) * channels + c)] = bs;
        partials[2 * (Index(blockIdx.x) * channels + c) + 1] = bq;
      } else {
        finish(int64_t(c), bs, bq, t.shift());
      }
    }
  }
}

// One thread per channel: adds the chunks' partials in chunk order and finishes the channel.
template <typename Terms, typename Finish>
__global__ void finish_kernel(Terms terms, Finish finish, const double* __restrict__ partials,
                              int64_t chunks, int64_t channels, int64_t inner) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  double s = 0, q = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    s += partials[2 * (k * channels + c)];
    q += partials[2 * (k * channels + c) + 1];
  }
  Terms t = terms;
  t.init(c, inner);
  finish(c, s, q, t.shift());
}

// r (may be null): the residual, added to the normalised value rounded to T (the bits of
// batch_norm then add_).
template <typename T, typename Index, bool kRelu>
__global__ void forward_kernel(const T* __restrict__ x, Index inner, Index channels, Index total,
                               BatchNormParams p, const T* __restrict__ r, T* __restrict__ y) {
  const Index step = Index(blockDim.x) * gridDim.x;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += step) {
    const Index c = (k / inner) % channels;
    const float a = (p.weight ? p.weight[c] : 1.f) / sqrtf(p.var[c] + p.eps);
    const float b = (p.bias ? p.bias[c] : 0.f) - p.mean[c] * a;
    float v = to_float(x[k]) * a + b;
    if (r) v = to_float(from_float<T>(v)) + to_float(r[k]);
    if (kRelu) v = unary_math::relu(v);
    y[k] = from_float<T>(v);
  }
}

// gx = (g - mean_g - (x - mean) k) * weight / std, with k = sum(g xhat) / (n std) and mean_g =
// sum(g) / n from gweight and gbias when `training`; for fixed statistics g * weight / std, as
// PyTorch's (x takes no part: a NaN or infinite x keeps a finite gradient, where (x - mean) * 0
// would be NaN). g is gy masked by !(y <= 0) when y is given, and goes to gr (the residual's
// gradient) when that is given. Either of gx and gr may be null.
template <typename T, typename Index>
__global__ void backward_kernel(const T* __restrict__ gy, const T* __restrict__ x,
                                const T* __restrict__ y, Index inner, Index channels, Index total,
                                BatchNormParams p, bool training, const float* __restrict__ gw,
                                const float* __restrict__ gb, float n, T* __restrict__ gx,
                                T* __restrict__ gr) {
  const Index step = Index(blockDim.x) * gridDim.x;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += step) {
    const Index c = (k / inner) % channels;
    const float g = (!y || !(to_float(y[k]) <= 0.f)) ? to_float(gy[k]) : 0.f;
    if (gr) gr[k] = from_float<T>(g);
    if (!gx) continue;
    const float invstd = 1.f / sqrtf(p.var[c] + p.eps);
    const float a = (p.weight ? p.weight[c] : 1.f) * invstd;
    const float kk = training ? gw[c] * invstd / n : 0.f;
    const float mg = training ? gb[c] / n : 0.f;
    const float centred = training ? (to_float(x[k]) - p.mean[c]) * kk : 0.f;
    gx[k] = from_float<T>((g - mg - centred) * a);
  }
}

__global__ void count_kernel(int64_t* counter) {
  ++*counter;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {

// Each thread of a channel sum adds at least this many elements.
constexpr int64_t kMinPerThread = 4;

template <typename Terms, typename Finish, typename Index>
void launch_sums(Terms terms, Finish finish, BatchNormGeometry g, const char* what,
                 cudaStream_t st) {
  const int64_t C = g.channels, per_channel = g.outer * g.inner;
  // About kFillBlocks blocks in all however few the channels, as long as each thread has some
  // work and the partials fit the scratch: the shape alone decides.
  int64_t chunks =
      std::min((kFillBlocks + C - 1) / C,
               (per_channel + kThreads * kMinPerThread - 1) / (kThreads * kMinPerThread));
  chunks = std::min<int64_t>(chunks, kReduceScratchBytes / (2 * sizeof(double)) / C);
  chunks = std::max<int64_t>(chunks, 1);
  const int64_t per_chunk =
      ((per_channel + chunks - 1) / chunks + kThreads - 1) / kThreads * kThreads;
  chunks = (per_channel + per_chunk - 1) / per_chunk;
  const dim3 grid(static_cast<unsigned>(chunks),
                  static_cast<unsigned>(std::min<int64_t>(C, 65535)));
  if (chunks == 1) {
    channel_sums_kernel<Terms, Finish, Index><<<grid, kThreads, 0, st>>>(
        terms, finish, Index(g.outer), Index(C), Index(g.inner), Index(per_chunk), nullptr);
    return;
  }
  ReduceScratch scratch(st, size_t(2 * chunks * C) * sizeof(double), what);
  double* partials = static_cast<double*>(scratch.get());
  if (!partials) return;
  channel_sums_kernel<Terms, Finish, Index><<<grid, kThreads, 0, st>>>(
      terms, finish, Index(g.outer), Index(C), Index(g.inner), Index(per_chunk), partials);
  finish_kernel<<<blocks_for(C), kThreads, 0, st>>>(terms, finish, partials, chunks, C, g.inner);
}

}  // namespace

void batch_norm_stats(DType dtype, const void* x, BatchNormGeometry g, BatchNormRunning running,
                      float* mean, float* var, void* stream) {
  const int64_t total = g.outer * g.channels * g.inner;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    StatsTerms<T> terms{static_cast<const T*>(x)};
    StatsFinish finish{g.outer * g.inner, mean, var, running};
    if (total <= INT32_MAX)
      launch_sums<StatsTerms<T>, StatsFinish, uint32_t>(terms, finish, g, "batch_norm", st);
    else
      launch_sums<StatsTerms<T>, StatsFinish, uint64_t>(terms, finish, g, "batch_norm", st);
  });
}

void batch_norm_forward(DType dtype, const void* x, BatchNormGeometry g, BatchNormParams p,
                        bool relu, void* y, const void* residual, void* stream) {
  const int64_t total = g.outer * g.channels * g.inner;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    const T* pr = static_cast<const T*>(residual);
    T* py = static_cast<T*>(y);
    auto launch = [&](auto index) {
      using Index = decltype(index);
      const Index inner = Index(g.inner), channels = Index(g.channels), n = Index(total);
      if (relu)
        forward_kernel<T, Index, true>
            <<<blocks_for(total), kThreads, 0, st>>>(px, inner, channels, n, p, pr, py);
      else
        forward_kernel<T, Index, false>
            <<<blocks_for(total), kThreads, 0, st>>>(px, inner, channels, n, p, pr, py);
    };
    if (total <= INT32_MAX)
      launch(uint32_t{});
    else
      launch(uint64_t{});
  });
}

void batch_norm_backward(DType dtype, const void* gy, const void* x, const void* y,
                         BatchNormGeometry g, BatchNormParams p, bool training, void* gx,
                         float* gweight, float* gbias, void* gresidual, void* stream) {
  const int64_t total = g.outer * g.channels * g.inner;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = static_cast<const T*>(gy);
    const T* px = static_cast<const T*>(x);
    const T* pyy = static_cast<const T*>(y);
    if (gweight || gbias) {
      GradTerms<T> terms{pg, px, pyy, p.mean};
      GradFinish finish{p.var, p.eps, gweight, gbias};
      if (total <= INT32_MAX)
        launch_sums<GradTerms<T>, GradFinish, uint32_t>(terms, finish, g, "batch_norm_backward",
                                                        st);
      else
        launch_sums<GradTerms<T>, GradFinish, uint64_t>(terms, finish, g, "batch_norm_backward",
                                                        st);
    }
    if (!gx && !gresidual) return;
    const float n = float(g.outer * g.inner);
    auto launch = [&](auto index) {
      using Index = decltype(index);
      backward_kernel<T, Index><<<blocks_for(total), kThreads, 0, st>>>(
          pg, px, pyy, Index(g.inner), Index(g.channels), Index(total), p, training, gweight, gbias,
          n, static_cast<T*>(gx), static_cast<T*>(gresidual));
    };
    if (total <= INT32_MAX)
      launch(uint32_t{});
    else
      launch(uint64_t{});
  });
}

void batch_norm_count(int64_t* counter, void* stream) {
  count_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(counter);
}

}  // namespace galley::kernels::cuda
