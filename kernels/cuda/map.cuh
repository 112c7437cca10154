#pragma once
// Elementwise maps over same-shape arrays of float32, bfloat16 or float16, shared by the unary
// and binary ops (included by .cu files only): out = f(a) and out = f(a, b), computed in float32
// and stored in the arrays' element type. float32 goes float4 at a time where every pointer is
// 16-byte aligned; the 16-bit types take the plain grid-stride loop. No __restrict__: out may
// alias an input (in-place ops); each element is read before the same thread writes it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "galley/dtype.h"
#include "galley/error.h"
#include "galley/half.h"
#include "kernels/cuda/launch.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// element types

// An element as the float32 it is computed in, and a float32 result stored as element type T
// (round to nearest even, as galley/half.h and the CPU kernels do). Identities for float.
__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// The CUDA element type of a galley element type (same 16-bit storage).
template <typename T>
struct cuda_type {
  using type = T;
};
template <>
struct cuda_type<bfloat16> {
  using type = __nv_bfloat16;
};
template <>
struct cuda_type<float16> {
  using type = __half;
};

// Calls `f(type_tag<T>{})` with T the CUDA element type of floating dtype `dtype` (float,
// __nv_bfloat16 or __half), through galley's one dispatch_floating. Any other dtype is an error
// naming `op`.
template <typename F>
void with_floating_type(DType dtype, const char* op, F&& f) {
  dispatch_floating(dtype, op, [&](auto tag) {
    f(type_tag<typename cuda_type<typename decltype(tag)::type>::type>{});
  });
}

// ----------------------------------------------------------------------------------------------
// kernels

// kVec (float only): float4 loads and stores, then the tail one element at a time.
template <typename T, typename F, bool kVec>
__global__ void map_kernel(const T* a, T* out, int64_t n, F f) {
  static_assert(!kVec || std::is_same_v<T, float>, "map_kernel: only float is vectorised");
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
  for (int64_t i = tail + start; i < n; i += stride) out[i] = from_float<T>(f(to_float(a[i])));
}

template <typename T, typename F, bool kVec>
__global__ void zip_kernel(const T* a, const T* b, T* out, int64_t n, F f) {
  static_assert(!kVec || std::is_same_v<T, float>, "zip_kernel: only float is vectorised");
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
  for (int64_t i = tail + start; i < n; i += stride)
    out[i] = from_float<T>(f(to_float(a[i]), to_float(b[i])));
}

// ----------------------------------------------------------------------------------------------
// launchers

template <typename T, typename F>
void launch_map(const T* a, T* out, int64_t n, F f, cudaStream_t st) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (aligned16(a) && aligned16(out)) {
      map_kernel<T, F, true><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(a, out, n, f);
      return;
    }
  }
  map_kernel<T, F, false><<<blocks_for(n), kThreads, 0, st>>>(a, out, n, f);
}

template <typename T, typename F>
void launch_zip(const T* a, const T* b, T* out, int64_t n, F f, cudaStream_t st) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (aligned16(a) && aligned16(b) && aligned16(out)) {
      zip_kernel<T, F, true><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(a, b, out, n, f);
      return;
    }
  }
  zip_kernel<T, F, false><<<blocks_for(n), kThreads, 0, st>>>(a, b, out, n, f);
}

}  // namespace galley::kernels::cuda
