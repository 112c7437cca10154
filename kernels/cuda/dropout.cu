// Inverted dropout (float32, bfloat16 or float16 computed in float32): the GPU side of
// kernels/cpu/dropout.cpp, drawing the same Philox mask (kernels/dropout.h) for the same key.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/dropout.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

// One Philox block (four elements) per thread.
template <typename T>
__global__ void dropout_kernel(const T* __restrict__ x, DropoutParams d, T* __restrict__ y,
                               uint8_t* __restrict__ mask, int64_t n) {
  const int64_t blocks = (n + 3) / 4, stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    const Philox4 r = philox4x32_10(uint64_t(b), d.key);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = 4 * b + j;
      if (i >= n) break;
      const uint8_t m = uint64_t(r.v[j]) < d.keep_threshold;
      mask[i] = m;
      y[i] = from_float<T>(to_float(x[i]) * (float(m) * d.scale));
    }
  }
}

// The mask as one more operand of the elementwise map's grid-stride loop.
template <typename T>
__global__ void dropout_backward_kernel(const T* __restrict__ gy, const uint8_t* __restrict__ mask,
                                        float scale, T* __restrict__ gx, int64_t n) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    gx[i] = from_float<T>(to_float(gy[i]) * (float(mask[i]) * scale));
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void dropout_forward(const DropoutParams& d, DType dtype, const void* x, void* y, uint8_t* mask,
                     int64_t n, void* stream) {
  if (n <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dropout_kernel<T><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(static_cast<const T*>(x), d,
                                                                    static_cast<T*>(y), mask, n);
  });
}

void dropout_backward(DType dtype, const void* gy, const uint8_t* mask, float scale, void* gx,
                      int64_t n, void* stream) {
  if (n <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dropout_backward_kernel<T><<<blocks_for(n), kThreads, 0, st>>>(static_cast<const T*>(gy), mask,
                                                                   scale, static_cast<T*>(gx), n);
  });
}

}  // namespace galley::kernels::cuda
