#pragma once
// Filling device memory with a repeated pattern (zeros, ones, any value): the CUDA side of
// Tensor::fill_ (the host fills with std::fill). The launchers take the cudaStream_t to run on
// (null: the default stream).
#include <cstddef>
#include <cstdint>

namespace galley::kernels {
namespace cuda {

// Sets count words at dst to pattern.
void fill_u32(uint32_t* dst, size_t count, uint32_t pattern, void* stream);
// Sets `bytes` bytes at dst to repetitions of the low `width` bytes of pattern (little-endian;
// width 1, 2, 4 or 8).
void fill_bytes(void* dst, size_t bytes, uint64_t pattern, int width, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
