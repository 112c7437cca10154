// Bias add and ReLU in one pass on the GPU: the CUDA side of kernels/cpu/bias_relu.cpp.
//
// Element k of [outer, channels, inner] has channel (k / inner) % channels. Neither kernel
// divides per element: each thread works out its first element's position once and then
// advances it by a fixed step, in 32-bit arithmetic unless the tensor has 2^31 elements or more.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/bias_relu.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/reduce.h"
#include "kernels/unary.h"
#include "kernels/unary_math.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

__device__ __forceinline__ float bias_relu(float x, float b) {
  return unary_math::relu(x + b);
}
__device__ __forceinline__ float4 bias_relu(float4 x, float b) {
  return make_float4(bias_relu(x.x, b), bias_relu(x.y, b), bias_relu(x.z, b), bias_relu(x.w, b));
}

// Grid-stride over units V of x (float4 when inner is a multiple of 4; inner counts units).
// Elementwise, so any grid fills the GPU, and neighbouring threads stay on neighbouring
// elements whatever inner is (a channel-by-channel walk would read a linear layer's features,
// inner == 1, `channels` apart). The thread's position in its plane, i, and its channel, c,
// follow k: the step moves them by step % inner and (step / inner) % channels, plus a carry.
template <typename V, typename Index>
__global__ void bias_relu_forward_kernel(const V* __restrict__ x, const float* __restrict__ b,
                                         Index inner, Index channels, Index total,
                                         V* __restrict__ y) {
  const Index step = Index(blockDim.x) * gridDim.x;
  Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= total) return;
  Index i = k % inner, c = (k / inner) % channels;
  const Index step_i = step % inner, step_c = (step / inner) % channels;
  for (; k < total; k += step) {
    y[k] = bias_relu(x[k], __ldg(b + c));
    i += step_i;
    c += step_c;
    if (i >= inner) i -= inner, ++c;
    if (c >= channels) c -= channels;  // c < 2 * channels: step_c < channels, plus one carry
  }
}

// Backward for inner > 1. Block (q, c) takes chunk q, indices [q * per_chunk, (q + 1) *
// per_chunk), of channel c's outer * inner elements j = o * inner + i, at offset
// (o * channels + c) * inner + i: contiguous runs of inner. It masks them, and when `sums` is
// given adds its share by a fixed tree into sums[q * channels + c] (gb itself when there is one
// chunk, else partials that sum_partials adds in a fixed order: the same bits at every run).
// Channels beyond the grid's rows are walked grid-stride. Index is unsigned, so that the offset
// stepping past the end on the last iteration wraps harmlessly.
template <typename Index>
__global__ void __launch_bounds__(kThreads)
    bias_relu_backward_kernel(const float* gy, const float* __restrict__ y, Index outer,
                              Index channels, Index inner, Index per_chunk, float* gx,
                              float* __restrict__ sums) {
  __shared__ double scratch[32];
  const Index per_channel = outer * inner, plane = channels * inner;
  const Index j0 = Index(blockIdx.x) * per_chunk;
  const Index j1 = per_channel - j0 < per_chunk ? per_channel : j0 + per_chunk;
  const Index step = blockDim.x;
  const Index step_o = step / inner, step_i = step % inner;
  // Every thread of the block runs the same channels (block_sum has barriers).
  for (Index c = blockIdx.y; c < channels; c += gridDim.y) {
    double part = 0.0;  // (in double, as the host sums)
    Index j = j0 + threadIdx.x;
    if (j < j1) {
      const Index o = j / inner;
      Index i = j - o * inner;
      Index k = (o * channels + c) * inner + i;
      for (; j < j1; j += step) {
        const float g = unary_math::relu_backward(gy[k], y[k]);
        gx[k] = g;
        part += g;
        i += step_i;
        k += step_o * plane + step_i;
        if (i >= inner) i -= inner, k += plane - inner;
      }
    }
    if (sums) {
      part = block_sum(part, scratch);
      if (threadIdx.x == 0) sums[Index(blockIdx.x) * channels + c] = part;
    }
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {

// Each thread of the backward masks at least this many elements of its channel.
constexpr int64_t kMinPerThread = 4;

template <typename V, typename Index>
void launch_forward(const float* x, const float* b, int64_t channels, int64_t inner, int64_t total,
                    float* y, cudaStream_t st) {
  constexpr int64_t w = sizeof(V) / sizeof(float);
  bias_relu_forward_kernel<V, Index><<<blocks_for(total / w), kThreads, 0, st>>>(
      reinterpret_cast<const V*>(x), b, Index(inner / w), Index(channels), Index(total / w),
      reinterpret_cast<V*>(y));
}

template <typename Index>
void launch_backward(const float* gy, const float* y, int64_t outer, int64_t channels,
                     int64_t inner, float* gx, float* gb, cudaStream_t st) {
  // Chunks per channel: about kFillBlocks blocks in all, however few the channels, as long as
  // each thread has some work and the partials fit the scratch. The shape alone decides, so
  // the bits of gb do not depend on the GPU.
  const int64_t per_channel = outer * inner;
  int64_t chunks =
      std::min((kFillBlocks + channels - 1) / channels,
               (per_channel + kThreads * kMinPerThread - 1) / (kThreads * kMinPerThread));
  if (gb) chunks = std::min<int64_t>(chunks, kReduceScratchBytes / sizeof(float) / channels);
  chunks = std::max<int64_t>(chunks, 1);
  // Whole rounds of the block per chunk.
  const int64_t per_chunk =
      ((per_channel + chunks - 1) / chunks + kThreads - 1) / kThreads * kThreads;
  chunks = (per_channel + per_chunk - 1) / per_chunk;
  const dim3 grid(static_cast<unsigned>(chunks),
                  static_cast<unsigned>(std::min<int64_t>(channels, 65535)));
  if (!gb || chunks == 1) {
    bias_relu_backward_kernel<Index><<<grid, kThreads, 0, st>>>(
        gy, y, Index(outer), Index(channels), Index(inner), Index(per_chunk), gx, gb);
    return;
  }
  ReduceScratch scratch(st, size_t(chunks * channels) * sizeof(float), "bias_relu_backward");
  float* partials = static_cast<float*>(scratch.get());
  if (!partials) return;
  bias_relu_backward_kernel<Index><<<grid, kThreads, 0, st>>>(
      gy, y, Index(outer), Index(channels), Index(inner), Index(per_chunk), gx, partials);
  sum_partials(partials, chunks, channels, 1.f, /*accumulate=*/false, gb, st);
}

}  // namespace

void bias_relu_forward(const float* x, const float* b, int64_t outer, int64_t channels,
                       int64_t inner, float* y, void* stream) {
  const int64_t total = outer * channels * inner;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool small = total <= INT32_MAX;
  if (inner % 4 == 0 && aligned16(x) && aligned16(y)) {
    if (small)
      launch_forward<float4, uint32_t>(x, b, channels, inner, total, y, st);
    else
      launch_forward<float4, int64_t>(x, b, channels, inner, total, y, st);
  } else if (small) {
    launch_forward<float, uint32_t>(x, b, channels, inner, total, y, st);
  } else {
    launch_forward<float, int64_t>(x, b, channels, inner, total, y, st);
  }
}

void bias_relu_backward(const float* gy, const float* y, int64_t outer, int64_t channels,
                        int64_t inner, float* gx, float* gb, void* stream) {
  const int64_t total = outer * channels * inner;
  if (total <= 0) return;
  if (inner == 1) {
    // Features of a linear layer: a channel's elements are `channels` apart, which a walk by
    // channel would read uncoalesced. Mask the whole matrix, then sum its columns (split over
    // the rows when they are many).
    relu_backward(DType::Float32, gy, y, gx, total, stream);
    if (gb) column_sums(gx, outer, channels, gb, /*accumulate=*/false, stream);
    return;
  }
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (total <= INT32_MAX)
    launch_backward<uint32_t>(gy, y, outer, channels, inner, gx, gb, st);
  else
    launch_backward<uint64_t>(gy, y, outer, channels, inner, gx, gb, st);
}

}  // namespace galley::kernels::cuda
