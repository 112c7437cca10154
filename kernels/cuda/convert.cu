// Element type conversions on the GPU: one grid-stride kernel per (from, to) pair, each element
// through float32 with the CUDA intrinsics' round to nearest even.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "galley/error.h"
#include "galley/half.h"
#include "kernels/convert.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

template <typename T>
struct Element;
template <>
struct Element<float> {
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <>
struct Element<__nv_bfloat16> {
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Element<__half> {
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Element<int64_t> {
  __device__ static float load(int64_t v) { return static_cast<float>(v); }
  __device__ static int64_t store(float v) { return detail::float_to_int64(v); }
};
template <>
struct Element<uint8_t> {
  __device__ static float load(uint8_t v) { return static_cast<float>(v); }
  __device__ static uint8_t store(float v) { return detail::float_to_uint8(v); }
};

template <typename From, typename To>
__global__ void convert_kernel(const From* __restrict__ src, To* __restrict__ dst, int64_t n) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = Element<To>::store(Element<From>::load(src[i]));
}

template <typename From, typename To>
void launch(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535));
  convert_kernel<From, To>
      <<<blocks, threads, 0, stream>>>(static_cast<const From*>(src), static_cast<To*>(dst), n);
}

// Calls f with a value of the CUDA element type of `t`.
template <typename F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::Float32:
      return f(float{});
    case DType::BFloat16:
      return f(__nv_bfloat16{});
    case DType::Float16:
      return f(__half{});
    case DType::Int64:
      return f(int64_t{});
    case DType::UInt8:
      return f(uint8_t{});
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void convert(const void* src, DType from, void* dst, DType to, int64_t n, void* stream) {
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  with_type(from, [&](auto f) {
    with_type(to, [&](auto t) { launch<decltype(f), decltype(t)>(src, dst, n, s); });
  });
}

}  // namespace galley::kernels::cuda
