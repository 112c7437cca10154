#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/fill.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {
// Grid-stride loop with 16-byte stores where alignment allows: filling is bandwidth-bound.
__global__ void fill_u32_kernel(uint32_t* __restrict__ dst, size_t count, uint32_t pattern) {
  const size_t stride = size_t(blockDim.x) * gridDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t vec = count / 4;
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const uint4 p4 = make_uint4(pattern, pattern, pattern, pattern);
    for (size_t k = i; k < vec; k += stride) d4[k] = p4;
    for (size_t k = vec * 4 + i; k < count; k += stride) dst[k] = pattern;
  } else {
    for (size_t k = i; k < count; k += stride) dst[k] = pattern;
  }
}
}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void fill_u32(uint32_t* dst, size_t count, uint32_t pattern, void* stream) {
  if (count == 0) return;
  const int threads = 256;
  const size_t work = (count + 3) / 4;
  const int blocks = static_cast<int>(std::min<size_t>((work + threads - 1) / threads, 65535));
  fill_u32_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(dst, count, pattern);
}

}  // namespace galley::kernels::cuda
