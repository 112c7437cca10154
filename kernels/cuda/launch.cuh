#pragma once
// Launch geometry shared by galley's CUDA kernels (included by .cu files only): the block size,
// the grid cap, the grid for an amount of work, and the alignment test of the float4 paths; the
// fixed-order block sum and the scratch of the two-pass sums (reduce.cu), which bias_relu.cu
// uses for its bias gradient too.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace galley::kernels::cuda {

constexpr int kThreads = 256;
// Grids stride beyond this many blocks: enough to fill any current GPU.
constexpr int64_t kMaxBlocks = 8192;
// A split sum aims at this many blocks of kThreads: about one full wave on a 132-SM GPU. It is a
// constant, not the device's SM count, so that the split, and with it the bits of the result,
// depends on the shape alone: replicas on different GPUs agree.
constexpr int64_t kFillBlocks = 1024;

// Blocks for `work` items at `per_block` items a block: at least 1, at most kMaxBlocks.
inline int blocks_for(int64_t work, int64_t per_block = kThreads) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, kMaxBlocks));
}

// True when p may be read and written as float4.
__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// ----------------------------------------------------------------------------------------------
// kernels

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, blockDim.y == 1) by a fixed tree; the result
// is valid in thread 0. Ends with a barrier so `scratch` (32 entries) can be reused at once.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : T(0);
    v = warp_sum(v);
  }
  __syncthreads();
  return v;
}

// ----------------------------------------------------------------------------------------------
// launchers

// The most scratch one split sum uses (its partial sums).
constexpr size_t kReduceScratchBytes = size_t(128) << 10;

// The scratch of one split sum queued on `stream`, from its first pass's launch to its second's
// (construct it before the first, destroy it after the second; never hold two on one stream).
// - Eagerly: the stream's own buffer of kReduceScratchBytes, made on first use and kept for the
//   life of the process, keyed by the stream's unique id (not its address, which a new stream
//   may reuse, nor the shared handle of the per-thread default stream). It stays locked while
//   this object lives, so that two host threads queuing on one stream cannot interleave their
//   passes.
// - While `stream` is captured into a CUDA graph: memory of the graph itself (cudaMallocAsync /
//   cudaFreeAsync become the graph's allocation and free nodes), so every graph replays with its
//   own scratch, whatever stream it is launched on and whatever runs beside it.
// get() is null only when the capture is already invalidated (its graph will never run: launch
// nothing). Throws OutOfMemoryError when the GPU has no memory for it, galley::Error when a
// capture cannot allocate; `what` names the operation in those messages.
class ReduceScratch {
 public:
  ReduceScratch(cudaStream_t stream, size_t bytes, const char* what);
  ~ReduceScratch();
  ReduceScratch(const ReduceScratch&) = delete;
  ReduceScratch& operator=(const ReduceScratch&) = delete;
  void* get() const { return p_; }

 private:
  cudaStream_t stream_;
  void* p_ = nullptr;
  bool in_graph_ = false;
  std::unique_lock<std::mutex> lock_;
};

// The second pass of a split sum: out[j] = (sum over c < parts of partials[c * n + j]) / divisor
// (+ out[j] when accumulate) for j < n, in an order that depends on `parts` alone.
// parts * n floats must fit in kReduceScratchBytes.
void sum_partials(const float* partials, int64_t parts, int64_t n, double divisor, bool accumulate,
                  float* out, cudaStream_t stream);

}  // namespace galley::kernels::cuda
