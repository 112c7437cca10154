// Sums (over one dimension, over broadcast dimensions, over columns, over everything), the
// expansion that is their backward, and argmax: the GPU side of kernels/cpu/reduce.cpp, of
// sum_to in kernels/cpu/binary.cpp and of column_sums in kernels/cpu/gemm.cpp.
//
// Every reduction here is deterministic: each output is summed by a fixed set of threads in a
// fixed order and combined by a fixed tree, never with floating-point atomics, so the same
// input gives the same bits on every run and every device (data-parallel replicas agree). A long
// sum is split across blocks by a rule that depends on the shape alone: the blocks write partial
// sums to scratch (ReduceScratch, launch.cuh), and a second launch adds them in a fixed order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "galley/error.h"
#include "kernels/binary.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/fill.h"
#include "kernels/reduce.h"

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

__device__ __forceinline__ void store(float* out, float v, bool accumulate) {
  *out = accumulate ? *out + v : v;
}

// The innermost dimension is reduced. One group (a warp, or the whole block when kWarp is
// false) per output: out[o] = sum_j g[offset(kept, o) + offset(red, j)] / divisor. When the
// innermost reduced dimension (contiguous) is long, rows of it are walked with no division per
// element (red_outer describes the reduced dimensions above it).
template <typename Index, bool kWarp>
__global__ void __launch_bounds__(1024)
    reduce_inner_kernel(const float* __restrict__ g, Dims kept, Dims red, Dims red_outer,
                        Index n_out, Index n_red, Index red_inner, bool by_rows, double divisor,
                        bool accumulate, float* __restrict__ out) {
  __shared__ double scratch[32];
  const Index group_size = kWarp ? 32 : blockDim.x;
  const Index lane = kWarp ? (threadIdx.x & 31) : threadIdx.x;
  const Index groups_per_block = kWarp ? blockDim.x / 32 : 1;
  const Index first = Index(blockIdx.x) * groups_per_block + (kWarp ? threadIdx.x / 32 : 0);
  const Index step = Index(gridDim.x) * groups_per_block;
  // Block groups loop uniformly (every thread the same trip count) because of the barriers.
  for (Index o = first; o < n_out; o += step) {
    const Index base = offset_of(kept, o);
    double acc = 0.0;  // (each thread's share summed in double, as the host sums)
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
    if (lane == 0) store(out + o, static_cast<float>(acc / divisor), accumulate);
  }
}

// The innermost dimension is kept (contiguous, `inner` long). Block (tx, ty): tx neighbouring
// outputs, ty threads splitting the reduction, then a fixed tree over ty in shared memory.
// Tiles of tx outputs are walked grid-stride: tile t covers kept_outer index t / tiles_per_row.
// Grid row c sums reduced indices [c * chunk, (c + 1) * chunk) of every output: with one row
// (chunk = n_red) the sums go to out; a long reduction is split over rows instead, which write
// partials[c * n_out + o] for sum_partials to add in a fixed order.
template <typename Index>
__global__ void reduce_outer_kernel(const float* __restrict__ g, Dims kept_outer, Dims red,
                                    Index n_kept_outer, Index inner, Index n_red, Index chunk,
                                    double divisor, bool accumulate, float* __restrict__ partials,
                                    float* __restrict__ out) {
  __shared__ double tile[kThreads];
  const Index tx = blockDim.x, ty = blockDim.y, x = threadIdx.x, y = threadIdx.y;
  const Index tiles_per_row = (inner + tx - 1) / tx;
  const Index tiles = tiles_per_row * n_kept_outer;
  const Index r0 = Index(blockIdx.y) * chunk;
  const Index r1 = n_red - r0 < chunk ? n_red : r0 + chunk;
  for (Index t = blockIdx.x; t < tiles; t += gridDim.x) {
    const Index ko = t / tiles_per_row;
    const Index col = (t % tiles_per_row) * tx + x;
    double acc = 0.0;
    if (col < inner) {
      const float* p = g + offset_of(kept_outer, ko) + col;
      for (Index j = r0 + y; j < r1; j += ty) acc += p[offset_of(red, j)];
    }
    tile[y * tx + x] = acc;
    __syncthreads();
    for (Index s = ty / 2; s > 0; s /= 2) {
      if (y < s) tile[y * tx + x] += tile[(y + s) * tx + x];
      __syncthreads();
    }
    if (y == 0 && col < inner) {
      const Index o = ko * inner + col;
      if (partials)
        partials[Index(blockIdx.y) * n_kept_outer * inner + o] = static_cast<float>(tile[x]);
      else
        store(out + o, static_cast<float>(tile[x] / divisor), accumulate);
    }
    __syncthreads();
  }
}

// The second pass of a split sum. Block (tx, lanes): lane y adds parts y, y + lanes, ... in
// order, then a fixed tree over the lanes. Both are set by the number of parts alone.
__global__ void sum_partials_kernel(const float* __restrict__ partials, unsigned parts, unsigned n,
                                    double divisor, bool accumulate, float* __restrict__ out) {
  __shared__ double tile[kThreads];
  const unsigned tx = blockDim.x, lanes = blockDim.y, x = threadIdx.x, y = threadIdx.y;
  for (unsigned base = blockIdx.x * tx; base < n; base += gridDim.x * tx) {
    const unsigned j = base + x;
    double acc = 0.0;
    if (j < n)
      for (unsigned c = y; c < parts; c += lanes) acc += partials[c * n + j];
    tile[y * tx + x] = acc;
    __syncthreads();
    for (unsigned s = lanes / 2; s > 0; s /= 2) {
      if (y < s) tile[y * tx + x] += tile[(y + s) * tx + x];
      __syncthreads();
    }
    if (y == 0 && j < n) store(out + j, static_cast<float>(tile[x] / divisor), accumulate);
    __syncthreads();
  }
}

// Sum of all n elements in double, over a grid of `blocks` blocks of kThreads: thread t of the
// grid sums elements t, t + blocks * kThreads, ... in order, and each block its threads by a
// fixed tree. With one block that sum is the result; with more each block writes its partial,
// and sum_all_finish_kernel adds them by a fixed tree. The grid depends on n alone, so the bits
// do too.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    sum_all_kernel(const float* __restrict__ x, int64_t n, double divisor, bool accumulate,
                   double* __restrict__ partials, float* __restrict__ out) {
  __shared__ double scratch[32];
  const int64_t threads = int64_t(gridDim.x) * kThreads;
  const int64_t gid = int64_t(blockIdx.x) * kThreads + threadIdx.x;
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
  if (threadIdx.x != 0) return;
  if (partials)
    partials[blockIdx.x] = acc;
  else
    store(out, static_cast<float>(acc / divisor), accumulate);
}

__global__ void __launch_bounds__(kThreads)
    sum_all_finish_kernel(const double* __restrict__ partials, int blocks, double divisor,
                          bool accumulate, float* __restrict__ out) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < blocks; i += kThreads) s += partials[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) store(out, static_cast<float>(s / divisor), accumulate);
}

// out[o, l, i] = g[o, i], in units V along i (float4 when inner % 4 == 0 and aligned).
template <typename V, typename Index>
__global__ void expand_dim_kernel(const V* __restrict__ g, Index len, Index inner, Index total,
                                  V* __restrict__ out) {
  const Index stride = Index(blockDim.x) * gridDim.x;
  const Index plane = len * inner;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride)
    out[k] = g[(k / plane) * inner + k % inner];
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

// sum_all: one block per kSumChunk elements, at most kSumBlocks; more than one block splits the
// sum (partials in scratch, then sum_all_finish_kernel).
void launch_sum_all(const float* x, int64_t n, double divisor, bool accumulate, float* out,
                    cudaStream_t st) {
  const int blocks =
      static_cast<int>(std::clamp<int64_t>((n + kSumChunk - 1) / kSumChunk, 1, kSumBlocks));
  const bool vec = aligned16(x);
  if (blocks == 1) {
    if (vec)
      sum_all_kernel<true><<<1, kThreads, 0, st>>>(x, n, divisor, accumulate, nullptr, out);
    else
      sum_all_kernel<false><<<1, kThreads, 0, st>>>(x, n, divisor, accumulate, nullptr, out);
    return;
  }
  ReduceScratch scratch(st, size_t(blocks) * sizeof(double), "sum_all");
  double* partials = static_cast<double*>(scratch.get());
  if (!partials) return;
  if (vec)
    sum_all_kernel<true><<<blocks, kThreads, 0, st>>>(x, n, divisor, accumulate, partials, out);
  else
    sum_all_kernel<false><<<blocks, kThreads, 0, st>>>(x, n, divisor, accumulate, partials, out);
  sum_all_finish_kernel<<<1, kThreads, 0, st>>>(partials, blocks, divisor, accumulate, out);
}

// How a sum over the outer (strided) dimensions is split across grid rows: `chunks` rows of
// `rows` reduced indices each (one chunk: no split).
struct OuterSplit {
  int64_t chunks = 1;
  int64_t rows = 0;
};

// Each thread of a split sums at least this many reduced indices of its column: fewer and the
// partials cost more than they save.
constexpr int64_t kMinRowsPerThread = 8;
// Smaller sums take one pass: a few microseconds, which a second launch would double.
constexpr int64_t kMinSplitElements = int64_t(1) << 16;

// A split for `tiles` blocks of (tx, ty) threads over n_out outputs and n_red reduced indices:
// enough grid rows to make about kFillBlocks blocks, within the scratch. It depends on the
// shape alone.
OuterSplit split_outer(int64_t tiles, int64_t ty, int64_t n_red, int64_t n_out) {
  const OuterSplit none{1, n_red};
  if (tiles >= kFillBlocks || n_red * n_out < kMinSplitElements) return none;
  const int64_t chunks = std::min(
      {(kFillBlocks + tiles - 1) / tiles, n_red / (kMinRowsPerThread * ty),
       int64_t(kReduceScratchBytes / sizeof(float)) / n_out, int64_t(65535)});  // grid rows
  if (chunks < 2) return none;
  // Whole rounds of ty rows per chunk, so that every thread of a block adds as many terms.
  const int64_t rows = ((n_red + chunks - 1) / chunks + ty - 1) / ty * ty;
  return {(n_red + rows - 1) / rows, rows};
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
void launch_reduce(const ReducePlan& p, const float* g, double divisor, bool accumulate, float* out,
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
    const OuterSplit split = split_outer(tiles, ty, n_red, n_out);
    if (split.chunks == 1) {
      reduce_outer_kernel<Index><<<blocks_for(tiles, 1), block, 0, st>>>(
          g, kept_outer, red, Index(n_out / inner), Index(inner), Index(n_red), Index(n_red),
          divisor, accumulate, nullptr, out);
      return;
    }
    ReduceScratch scratch(st, size_t(split.chunks * n_out) * sizeof(float), "a column sum");
    float* partials = static_cast<float*>(scratch.get());
    if (!partials) return;
    const dim3 grid(static_cast<unsigned>(blocks_for(tiles, 1)),
                    static_cast<unsigned>(split.chunks));
    reduce_outer_kernel<Index><<<grid, block, 0, st>>>(
        g, kept_outer, red, Index(n_out / inner), Index(inner), Index(n_red), Index(split.rows),
        divisor, accumulate, partials, out);
    sum_partials(partials, split.chunks, n_out, divisor, accumulate, out, st);
    return;
  }
  if (n_out == 1 && n_red > kSumChunk) {
    launch_sum_all(g, n_red, divisor, accumulate, out, st);  // spread over the whole GPU, in double
    return;
  }
  const int64_t red_inner = p.size[p.rank - 1];
  Dims red_outer = red;
  --red_outer.n;
  if (n_red <= 1024) {
    const int warps = kThreads / 32;
    reduce_inner_kernel<Index, true><<<blocks_for(n_out, warps), kThreads, 0, st>>>(
        g, kept, red, red_outer, Index(n_out), Index(n_red), Index(red_inner), red_inner >= 32,
        divisor, accumulate, out);
  } else {
    const int threads = n_out < 128 ? 1024 : kThreads;
    reduce_inner_kernel<Index, false><<<blocks_for(n_out, 1), threads, 0, st>>>(
        g, kept, red, red_outer, Index(n_out), Index(n_red), Index(red_inner), red_inner >= threads,
        divisor, accumulate, out);
  }
}

// Runs the plan over g (n_g elements) into out (n_out elements).
void run_reduce(const ReducePlan& p, const float* g, double divisor, bool accumulate, float* out,
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
  if (n_g == 0) {  // an empty reduction: the sum is 0, divided as the host does (a mean: NaN)
    if (!accumulate) {
      const float v = static_cast<float>(0.0 / divisor);
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      fill_u32(reinterpret_cast<uint32_t*>(out), size_t(n_out), bits, st);
    }
    return;
  }
  if (!any_reduced && !accumulate && divisor == 1.0) {
    cudaMemcpyAsync(out, g, size_t(n_out) * sizeof(float), cudaMemcpyDeviceToDevice, st);
    return;
  }
  if (n_g <= INT32_MAX)
    launch_reduce<uint32_t>(p, g, divisor, accumulate, out, st);
  else
    launch_reduce<int64_t>(p, g, divisor, accumulate, out, st);
}

}  // namespace

namespace {

// One stream's eager scratch. `mu` is held from a split sum's first launch to its second.
struct StreamScratch {
  std::mutex mu;
  void* mem = nullptr;
};

StreamScratch& stream_scratch(int device, cudaStream_t st) {
  // (device, whether `value` is the stream's unique id or, failing that, its address, value)
  using Key = std::tuple<int, bool, uint64_t>;
  unsigned long long id = 0;
  Key key{device, true, 0};
  if (cudaStreamGetId(st, &id) == cudaSuccess) {
    std::get<2>(key) = id;
  } else {
    (void)cudaGetLastError();
    key = Key{device, false, reinterpret_cast<uintptr_t>(st)};
  }
  static std::mutex mu;
  // Never freed, nor the buffers: freeing device memory would synchronise the device, which a
  // capture on another thread may not survive. One buffer per stream that ever split a sum.
  static auto* all = new std::map<Key, StreamScratch*>();
  std::lock_guard<std::mutex> lock(mu);
  StreamScratch*& s = (*all)[key];
  if (!s) s = new StreamScratch();
  return *s;
}

}  // namespace

ReduceScratch::ReduceScratch(cudaStream_t stream, size_t bytes, const char* what)
    : stream_(stream) {
  GALLEY_CHECK(bytes <= kReduceScratchBytes, what, ": ", bytes, " bytes of scratch asked, at most ",
               kReduceScratchBytes, " can be had");
  int device = 0;
  const cudaError_t device_rc = cudaGetDevice(&device);
  if (device_rc != cudaSuccess) (void)cudaGetLastError();
  GALLEY_CHECK(device_rc == cudaSuccess, what,
               ": no current CUDA device: ", cudaGetErrorString(device_rc));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    // The stream cannot be used now (the legacy stream while another thread captures): the
    // launches that follow fail the same way and report it.
    (void)cudaGetLastError();
    capture = cudaStreamCaptureStatusNone;
  }
  if (capture == cudaStreamCaptureStatusInvalidated) return;
  if (capture == cudaStreamCaptureStatusActive) {
    int pools = 0;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess)
      (void)cudaGetLastError();
    GALLEY_CHECK(pools != 0, what, " on cuda:", device,
                 " cannot be captured in a CUDA graph: the device has no stream-ordered memory "
                 "pools, which the graph's scratch comes from");
    const cudaError_t rc = cudaMallocAsync(&p_, bytes, stream);
    if (rc != cudaSuccess) (void)cudaGetLastError();
    GALLEY_CHECK(rc == cudaSuccess, what, " on cuda:", device, ": allocating ", bytes,
                 " bytes of scratch in the graph being captured failed: ", cudaGetErrorString(rc));
    in_graph_ = true;
    return;
  }
  StreamScratch& s = stream_scratch(device, stream);
  lock_ = std::unique_lock<std::mutex>(s.mu);
  if (!s.mem) {
    // Not a stream operation: allowed even while this thread captures on another stream, where
    // the thread-local capture mode would refuse it.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    const cudaError_t rc = cudaMalloc(&s.mem, kReduceScratchBytes);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      s.mem = nullptr;
      throw OutOfMemoryError(detail::str_cat(what, " on cuda:", device, ": no GPU memory left for ",
                                             kReduceScratchBytes >> 10, " KiB of scratch (",
                                             cudaGetErrorString(rc), ")"));
    }
  }
  p_ = s.mem;
}

ReduceScratch::~ReduceScratch() {
  // Queued after the second pass, so the graph's free node follows every use.
  if (in_graph_ && cudaFreeAsync(p_, stream_) != cudaSuccess) (void)cudaGetLastError();
}

void sum_partials(const float* partials, int64_t parts, int64_t n, double divisor, bool accumulate,
                  float* out, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t lanes = std::min<int64_t>(pow2_ceil(parts), 32);
  const int64_t tx = kThreads / lanes;
  const dim3 block(static_cast<unsigned>(tx), static_cast<unsigned>(lanes));
  sum_partials_kernel<<<blocks_for(n, tx), block, 0, stream>>>(
      partials, unsigned(parts), unsigned(n), divisor, accumulate, out);
}

void sum_to_float32(const float* g, const int64_t* g_shape, float* out, const int64_t* shape,
                    int rank, void* stream) {
  ReducePlan p;
  for (int d = 0; d < rank; ++d)
    plan_add(p, g_shape[d], shape[d] == 1 && g_shape[d] != 1, "sum_to");
  run_reduce(p, g, 1.f, false, out, static_cast<cudaStream_t>(stream));
}

void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, double divisor, float* out,
             void* stream) {
  ReducePlan p;
  plan_add(p, outer, false, "sum_dim");
  plan_add(p, len, true, "sum_dim");
  plan_add(p, inner, false, "sum_dim");
  run_reduce(p, x, divisor, false, out, static_cast<cudaStream_t>(stream));
}

void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate,
                 void* stream) {
  ReducePlan p;
  plan_add(p, rows, true, "column_sums");
  plan_add(p, n, false, "column_sums");
  run_reduce(p, g, 1.f, accumulate, out, static_cast<cudaStream_t>(stream));
}

void sum_all(const float* x, int64_t n, double divisor, float* out, void* stream) {
  launch_sum_all(x, std::max<int64_t>(n, 0), divisor, /*accumulate=*/false, out,
                 static_cast<cudaStream_t>(stream));
}

void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float* out,
                void* stream) {
  const int64_t total = outer * len * inner;
  if (total <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (inner % 4 == 0 && aligned16(g) && aligned16(out)) {
    const int64_t t4 = total / 4, i4 = inner / 4;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4* o4 = reinterpret_cast<float4*>(out);
    if (t4 <= INT32_MAX)
      expand_dim_kernel<float4, uint32_t>
          <<<blocks_for(t4), kThreads, 0, st>>>(g4, uint32_t(len), uint32_t(i4), uint32_t(t4), o4);
    else
      expand_dim_kernel<float4, int64_t><<<blocks_for(t4), kThreads, 0, st>>>(g4, len, i4, t4, o4);
  } else if (total <= INT32_MAX) {
    expand_dim_kernel<float, uint32_t><<<blocks_for(total), kThreads, 0, st>>>(
        g, uint32_t(len), uint32_t(inner), uint32_t(total), out);
  } else {
    expand_dim_kernel<float, int64_t>
        <<<blocks_for(total), kThreads, 0, st>>>(g, len, inner, total, out);
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
