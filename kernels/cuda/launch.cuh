#pragma once
// Launch geometry shared by galley's CUDA kernels (included by .cu files only): the block size,
// the grid cap, the grid for an amount of work, and the alignment test of the float4 paths.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace galley::kernels::cuda {

constexpr int kThreads = 256;
// Grids stride beyond this many blocks: enough to fill any current GPU.
constexpr int64_t kMaxBlocks = 8192;

// Blocks for `work` items at `per_block` items a block: at least 1, at most kMaxBlocks.
inline int blocks_for(int64_t work, int64_t per_block = kThreads) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, kMaxBlocks));
}

// True when p may be read and written as float4.
__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace galley::kernels::cuda
