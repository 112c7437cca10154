// Strided copies on a GPU: one thread per element, its offsets on both sides found from its flat
// index; the GPU side of kernels/cpu/copy.cpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "galley/error.h"
#include "kernels/copy.h"
#include "kernels/cuda/launch.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

// The geometry travels in the kernel's parameters (600 bytes of the 4 KiB they may take). A copy
// whose innermost dimension is dense on both sides reads and writes consecutive addresses
// across a warp.
template <typename T>
__global__ void strided_copy_kernel(StridedCopy g, int64_t n, const T* __restrict__ src,
                                    T* __restrict__ dst) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t so = 0, dof = 0, r = i;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t k = r % g.sizes[d];
      r /= g.sizes[d];
      so += k * g.src_strides[d];
      dof += k * g.dst_strides[d];
    }
    dst[dof] = src[so];
  }
}

template <typename T>
void launch(const StridedCopy& g, const void* src, void* dst, cudaStream_t st) {
  int64_t n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.sizes[d];
  if (n <= 0) return;
  strided_copy_kernel<T>
      <<<blocks_for(n), kThreads, 0, st>>>(g, n, static_cast<const T*>(src), static_cast<T*>(dst));
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void strided_copy(const StridedCopy& g, size_t element_size, const void* src, void* dst,
                  void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (element_size) {
    case 1:
      return launch<uint8_t>(g, src, dst, st);
    case 2:
      return launch<uint16_t>(g, src, dst, st);
    case 4:
      return launch<uint32_t>(g, src, dst, st);
    case 8:
      return launch<uint64_t>(g, src, dst, st);
    default:
      GALLEY_CHECK(false, "strided_copy: elements of ", element_size, " bytes are not supported");
  }
}

}  // namespace galley::kernels::cuda
