// Finding NaN and infinite values on a GPU (the GPU side of kernels/cpu/nonfinite.cpp), and the
// loss guard's deferred report.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/nonfinite.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

__device__ __forceinline__ bool nonfinite(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}
// A 16-bit element's exponent bits all ones (NaN or infinite), read from its storage.
__device__ __forceinline__ bool nonfinite(__nv_bfloat16 v) {
  return (__bfloat16_as_ushort(v) & 0x7f80u) == 0x7f80u;
}
__device__ __forceinline__ bool nonfinite(__half v) {
  return (__half_as_ushort(v) & 0x7c00u) == 0x7c00u;
}

// Each thread walks its grid-stride elements in order, so its first hit is its smallest; the
// block's smallest goes to *first by an integer atomicMin (order-independent: the result is
// the same whatever order the blocks run in). *first starts as all ones (-1 as int64).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    first_nonfinite_kernel(const T* __restrict__ x, int64_t n,
                           unsigned long long* __restrict__ first) {
  __shared__ unsigned long long scratch[32];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned long long hit = ~0ull;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (nonfinite(x[i])) {
      hit = static_cast<unsigned long long>(i);
      break;
    }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) hit = min(hit, __shfl_down_sync(0xffffffffu, hit, o));
  if (lane == 0) scratch[warp] = hit;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < warps; ++w) hit = min(hit, scratch[w]);
  if (hit != ~0ull) atomicMin(first, hit);
}

__global__ void report_nonfinite_scalar_kernel(const float* __restrict__ x, int64_t code,
                                               int64_t* error_slot) {
  const float v = *x;
  // The first report stays until the host has read it.
  if (!nonfinite(v) || error_slot[0] != 0) return;
  error_slot[1] = static_cast<int64_t>(__float_as_uint(v));
  error_slot[2] = 0;
  error_slot[3] = 0;
  __threadfence_system();
  error_slot[0] = code;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void first_nonfinite(const void* x, DType dtype, int64_t n, int64_t* first, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "first_nonfinite", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cudaMemsetAsync(first, 0xff, sizeof(int64_t), st);
    if (n <= 0) return;
    first_nonfinite_kernel<T><<<blocks_for(n), kThreads, 0, st>>>(
        static_cast<const T*>(x), n, reinterpret_cast<unsigned long long*>(first));
  });
}

void report_nonfinite_scalar(const float* x, int64_t code, int64_t* error_slot, void* stream) {
  report_nonfinite_scalar_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(x, code,
                                                                                 error_slot);
}

}  // namespace galley::kernels::cuda
