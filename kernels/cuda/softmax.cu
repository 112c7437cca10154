// Softmax and log-softmax along one dimension, forward and backward: the GPU side of
// kernels/cpu/softmax.cpp, with the same formulas (max in float ignoring NaNs as std::max
// does, exponentials and sums in double, the same final roundings); the sums' order and CUDA's
// exponentials differ from the host's, so results may differ in the last bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/softmax.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

constexpr int64_t kWarpRowMax = 1024;  // rows up to this long get a warp, longer ones a block

// std::max(a, b): b only when a < b, so a NaN never replaces a number.
struct MaxOp {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }
};
struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// Butterfly over the warp: every lane ends with the same bits (each step is commutative).
template <typename T, typename Op>
__device__ __forceinline__ T warp_all(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over the row's group (a warp, or the block), result in every thread. The block
// form folds the warps' results in warp order, so it is deterministic; it ends with a barrier
// so `scratch` (32 entries) can be reused at once.
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

// One group per contiguous row (inner == 1). x and y may be the same buffer: every element is
// read and written by one thread, reads first.
template <bool kWarp>
__global__ void __launch_bounds__(1024)
    softmax_rows_kernel(const float* x, int64_t rows, int64_t len, bool log, float* y) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const int64_t group = kWarp ? 32 : blockDim.x;
  const int64_t lane = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t per_block = kWarp ? blockDim.x / 32 : 1;
  for (int64_t r = blockIdx.x * per_block + (kWarp ? threadIdx.x / 32 : 0); r < rows;
       r += gridDim.x * per_block) {
    const float* xr = x + r * len;
    float* yr = y + r * len;
    float m = -INFINITY;
    for (int64_t l = lane; l < len; l += group) m = MaxOp{}(m, xr[l]);
    m = group_all<kWarp>(m, MaxOp{}, fscratch);
    double s = 0.0;
    for (int64_t l = lane; l < len; l += group) s += exp(double(xr[l]) - m);
    s = group_all<kWarp>(s, SumOp{}, dscratch);
    if (log) {  // (x - m) - log s, as the CPU kernel
      const float ls = static_cast<float>(::log(s));
      for (int64_t l = lane; l < len; l += group) yr[l] = (xr[l] - m) - ls;
    } else {
      const double inv = 1.0 / s;
      for (int64_t l = lane; l < len; l += group)
        yr[l] = static_cast<float>(exp(double(xr[l]) - m) * inv);
    }
  }
}

// Softmax: gx = y * (gy - sum(gy * y)); log-softmax: gx = gy - exp(y) * sum(gy).
template <bool kWarp>
__global__ void __launch_bounds__(1024)
    softmax_backward_rows_kernel(const float* y, const float* gy, int64_t rows, int64_t len,
                                 bool log, float* gx) {
  __shared__ double dscratch[32];
  const int64_t group = kWarp ? 32 : blockDim.x;
  const int64_t lane = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const int64_t per_block = kWarp ? blockDim.x / 32 : 1;
  for (int64_t r = blockIdx.x * per_block + (kWarp ? threadIdx.x / 32 : 0); r < rows;
       r += gridDim.x * per_block) {
    const float* yr = y + r * len;
    const float* gr = gy + r * len;
    float* out = gx + r * len;
    double s = 0.0;
    if (log) {
      for (int64_t l = lane; l < len; l += group) s += gr[l];
    } else {
      for (int64_t l = lane; l < len; l += group) s += double(gr[l]) * yr[l];
    }
    const float sf = static_cast<float>(group_all<kWarp>(s, SumOp{}, dscratch));
    if (log) {
      for (int64_t l = lane; l < len; l += group) out[l] = gr[l] - expf(yr[l]) * sf;
    } else {
      for (int64_t l = lane; l < len; l += group) out[l] = yr[l] * (gr[l] - sf);
    }
  }
}

// inner > 1: one thread per (o, i) walking l in order, coalesced across i; the CPU loop as is.
__global__ void softmax_columns_kernel(const float* x, int64_t outer, int64_t len, int64_t inner,
                                       bool log, float* y) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < outer * inner; r += stride) {
    const int64_t o = r / inner, i = r % inner;
    const float* xp = x + o * len * inner + i;
    float* yp = y + o * len * inner + i;
    float m = -INFINITY;
    for (int64_t l = 0; l < len; ++l) m = MaxOp{}(m, xp[l * inner]);
    double s = 0.0;
    for (int64_t l = 0; l < len; ++l) s += exp(double(xp[l * inner]) - m);
    if (log) {
      const float ls = static_cast<float>(::log(s));
      for (int64_t l = 0; l < len; ++l) yp[l * inner] = (xp[l * inner] - m) - ls;
    } else {
      const double inv = 1.0 / s;
      for (int64_t l = 0; l < len; ++l)
        yp[l * inner] = static_cast<float>(exp(double(xp[l * inner]) - m) * inv);
    }
  }
}

__global__ void softmax_backward_columns_kernel(const float* y, const float* gy, int64_t outer,
                                                int64_t len, int64_t inner, bool log, float* gx) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < outer * inner; r += stride) {
    const int64_t o = r / inner, i = r % inner, base = o * len * inner + i;
    double s = 0.0;
    if (log) {
      for (int64_t l = 0; l < len; ++l) s += gy[base + l * inner];
      for (int64_t l = 0; l < len; ++l) {
        const int64_t k = base + l * inner;
        gx[k] = gy[k] - expf(y[k]) * static_cast<float>(s);
      }
    } else {
      for (int64_t l = 0; l < len; ++l) s += double(gy[base + l * inner]) * y[base + l * inner];
      for (int64_t l = 0; l < len; ++l) {
        const int64_t k = base + l * inner;
        gx[k] = y[k] * (gy[k] - static_cast<float>(s));
      }
    }
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {

int row_block_threads(int64_t len) {
  return len <= 4096 ? 256 : len <= 16384 ? 512 : 1024;
}

}  // namespace

void softmax_forward(const float* x, int64_t outer, int64_t len, int64_t inner, bool log, float* y,
                     void* stream) {
  if (outer * len * inner <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (inner > 1) {
    softmax_columns_kernel<<<blocks_for(outer * inner, kThreads), kThreads, 0, st>>>(x, outer, len,
                                                                                     inner, log, y);
  } else if (len <= kWarpRowMax) {
    softmax_rows_kernel<true>
        <<<blocks_for(outer, kThreads / 32), kThreads, 0, st>>>(x, outer, len, log, y);
  } else {
    softmax_rows_kernel<false>
        <<<blocks_for(outer, 1), row_block_threads(len), 0, st>>>(x, outer, len, log, y);
  }
}

void softmax_backward(const float* y, const float* gy, int64_t outer, int64_t len, int64_t inner,
                      bool log, float* gx, void* stream) {
  if (outer * len * inner <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (inner > 1) {
    softmax_backward_columns_kernel<<<blocks_for(outer * inner, kThreads), kThreads, 0, st>>>(
        y, gy, outer, len, inner, log, gx);
  } else if (len <= kWarpRowMax) {
    softmax_backward_rows_kernel<true>
        <<<blocks_for(outer, kThreads / 32), kThreads, 0, st>>>(y, gy, outer, len, log, gx);
  } else {
    softmax_backward_rows_kernel<false>
        <<<blocks_for(outer, 1), row_block_threads(len), 0, st>>>(y, gy, outer, len, log, gx);
  }
}

}  // namespace galley::kernels::cuda
