#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/fill.h"

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

// Any element width dividing 8: byte k gets byte k % width of the pattern (int64, half and
// byte tensors; float32 takes the word kernel).
__global__ void fill_bytes_kernel(uint8_t* __restrict__ dst, size_t bytes, uint64_t pattern,
                                  int width) {
  const size_t stride = size_t(blockDim.x) * gridDim.x;
  for (size_t k = size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < bytes; k += stride)
    dst[k] = static_cast<uint8_t>(pattern >> (8 * (k % width)));
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

void fill_bytes(void* dst, size_t bytes, uint64_t pattern, int width, void* stream) {
  if (bytes == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((bytes + threads - 1) / threads, 65535));
  fill_bytes_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint8_t*>(dst), bytes, pattern, width);
}

}  // namespace galley::kernels::cuda
