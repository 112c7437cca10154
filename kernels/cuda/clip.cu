// Gradient clipping over many tensors: the GPU side of kernels/cpu/clip.cpp. Every reduction is
// deterministic: a block per chunk of kClipChunk elements writes its partial (a fixed tree
// over its threads), and one block adds the partials by a fixed tree, so the bits depend on the
// sizes alone. Kernels are templated over the gradients' element type T (float, __nv_bfloat16
// or __half; a launch's spans share one): 16-bit elements are widened to float32, and a scaled
// or clamped one rounded back once. float32 keeps its float4 path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/clip.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/map.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

constexpr int64_t kChunk = kClipChunk;
static_assert(kChunk % 4 == 0, "chunks start 16-byte aligned within a span");
// Spans per launch: they travel in the kernel's parameters (by value, so a CUDA graph captures
// them), well inside the 4 KB limit.
constexpr int kBatch = 64;

struct Batch {
  GradSpan t[kBatch];
  int32_t first_block[kBatch + 1];
  int32_t count;
  int64_t base;  // the first block's chunk among all the launches' chunks
};

// The span of this block: the last k with first_block[k] <= blockIdx.x (batches hold no empty
// spans, so that one has the block's chunk).
__device__ __forceinline__ int span_of_block(const Batch& b) {
  int lo = 0, hi = b.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (int32_t(blockIdx.x) >= b.first_block[mid])
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Calls f(i) for the block's elements of span k, f4(i4) for aligned groups of four (float32
// spans only).
template <typename T, typename F, typename F4>
__device__ __forceinline__ void for_chunk(const Batch& b, int k, F f, F4 f4) {
  const GradSpan s = b.t[k];
  const int64_t begin = int64_t(int32_t(blockIdx.x) - b.first_block[k]) * kChunk;
  const int64_t end = min(s.n, begin + kChunk);
  int64_t tail = begin;
  if (std::is_same_v<T, float> && aligned16(s.data)) {
    const int64_t end4 = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin / 4 + threadIdx.x; i < end4 / 4; i += blockDim.x) f4(i);
    tail = end4;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) f(i);
}

enum Kind { kTwo, kOne, kInf, kOther };

// max that keeps a NaN once it has met one.
__device__ __forceinline__ double nan_max(double a, double b) {
  return (b > a || b != b) ? b : a;
}

template <int kKind>
__device__ __forceinline__ void accumulate(double& acc, float x, double p) {
  const double a = fabs(double(x));
  if constexpr (kKind == kTwo)
    acc += a * a;
  else if constexpr (kKind == kOne)
    acc += a;
  else if constexpr (kKind == kInf)
    acc = nan_max(acc, a);
  else
    acc += pow(a, p);
}

template <int kKind>
__device__ __forceinline__ double combine(double a, double b) {
  if constexpr (kKind == kInf)
    return nan_max(a, b);
  else
    return a + b;
}

// Over the block (blockDim.x a multiple of 32) by a fixed tree; valid in thread 0.
template <int kKind>
__device__ double block_reduce(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine<kKind>(v, __shfl_down_sync(0xffffffffu, v, o));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : 0.0;  // 0 is neutral for sums and for max |x|
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = combine<kKind>(v, __shfl_down_sync(0xffffffffu, v, o));
  }
  __syncthreads();
  return v;
}

template <typename T, int kKind>
__global__ void __launch_bounds__(kThreads)
    norm_partials_kernel(Batch b, double p, double* __restrict__ partials) {
  __shared__ double scratch[32];
  const int k = span_of_block(b);
  const T* x = static_cast<const T*>(b.t[k].data);
  double acc = 0.0;
  for_chunk<T>(
      b, k, [&](int64_t i) { accumulate<kKind>(acc, to_float(x[i]), p); },
      [&](int64_t i) {
        if constexpr (std::is_same_v<T, float>) {
          const float4 v = reinterpret_cast<const float4*>(x)[i];
          accumulate<kKind>(acc, v.x, p);
          accumulate<kKind>(acc, v.y, p);
          accumulate<kKind>(acc, v.z, p);
          accumulate<kKind>(acc, v.w, p);
        }
      });
  acc = block_reduce<kKind>(acc, scratch);
  if (threadIdx.x == 0) partials[b.base + blockIdx.x] = acc;
}

// One block: thread t adds partials t, t + blockDim.x, ... in order, then a fixed tree.
template <int kKind>
__global__ void __launch_bounds__(kThreads)
    norm_finish_kernel(const double* __restrict__ partials, int64_t parts, double p,
                       float* __restrict__ total) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) acc = combine<kKind>(acc, partials[i]);
  acc = block_reduce<kKind>(acc, scratch);
  if (threadIdx.x != 0) return;
  if constexpr (kKind == kTwo)
    *total = static_cast<float>(sqrt(acc));
  else if constexpr (kKind == kOther)
    *total = static_cast<float>(pow(acc, 1.0 / p));
  else
    *total = static_cast<float>(acc);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_kernel(Batch b, float scale) {
  const int k = span_of_block(b);
  T* x = static_cast<T*>(b.t[k].data);
  for_chunk<T>(
      b, k, [&](int64_t i) { x[i] = from_float<T>(to_float(x[i]) * scale); },
      [&](int64_t i) {
        if constexpr (std::is_same_v<T, float>) {
          float4 v = reinterpret_cast<float4*>(x)[i];
          v.x *= scale, v.y *= scale, v.z *= scale, v.w *= scale;
          reinterpret_cast<float4*>(x)[i] = v;
        }
      });
}

// Comparisons with NaN are false: a NaN passes through, as in torch.clamp.
__device__ __forceinline__ float clamp_one(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) clamp_kernel(Batch b, float lo, float hi) {
  const int k = span_of_block(b);
  T* x = static_cast<T*>(b.t[k].data);
  for_chunk<T>(
      b, k, [&](int64_t i) { x[i] = from_float<T>(clamp_one(to_float(x[i]), lo, hi)); },
      [&](int64_t i) {
        if constexpr (std::is_same_v<T, float>) {
          float4 v = reinterpret_cast<float4*>(x)[i];
          v.x = clamp_one(v.x, lo, hi), v.y = clamp_one(v.y, lo, hi);
          v.z = clamp_one(v.z, lo, hi), v.w = clamp_one(v.w, lo, hi);
          reinterpret_cast<float4*>(x)[i] = v;
        }
      });
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {
int64_t chunks_of(const GradSpan& s) {
  return (std::max<int64_t>(s.n, 0) + kChunk - 1) / kChunk;
}

// Calls launch(tag, batch, blocks) for groups of up to kBatch non-empty spans of one dtype,
// dtype by dtype (float32, then bfloat16, then float16), tag naming the CUDA element type;
// batch.base counts the chunks of the batches before.
template <typename Launch>
void for_batches(const GradSpan* spans, int count, Launch launch) {
  for (int i = 0; i < count; ++i)
    GALLEY_CHECK(is_floating_point(spans[i].dtype), "clip_grad: gradient ", i, " is ",
                 dtype_name(spans[i].dtype), "; gradients must be float32, bfloat16 or float16");
  int64_t base = 0;
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16}) {
    bool any = false;
    for (int i = 0; i < count && !any; ++i) any = spans[i].dtype == dtype && chunks_of(spans[i]);
    if (!any) continue;
    with_floating_type(dtype, "clip_grad", [&](auto tag) {
      Batch b{};
      int64_t blocks = 0;
      auto flush = [&] {
        if (b.count == 0) return;
        b.first_block[b.count] = static_cast<int32_t>(blocks);
        b.base = base;
        launch(tag, b, static_cast<int>(blocks));
        base += blocks;
        b = Batch{};
        blocks = 0;
      };
      for (int i = 0; i < count; ++i) {
        const int64_t chunks = chunks_of(spans[i]);
        if (chunks == 0 || spans[i].dtype != dtype) continue;
        // Block indices stay within int32 and one grid dimension.
        if (b.count == kBatch || blocks + chunks > (int64_t(1) << 30)) flush();
        b.t[b.count] = spans[i];
        b.first_block[b.count] = static_cast<int32_t>(blocks);
        ++b.count;
        blocks += chunks;
      }
      flush();
    });
  }
}

template <int kKind>
void grad_norm_as(const GradSpan* spans, int count, double p, double* scratch, float* total,
                  cudaStream_t st) {
  int64_t parts = 0;
  for_batches(spans, count, [&](auto tag, const Batch& b, int blocks) {
    using T = typename decltype(tag)::type;
    norm_partials_kernel<T, kKind><<<blocks, kThreads, 0, st>>>(b, p, scratch);
    parts += blocks;
  });
  norm_finish_kernel<kKind><<<1, kThreads, 0, st>>>(scratch, parts, p, total);
}
}  // namespace

int64_t grad_norm_scratch(const GradSpan* spans, int count) {
  int64_t parts = 0;
  for (int i = 0; i < count; ++i) parts += chunks_of(spans[i]);
  return parts;
}

void grad_norm(const GradSpan* spans, int count, double norm_type, double* scratch, float* total,
               void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (std::isinf(norm_type))
    grad_norm_as<kInf>(spans, count, norm_type, scratch, total, st);
  else if (norm_type == 2.0)
    grad_norm_as<kTwo>(spans, count, norm_type, scratch, total, st);
  else if (norm_type == 1.0)
    grad_norm_as<kOne>(spans, count, norm_type, scratch, total, st);
  else
    grad_norm_as<kOther>(spans, count, norm_type, scratch, total, st);
}

void scale_grads(const GradSpan* spans, int count, float scale, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  for_batches(spans, count, [&](auto tag, const Batch& b, int blocks) {
    scale_kernel<typename decltype(tag)::type><<<blocks, kThreads, 0, st>>>(b, scale);
  });
}

void clamp_grads(const GradSpan* spans, int count, float clip, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  for_batches(spans, count, [&](auto tag, const Batch& b, int blocks) {
    clamp_kernel<typename decltype(tag)::type><<<blocks, kThreads, 0, st>>>(b, -clip, clip);
  });
}

}  // namespace galley::kernels::cuda
