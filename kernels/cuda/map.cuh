#pragma once
// Elementwise maps over same-shape float arrays, shared by the unary and binary ops (included
// by .cu files only): out = f(a) and out = f(a, b), float4 at a time where every pointer is
// 16-byte aligned. No __restrict__: out may alias an input (in-place ops); each element is read
// before the same thread writes it.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

template <typename F, bool kVec>
__global__ void map_kernel(const float* a, float* out, int64_t n, F f) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = start; i < n4; i += stride) {
      const float4 v = a4[i];
      o4[i] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
    }
    tail = n4 * 4;
  }
  for (int64_t i = tail + start; i < n; i += stride) out[i] = f(a[i]);
}

template <typename F, bool kVec>
__global__ void zip_kernel(const float* a, const float* b, float* out, int64_t n, F f) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = start; i < n4; i += stride) {
      const float4 x = a4[i], y = b4[i];
      o4[i] = make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w));
    }
    tail = n4 * 4;
  }
  for (int64_t i = tail + start; i < n; i += stride) out[i] = f(a[i], b[i]);
}

// ----------------------------------------------------------------------------------------------
// launchers

template <typename F>
void launch_map(const float* a, float* out, int64_t n, F f, cudaStream_t st) {
  if (n <= 0) return;
  if (aligned16(a) && aligned16(out))
    map_kernel<F, true><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(a, out, n, f);
  else
    map_kernel<F, false><<<blocks_for(n), kThreads, 0, st>>>(a, out, n, f);
}

template <typename F>
void launch_zip(const float* a, const float* b, float* out, int64_t n, F f, cudaStream_t st) {
  if (n <= 0) return;
  if (aligned16(a) && aligned16(b) && aligned16(out))
    zip_kernel<F, true><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(a, b, out, n, f);
  else
    zip_kernel<F, false><<<blocks_for(n), kThreads, 0, st>>>(a, b, out, n, f);
}

}  // namespace galley::kernels::cuda
