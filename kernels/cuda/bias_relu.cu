// Bias add and ReLU in one pass on the GPU: the CUDA side of kernels/cpu/bias_relu.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/launch.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

__global__ void bias_relu_forward_kernel(const float* __restrict__ x, const float* __restrict__ b,
                                         int64_t channels, int64_t inner, int64_t total,
                                         float* __restrict__ y) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    // As relu: `!(v <= 0)` keeps a NaN (fmaxf would drop it).
    const float v = x[k] + __ldg(b + (k / inner) % channels);
    y[k] = !(v <= 0.f) ? v : 0.f;
  }
}

// One block per channel: it masks the channel's gradient and sums it (a fixed order, so the
// bias gradient is the same at every run).
__global__ void bias_relu_backward_kernel(const float* gy, const float* __restrict__ y,
                                          int64_t outer, int64_t channels, int64_t inner, float* gx,
                                          float* __restrict__ gb) {
  const int64_t c = blockIdx.x;
  const int64_t per_channel = outer * inner;
  float part = 0.f;
  for (int64_t j = threadIdx.x; j < per_channel; j += blockDim.x) {
    const int64_t o = j / inner, i = j - o * inner;
    const int64_t k = (o * channels + c) * inner + i;
    const float g = y[k] > 0.f ? gy[k] : 0.f;
    gx[k] = g;
    part += g;
  }
  if (!gb) return;
  __shared__ float warp_sums[kThreads / 32];
  for (int off = 16; off > 0; off /= 2) part += __shfl_down_sync(0xffffffffu, part, off);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = part;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) sum += warp_sums[w];
    gb[c] = sum;
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void bias_relu_forward(const float* x, const float* b, int64_t outer, int64_t channels,
                       int64_t inner, float* y, void* stream) {
  const int64_t total = outer * channels * inner;
  if (total <= 0) return;
  bias_relu_forward_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, b, channels, inner, total, y);
}

void bias_relu_backward(const float* gy, const float* y, int64_t outer, int64_t channels,
                        int64_t inner, float* gx, float* gb, void* stream) {
  if (outer * channels * inner <= 0) return;
  if (inner == 1) {
    // Features of a linear layer: a channel's elements are `channels` apart, which one block per
    // channel would read uncoalesced. Mask the whole matrix, then sum its columns.
    relu_backward(gy, y, gx, outer * channels, stream);
    if (gb) column_sums(gx, outer, channels, gb, /*accumulate=*/false, stream);
    return;
  }
  bias_relu_backward_kernel<<<static_cast<unsigned>(channels), kThreads, 0,
                              static_cast<cudaStream_t>(stream)>>>(gy, y, outer, channels, inner,
                                                                   gx, gb);
}

}  // namespace galley::kernels::cuda
