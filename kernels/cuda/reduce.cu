// Sums (over one dimension, over broadcast dimensions, over columns, over everything), the
// expansion that is their backward, and argmax: the GPU side of kernels/cpu/reduce.cpp, of
// sum_to in kernels/cpu/binary.cpp and of column_sums in kernels/cpu/gemm.cpp.
//
// Every reduction here is deterministic: each output is summed by a fixed set of threads in a
// fixed order and combined by a fixed tree, never with floating-point atomics, so the same
// input gives the same bits on every run and every device (data-parallel replicas agree).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "galley/error.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/launch.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

constexpr int kMaxDims = 12;
// sum_all: one logical block per this many elements, at most kSumBlocks blocks.
constexpr int64_t kSumChunk = 4096;
constexpr int kSumBlocks = 1024;

// Flat index -> element offset over `n` dimensions (outermost first).
struct Dims {
  int n;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
};

template <typename Index>
__device__ __forceinline__ Index offset_of(const Dims& d, Index idx) {
  Index off = 0;
  for (int k = d.n - 1; k > 0; --k) {
    const Index s = Index(d.size[k]);
    off += (idx % s) * Index(d.stride[k]);
    idx /= s;
  }
  return d.n > 0 ? off + idx * Index(d.stride[0]) : Index(0);  // outermost: no modulo
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); the result is valid in thread 0. Ends with a
// barrier so `scratch` can be reused at once.
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

__device__ __forceinline__ void store(float* out, float v, bool accumulate) {
  *out = accumulate ? *out + v : v;
}

// The innermost dimension is reduced. One group (a warp, or the whole block when kWarp is
// false) per output: out[o] = scale * sum_j g[offset(kept, o) + offset(red, j)]. When the
// innermost reduced dimension (contiguous) is long, rows of it are walked with no division per
// element (red_outer describes the reduced dimensions above it).
template <typename Index, bool kWarp>
__global__ void __launch_bounds__(1024)
    reduce_inner_kernel(const float* __restrict__ g, Dims kept, Dims red, Dims red_outer,
                        Index n_out, Index n_red, Index red_inner, bool by_rows, float scale,
                        bool accumulate, float* __restrict__ out) {
  __shared__ float scratch[32];
  const Index group_size = kWarp ? 32 : blockDim.x;
  const Index lane = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const Index groups_per_block = kWarp ? blockDim.x / 32 : 1;
  const Index first = Index(blockIdx.x) * groups_per_block + (kWarp ? threadIdx.x / 32 : 0);
  const Index step = Index(gridDim.x) * groups_per_block;
  // Block groups loop uniformly (every thread the same trip count) because of the barriers.
  for (Index o = first; o < n_out; o += step) {
    const Index base = offset_of(kept, o);
    float acc = 0.f;
    if (by_rows) {
      const Index rows = n_red / red_inner;
      for (Index r = 0; r < rows; ++r) {
        const float* row = g + base + offset_of(red_outer, r);
        for (Index i = lane; i < red_inner; i += group_size) acc += row[i];
      }
    } else {
      for (Index j = lane; j < n_red; j += group_size) acc += g[base + offset_of(red, j)];
    }
    if constexpr (kWarp)
      acc = warp_sum(acc);
    else
      acc = block_sum(acc, scratch);
    if (lane == 0) store(out + o, acc * scale, accumulate);
  }
}

// The innermost dimension is kept (contiguous, `inner` long). Block (tx, ty): tx neighbouring
// outputs, ty threads splitting the reduction, then a fixed tree over ty in shared memory.
// Tiles of tx outputs are walked grid-stride: tile t covers kept_outer index t / tiles_per_row.
template <typename Index>
__global__ void reduce_outer_kernel(const float* __restrict__ g, Dims kept_outer, Dims red,
                                    Index n_kept_outer, Index inner, Index n_red, float scale,
                                    bool accumulate, float* __restrict__ out) {
  __shared__ float tile[kThreads];
  const Index tx = blockDim.x, ty = blockDim.y, x = threadIdx.x, y = threadIdx.y;
  const Index tiles_per_row = (inner + tx - 1) / tx;
  const Index tiles = tiles_per_row * n_kept_outer;
  for (Index t = blockIdx.x; t < tiles; t += gridDim.x) {
    const Index ko = t / tiles_per_row;
    const Index col = (t % tiles_per_row) * tx + x;
    float acc = 0.f;
    if (col < inner) {
      const float* p = g + offset_of(kept_outer, ko) + col;
      for (Index j = y; j < n_red; j += ty) acc += p[offset_of(red, j)];
    }
    tile[y * tx + x] = acc;
    __syncthreads();
    for (Index s = ty / 2; s > 0; s /= 2) {
      if (y < s) tile[y * tx + x] += tile[(y + s) * tx + x];
      __syncthreads();
    }
    if (y == 0 && col < inner) store(out + ko * inner + col, tile[x] * scale, accumulate);
    __syncthreads();
  }
}

// Sum of all n elements in double: `blocks` logical blocks of kThreads threads each sum a fixed
// grid-stride share, each block's partial comes from a fixed tree, and the partials are added
// by one block in a fixed order. With a grid of `blocks` blocks the partials go to `partials`
// and the last block to finish adds them (one launch, no second pass); with a grid of one block
// that block plays every logical block in turn and keeps the partials in shared memory. Both
// give the same bits, so a captured graph (which may use the second form) matches eager runs.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    sum_all_kernel(const float* __restrict__ x, int64_t n, int blocks, float scale,
                   double* partials, unsigned* counter, float* out) {
  __shared__ double local[kSumBlocks];
  __shared__ double scratch[32];
  __shared__ bool last;
  const bool emulate = gridDim.x == 1;
  const int64_t threads = int64_t(blocks) * kThreads;
  const int b_end = emulate ? blocks : int(blockIdx.x) + 1;
  for (int b = emulate ? 0 : blockIdx.x; b < b_end; ++b) {
    const int64_t gid = int64_t(b) * kThreads + threadIdx.x;
    double acc = 0.0;
    int64_t tail = 0;
    if constexpr (kVec) {
      const int64_t n4 = n / 4;
      const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
      for (int64_t i = gid; i < n4; i += threads) {
        const float4 v = x4[i];
        acc += double(v.x);
        acc += double(v.y);
        acc += double(v.z);
        acc += double(v.w);
      }
      tail = n4 * 4;
    }
    for (int64_t i = tail + gid; i < n; i += threads) acc += double(x[i]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) {
      if (emulate)
        local[b] = acc;
      else
        partials[b] = acc;
    }
  }
  if (!emulate) {
    if (threadIdx.x == 0) {
      __threadfence();  // publish this block's partial before counting it
      last = atomicAdd(counter, 1u) == unsigned(blocks - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
  }
  __syncthreads();
  double s = 0.0;
  for (int i = threadIdx.x; i < blocks; i += kThreads)
    s += emulate ? local[i] : __ldcg(partials + i);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    *out = static_cast<float>(s * double(scale));
    if (!emulate) *counter = 0;  // ready for the next launch on this stream
  }
}

// out[o, l, i] = g[o, i] * scale, in units V along i (float4 when inner % 4 == 0 and aligned).
__device__ __forceinline__ float scaled(float v, float s) {
  return v * s;
}
__device__ __forceinline__ float4 scaled(float4 v, float s) {
  return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}

template <typename V, typename Index>
__global__ void expand_dim_kernel(const V* __restrict__ g, Index len, Index inner, Index total,
                                  float scale, V* __restrict__ out) {
  const Index stride = Index(blockDim.x) * gridDim.x;
  const Index plane = len * inner;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride)
    out[k] = scaled(g[(k / plane) * inner + k % inner], scale);
}

// The CPU rule (first of equal maxima; a NaN wins and ends the scan), one thread per (o, i)
// walking l in order: coalesced across i when inner > 1.
__global__ void argmax_columns_kernel(const float* __restrict__ x, int64_t outer, int64_t len,
                                      int64_t inner, int64_t* __restrict__ out) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < outer * inner; k += stride) {
    const int64_t o = k / inner, i = k % inner;
    const float* p = x + o * len * inner + i;
    int64_t best = 0;
    float bv = len > 0 ? p[0] : 0.f;
    for (int64_t l = 1; l < len && !isnan(bv); ++l) {
      const float v = p[l * inner];
      if (v > bv || isnan(v)) bv = v, best = l;
    }
    out[k] = best;
  }
}

// Candidate (v, i) beats (w, j), i and j being indices in scan order (-1: no candidate): a NaN
// beats any number and the earlier NaN beats a later one; among numbers the larger wins and the
// earlier of equals. The result over a row is what the sequential CPU scan returns.
__device__ __forceinline__ bool beats(float v, int64_t i, float w, int64_t j) {
  if (j < 0) return i >= 0;
  if (i < 0) return false;
  const bool nv = isnan(v), nw = isnan(w);
  if (nv || nw) return nv && (!nw || i < j);
  return v > w || (v == w && i < j);
}

// inner == 1: one warp per row; each lane scans a strided share in order, then the warp
// combines lane winners with `beats`.
__global__ void argmax_rows_kernel(const float* __restrict__ x, int64_t rows, int64_t len,
                                   int64_t* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    const float* p = x + r * len;
    float bv = 0.f;
    int64_t best = -1;
    for (int64_t l = lane; l < len; l += 32) {
      const float v = p[l];
      if (best < 0 || v > bv || isnan(v)) bv = v, best = l;
      if (isnan(bv)) break;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float w = __shfl_down_sync(0xffffffffu, bv, o);
      const int64_t j = __shfl_down_sync(0xffffffffu, best, o);
      if (beats(w, j, bv, best)) bv = w, best = j;
    }
    if (lane == 0) out[r] = best < 0 ? 0 : best;
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// Scratch of the multi-block sum_all: kSumBlocks partials and a counter that the last block
// resets. One per (device, stream), allocated with cudaMalloc on first use and kept for the
// life of the process (about 8 KiB each): two streams of one device may sum at the same time.
// Not allocated while the stream is being captured into a graph; the single-block form of the
// kernel, which gives the same bits, runs instead.
struct SumScratch {
  double* partials = nullptr;
  unsigned* counter = nullptr;
};

SumScratch sum_scratch(cudaStream_t st) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, uintptr_t>, SumScratch>();  // never freed
  const auto key = std::make_pair(device, reinterpret_cast<uintptr_t>(st));
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return {};
  }
  void* mem = nullptr;
  const size_t bytes = kSumBlocks * sizeof(double) + sizeof(unsigned);
  if (cudaMalloc(&mem, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  SumScratch s{static_cast<double*>(mem),
               reinterpret_cast<unsigned*>(static_cast<double*>(mem) + kSumBlocks)};
  if (cudaMemsetAsync(s.counter, 0, sizeof(unsigned), st) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(mem);
    return {};
  }
  cache->emplace(key, s);
  return s;
}

void launch_sum_all(const float* x, int64_t n, float scale, float* out, cudaStream_t st) {
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((n + kSumChunk - 1) / kSumChunk, 1, kSumBlocks));
  SumScratch s = blocks > 1 ? sum_scratch(st) : SumScratch{};
  const int grid = s.partials ? blocks : 1;
  if (aligned16(x))
    sum_all_kernel<true>
        <<<grid, kThreads, 0, st>>>(x, n, blocks, scale, s.partials, s.counter, out);
  else
    sum_all_kernel<false>
        <<<grid, kThreads, 0, st>>>(x, n, blocks, scale, s.partials, s.counter, out);
}

// A reduction of a contiguous tensor whose dimensions are each kept or reduced, merged so
// that neighbours of the same kind become one dimension, with the launch that suits it.
struct ReducePlan {
  int rank = 0;
  int64_t size[kMaxDims] = {};
  bool reduced[kMaxDims] = {};
};

// Adds a dimension of `size` to the plan (size-1 dimensions vanish).
void plan_add(ReducePlan& p, int64_t size, bool reduced, const char* what) {
  if (size == 1) return;
  if (p.rank > 0 && p.reduced[p.rank - 1] == reduced) {
    p.size[p.rank - 1] *= size;
    return;
  }
  GALLEY_CHECK(p.rank < kMaxDims, what, ": kept and reduced dimensions alternate more than ",
               kMaxDims, " times");
  p.size[p.rank] = size;
  p.reduced[p.rank] = reduced;
  ++p.rank;
}

template <typename Index>
void launch_reduce(const ReducePlan& p, const float* g, float scale, bool accumulate, float* out,
                   cudaStream_t st) {
  int64_t strides[kMaxDims];
  int64_t acc = 1;
  for (int k = p.rank - 1; k >= 0; --k) strides[k] = acc, acc *= p.size[k];
  Dims kept{}, red{};
  int64_t n_out = 1, n_red = 1;
  for (int k = 0; k < p.rank; ++k) {
    Dims& d = p.reduced[k] ? red : kept;
    d.size[d.n] = p.size[k];
    d.stride[d.n] = strides[k];
    ++d.n;
    (p.reduced[k] ? n_red : n_out) *= p.size[k];
  }
  const bool inner_kept = p.rank == 0 || !p.reduced[p.rank - 1];
  if (inner_kept) {
    const int64_t inner = p.rank ? p.size[p.rank - 1] : 1;
    Dims kept_outer = kept;
    if (kept_outer.n > 0) --kept_outer.n;
    const int64_t tx0 = std::min<int64_t>(32, pow2_ceil(inner));
    const int64_t ty = std::min<int64_t>(pow2_ceil(n_red), kThreads / tx0);
    const int64_t tx = std::min<int64_t>(kThreads / ty, pow2_ceil(inner));
    const int64_t tiles = (inner + tx - 1) / tx * (n_out / inner);
    const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(ty));
    reduce_outer_kernel<Index><<<blocks_for(tiles, 1), block, 0, st>>>(
        g, kept_outer, red, Index(n_out / inner), Index(inner), Index(n_red), scale, accumulate,
        out);
    return;
  }
  if (n_out == 1 && !accumulate && n_red > kSumChunk) {
    launch_sum_all(g, n_red, scale, out, st);  // spread over the whole GPU, in double
    return;
  }
  const int64_t red_inner = p.size[p.rank - 1];
  Dims red_outer = red;
  --red_outer.n;
  if (n_red <= 1024) {
    const int warps = kThreads / 32;
    reduce_inner_kernel<Index, true><<<blocks_for(n_out, warps), kThreads, 0, st>>>(
        g, kept, red, red_outer, Index(n_out), Index(n_red), Index(red_inner), red_inner >= 32,
        scale, accumulate, out);
  } else {
    const int threads = n_out < 128 ? 1024 : kThreads;
    reduce_inner_kernel<Index, false><<<blocks_for(n_out, 1), threads, 0, st>>>(
        g, kept, red, red_outer, Index(n_out), Index(n_red), Index(red_inner), red_inner >= threads,
        scale, accumulate, out);
  }
}

// Runs the plan over g (n_g elements) into out (n_out elements).
void run_reduce(const ReducePlan& p, const float* g, float scale, bool accumulate, float* out,
                cudaStream_t st) {
  int64_t n_g = 1, n_out = 1;
  bool any_reduced = false;
  for (int k = 0; k < p.rank; ++k) {
    n_g *= p.size[k];
    if (p.reduced[k])
      any_reduced = true;
    else
      n_out *= p.size[k];
  }
  if (n_out == 0) return;
  if (n_g == 0) {  // an empty reduction: the sum is 0
    if (!accumulate) cudaMemsetAsync(out, 0, size_t(n_out) * sizeof(float), st);
    return;
  }
  if (!any_reduced && !accumulate && scale == 1.f) {
    cudaMemcpyAsync(out, g, size_t(n_out) * sizeof(float), cudaMemcpyDeviceToDevice, st);
    return;
  }
  if (n_g <= INT32_MAX)
    launch_reduce<uint32_t>(p, g, scale, accumulate, out, st);
  else
    launch_reduce<int64_t>(p, g, scale, accumulate, out, st);
}

}  // namespace

void sum_to(const float* g, const int64_t* g_shape, float* out, const int64_t* shape, int rank,
            void* stream) {
  ReducePlan p;
  for (int d = 0; d < rank; ++d)
    plan_add(p, g_shape[d], shape[d] == 1 && g_shape[d] != 1, "sum_to");
  run_reduce(p, g, 1.f, false, out, static_cast<cudaStream_t>(stream));
}

void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, float scale, float* out,
             void* stream) {
  ReducePlan p;
  plan_add(p, outer, false, "sum_dim");
  plan_add(p, len, true, "sum_dim");
  plan_add(p, inner, false, "sum_dim");
  run_reduce(p, x, scale, false, out, static_cast<cudaStream_t>(stream));
}

void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate,
                 void* stream) {
  ReducePlan p;
  plan_add(p, rows, true, "column_sums");
  plan_add(p, n, false, "column_sums");
  run_reduce(p, g, 1.f, accumulate, out, static_cast<cudaStream_t>(stream));
}

void sum_all(const float* x, int64_t n, float scale, float* out, void* stream) {
  launch_sum_all(x, std::max<int64_t>(n, 0), scale, out, static_cast<cudaStream_t>(stream));
}

void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float scale, float* out,
                void* stream) {
  const int64_t total = outer * len * inner;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (inner % 4 == 0 && aligned16(g) && aligned16(out)) {
    const int64_t t4 = total / 4, i4 = inner / 4;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4* o4 = reinterpret_cast<float4*>(out);
    if (t4 <= INT32_MAX)
      expand_dim_kernel<float4, uint32_t><<<blocks_for(t4), kThreads, 0, st>>>(
          g4, uint32_t(len), uint32_t(i4), uint32_t(t4), scale, o4);
    else
      expand_dim_kernel<float4, int64_t>
          <<<blocks_for(t4), kThreads, 0, st>>>(g4, len, i4, t4, scale, o4);
  } else if (total <= INT32_MAX) {
    expand_dim_kernel<float, uint32_t><<<blocks_for(total), kThreads, 0, st>>>(
        g, uint32_t(len), uint32_t(inner), uint32_t(total), scale, out);
  } else {
    expand_dim_kernel<float, int64_t>
        <<<blocks_for(total), kThreads, 0, st>>>(g, len, inner, total, scale, out);
  }
}

void argmax_dim(const float* x, int64_t outer, int64_t len, int64_t inner, int64_t* out,
                void* stream) {
  if (outer * inner <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (inner == 1 && len >= 32)
    argmax_rows_kernel<<<blocks_for(outer, kThreads / 32), kThreads, 0, st>>>(x, outer, len, out);
  else
    argmax_columns_kernel<<<blocks_for(outer * inner), kThreads, 0, st>>>(x, outer, len, inner,
                                                                          out);
}

}  // namespace galley::kernels::cuda
