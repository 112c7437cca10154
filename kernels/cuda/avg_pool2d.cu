// 2-D average pooling (NCHW; float32, bfloat16 or float16 computed in float32): the GPU side of
// kernels/cpu/avg_pool2d.cpp, with the windows of kernels/avg_pool2d.h. The backward gathers,
// for each input element, the windows holding it in output order: the CPU's scatter order, so
// both give the same bits, with no atomics.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/avg_pool2d.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/map.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

// One output per thread: the window summed row by row, divided by its count.
template <typename T>
__global__ void pool_kernel(const T* __restrict__ x, AvgPool2dGeometry g, T* __restrict__ y) {
  const int64_t out_plane = g.oh * g.ow, total = g.planes * out_plane;
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t p = k / out_plane, rem = k - p * out_plane;
    const int64_t oh = rem / g.ow, ow = rem - oh * g.ow;
    const PoolWindow r = avg_pool_window(g, oh, g.h, g.oh);
    const PoolWindow c = avg_pool_window(g, ow, g.w, g.ow);
    const T* xp = x + p * g.h * g.w;
    float s = 0.f;
    for (int64_t ih = r.start; ih < r.end; ++ih)
      for (int64_t iw = c.start; iw < c.end; ++iw) s += to_float(xp[ih * g.w + iw]);
    y[k] = from_float<T>(avg_pool_divide(g, s, r, c));
  }
}

// Global average pooling: one warp per plane, lanes striding over it, a fixed shuffle tree.
template <typename T>
__global__ void global_pool_kernel(const T* __restrict__ x, int64_t planes, int64_t n,
                                   T* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t(blockDim.x) * gridDim.x) >> 5;
  for (int64_t p = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; p < planes; p += warps) {
    const T* xp = x + p * n;
    float s = 0.f;
    for (int64_t i = lane; i < n; i += 32) s += to_float(xp[i]);
    s = warp_sum(s);
    if (lane == 0) y[p] = from_float<T>(s / float(n));
  }
}

// One input element per thread: the sum over the windows holding it of gy / count.
template <typename T>
__global__ void unpool_kernel(const T* __restrict__ gy, AvgPool2dGeometry g, T* __restrict__ gx) {
  const int64_t in_plane = g.h * g.w, total = g.planes * in_plane;
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t p = k / in_plane, me = k - p * in_plane;
    const int64_t ih = me / g.w, iw = me - ih * g.w;
    int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    avg_pool_outputs_of(g, ih, g.h, g.oh, &oh_lo, &oh_hi);
    avg_pool_outputs_of(g, iw, g.w, g.ow, &ow_lo, &ow_hi);
    const T* gyp = gy + p * g.oh * g.ow;
    float acc = 0.f;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      const PoolWindow r = avg_pool_window(g, oh, g.h, g.oh);
      if (ih < r.start || ih >= r.end) continue;
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const PoolWindow c = avg_pool_window(g, ow, g.w, g.ow);
        if (iw < c.start || iw >= c.end) continue;
        acc += avg_pool_divide(g, to_float(gyp[oh * g.ow + ow]), r, c);
      }
    }
    gx[k] = from_float<T>(acc);
  }
}

template <typename T>
__global__ void global_unpool_kernel(const T* __restrict__ gy, int64_t planes, int64_t n,
                                     T* __restrict__ gx) {
  const int64_t total = planes * n, stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride)
    gx[k] = from_float<T>(to_float(gy[k / n]) / float(n));
}

bool is_global(const AvgPool2dGeometry& g) {
  return g.k == 0 && g.oh == 1 && g.ow == 1;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void avg_pool2d_forward(const AvgPool2dGeometry& g, DType dtype, const void* x, void* y,
                        void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (g.planes <= 0 || g.oh * g.ow <= 0) return;
    if (is_global(g))
      global_pool_kernel<T>
          <<<blocks_for(g.planes * 32), kThreads, 0, st>>>(px, g.planes, g.h * g.w, py);
    else
      pool_kernel<T><<<blocks_for(g.planes * g.oh * g.ow), kThreads, 0, st>>>(px, g, py);
  });
}

void avg_pool2d_backward(const AvgPool2dGeometry& g, DType dtype, const void* gy, void* gx,
                         void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pgy = static_cast<const T*>(gy);
    T* pgx = static_cast<T*>(gx);
    const int64_t total = g.planes * g.h * g.w;
    if (total <= 0) return;
    if (is_global(g))
      global_unpool_kernel<T>
          <<<blocks_for(total), kThreads, 0, st>>>(pgy, g.planes, g.h * g.w, pgx);
    else
      unpool_kernel<T><<<blocks_for(total), kThreads, 0, st>>>(pgy, g, pgx);
  });
}

}  // namespace galley::kernels::cuda
