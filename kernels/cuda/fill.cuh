#pragma once
// Filling device memory with a 32-bit pattern (zeros, ones, any float) — the CUDA side of
// Tensor::fill_. Declared without CUDA types so C++ files can call the launcher.
#include <cstddef>
#include <cstdint>

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// launchers

// Sets count words at dst to pattern on `stream` (a cudaStream_t; null: the default stream).
void fill_u32(uint32_t* dst, size_t count, uint32_t pattern, void* stream);
// Sets `bytes` bytes at dst to repetitions of the low `width` bytes of pattern (little-endian;
// width 1, 2, 4 or 8).
void fill_bytes(void* dst, size_t bytes, uint64_t pattern, int width, void* stream);

}  // namespace galley::kernels::cuda
