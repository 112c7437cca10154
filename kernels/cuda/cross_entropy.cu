// Fused softmax cross-entropy over logits [n, c] with label smoothing and ignore_index, forward
// and backward: the GPU side of kernels/cpu/cross_entropy.cpp, with the same arithmetic (row
// max in float, exponentials and sums in double, the same final roundings).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/launch.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

constexpr int64_t kWarpRowMax = 1024;  // up to this many classes a warp per row, else a block

// std::max(a, b): b only when a < b, so a NaN never replaces a number.
struct MaxOp {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MinOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a < b ? a : b;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_all(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over a warp or the block, result in every thread, warps folded in order
// (deterministic); ends with a barrier so `scratch` (32 entries) can be reused.
template <bool kWarp, typename T, typename Op>
__device__ __forceinline__ T group_all(T v, Op op, T* scratch) {
  v = warp_all(v, op);
  if constexpr (!kWarp) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < warps; ++w) v = op(v, scratch[w]);
    __syncthreads();
  }
  return v;
}

// The last block counts the rows that are not ignored and finds the first bad label; the
// others take one row per group (warp or block). One launch, no atomics, no memset.
template <bool kWarp>
__global__ void __launch_bounds__(1024)
    cross_entropy_forward_kernel(const float* __restrict__ logits,
                                 const int64_t* __restrict__ labels, int64_t n, int64_t c,
                                 float eps, int64_t ignore_index, float* __restrict__ loss,
                                 float* __restrict__ prob, int64_t* __restrict__ count,
                                 int64_t* __restrict__ bad_row, int64_t* error_slot) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[2][32];
  __shared__ unsigned long long uscratch[32];
  if (blockIdx.x == gridDim.x - 1) {
    unsigned long long valid = 0, first_bad = ~0ull;  // ~0: none (and -1 as int64)
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const int64_t y = labels[i];
      if (y == ignore_index) continue;
      if (y < 0 || y >= c)
        first_bad = min(first_bad, static_cast<unsigned long long>(i));
      else
        ++valid;
    }
    // Full-block reductions: the kWarp=false form (all warps of this block take part).
    valid = group_all<false>(valid, SumOp{}, uscratch);
    first_bad = group_all<false>(first_bad, MinOp{}, uscratch);
    if (threadIdx.x == 0) {
      *count = static_cast<int64_t>(valid);
      *bad_row = static_cast<int64_t>(first_bad);
      // The host hears of a bad label at its next synchronisation; the first report stays
      // until it has been read.
      if (error_slot && first_bad != ~0ull && error_slot[0] == 0) {
        error_slot[1] = static_cast<int64_t>(first_bad);
        error_slot[2] = labels[first_bad];
        error_slot[3] = c;
        __threadfence_system();
        error_slot[0] = 1;  // DeferredError::LabelOutOfRange
      }
    }
    return;
  }
  const int64_t group = kWarp ? 32 : blockDim.x;
  const int64_t lane = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t per_block = kWarp ? blockDim.x / 32 : 1;
  const int64_t row_blocks = gridDim.x - 1;
  for (int64_t r = blockIdx.x * per_block + (kWarp ? threadIdx.x / 32 : 0); r < n;
       r += row_blocks * per_block) {
    const float* x = logits + r * c;
    float* p = prob + r * c;
    float m = -INFINITY;
    for (int64_t j = lane; j < c; j += group) m = MaxOp{}(m, x[j]);
    m = group_all<kWarp>(m, MaxOp{}, fscratch);
    double s = 0.0, sum_x = 0.0;
    for (int64_t j = lane; j < c; j += group) {
      s += exp(double(x[j]) - m);
      sum_x += x[j];
    }
    s = group_all<kWarp>(s, SumOp{}, dscratch[0]);
    sum_x = group_all<kWarp>(sum_x, SumOp{}, dscratch[1]);
    const float inv = static_cast<float>(1.0 / s);
    for (int64_t j = lane; j < c; j += group)
      p[j] = static_cast<float>(exp(double(x[j]) - m)) * inv;
    if (lane == 0) {
      const int64_t y = labels[r];
      float l = 0.f;
      if (y != ignore_index && y >= 0 && y < c) {
        const double lse = m + ::log(s);
        const double nll = lse - x[y];
        const double smooth = lse - sum_x / double(c);  // mean over classes of -log p
        // nll alone without smoothing, as the host: a -inf logit makes smooth infinite.
        l = static_cast<float>(eps > 0 ? (1.0 - eps) * nll + eps * smooth : nll);
      }
      loss[r] = l;
    }
  }
}

// gx[i, j] = row_scale[i] * (prob[i, j] - eps / c) - row_scale[i] * (1 - eps) [j == label],
// zero on ignored and bad rows.
template <typename Index>
__global__ void cross_entropy_backward_kernel(const float* __restrict__ prob,
                                              const int64_t* __restrict__ labels,
                                              const float* __restrict__ row_scale, Index c,
                                              Index total, float eps, float off,
                                              int64_t ignore_index, float* __restrict__ gx) {
  const Index stride = Index(blockDim.x) * gridDim.x;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const Index i = k / c, j = k - i * c;
    const int64_t y = __ldg(labels + i);
    float g = 0.f;
    if (y != ignore_index && y >= 0 && y < int64_t(c)) {
      const float s = __ldg(row_scale + i);
      g = s * (prob[k] - off);
      if (int64_t(j) == y) g -= s * (1.f - eps);
    }
    gx[k] = g;
  }
}

__global__ void fill_scaled_kernel(const float* __restrict__ scalar, float factor,
                                   const int64_t* __restrict__ count, float* __restrict__ out,
                                   int64_t n) {
  float v = *scalar * factor;
  if (count) v = *count > 0 ? v / static_cast<float>(*count) : 0.f;
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = v;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void cross_entropy_forward(const float* logits, const int64_t* labels, int64_t n, int64_t c,
                           float eps, int64_t ignore_index, float* loss, float* prob,
                           int64_t* count, int64_t* bad_row, int64_t* error_slot, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  n = std::max<int64_t>(n, 0);
  // One more block than the rows need: it scans the labels (also when n == 0, to write the
  // scalars).
  if (c <= kWarpRowMax) {
    const int rows_blocks = n ? blocks_for(n, kThreads / 32) : 0;
    cross_entropy_forward_kernel<true><<<rows_blocks + 1, kThreads, 0, st>>>(
        logits, labels, n, c, eps, ignore_index, loss, prob, count, bad_row, error_slot);
  } else {
    const int threads = c <= 4096 ? 256 : c <= 16384 ? 512 : 1024;
    const int rows_blocks = n ? blocks_for(n, 1) : 0;
    cross_entropy_forward_kernel<false><<<rows_blocks + 1, threads, 0, st>>>(
        logits, labels, n, c, eps, ignore_index, loss, prob, count, bad_row, error_slot);
  }
}

void cross_entropy_backward(const float* prob, const int64_t* labels, const float* row_scale,
                            int64_t n, int64_t c, float eps, int64_t ignore_index, float* gx,
                            void* stream) {
  const int64_t total = n * c;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const float off = eps / float(c);
  if (total <= INT32_MAX)
    cross_entropy_backward_kernel<uint32_t><<<blocks_for(total, kThreads), kThreads, 0, st>>>(
        prob, labels, row_scale, uint32_t(c), uint32_t(total), eps, off, ignore_index, gx);
  else
    cross_entropy_backward_kernel<int64_t><<<blocks_for(total, kThreads), kThreads, 0, st>>>(
        prob, labels, row_scale, c, total, eps, off, ignore_index, gx);
}

void fill_scaled(const float* scalar, float factor, const int64_t* count, float* out, int64_t n,
                 void* stream) {
  if (n <= 0) return;
  fill_scaled_kernel<<<blocks_for(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      scalar, factor, count, out, n);
}

}  // namespace galley::kernels::cuda
