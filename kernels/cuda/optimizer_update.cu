// Fused optimizer updates, one pass over parameter, gradient and state per tensor: the GPU side
// of kernels/cpu/optimizer_update.cpp (torch.optim.Adam / AdamW / SGD formulas, same order of
// operations). Kernels are templated over the parameter's element type T (float, __nv_bfloat16
// or __half): a 16-bit parameter and its gradient are widened to float32, updated there with the
// float32 state, and the parameter rounded once; float32 keeps its float4 path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/optimizer_update.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

// One Adam element. Mirrors the CPU loop line by line; std::max(vmax, v) keeps vmax unless
// vmax < v.
__device__ __forceinline__ void adam_element(const AdamStep& s, float& p, float g, float& m,
                                             float& v, float* vmax) {
  const float l2 = s.decoupled ? 0.f : s.weight_decay;
  const float shrink = s.decoupled ? s.shrink : 1.f;
  const float pi = p * shrink;
  const float gs = s.maximize ? -g : g;
  const float gi = l2 != 0.f ? gs + l2 * pi : gs;
  const float mi = m * s.beta1 + s.one_minus_beta1 * gi;
  const float vi = v * s.beta2 + s.one_minus_beta2 * gi * gi;
  m = mi;
  v = vi;
  float vv = vi;
  if (vmax) {
    vv = *vmax < vi ? vi : *vmax;
    *vmax = vv;
  }
  const float denom = sqrtf(vv) / s.bias2_sqrt + s.eps;
  p = pi - s.step_size * (mi / denom);
}

// One SGD element; the branches are uniform across the grid.
__device__ __forceinline__ void sgd_element(const SGDStep& s, float& p, float g, float* buf) {
  const float gs = s.maximize ? -g : g;
  float d = s.weight_decay != 0.f ? gs + s.weight_decay * p : gs;
  if (s.momentum != 0.f) {
    const float bi = s.first ? d : *buf * s.momentum + s.one_minus_dampening * d;
    *buf = bi;
    d = s.nesterov ? d + s.momentum * bi : bi;
  }
  p -= s.lr * d;
}

// Multi-tensor updates: a batch of tensors travels in the kernel's parameters (by value, so a
// CUDA graph captures it), and block b works on elements [c * kChunk, (c + 1) * kChunk) of the
// tensor whose block range holds b.
constexpr int kBatch = 32;
constexpr int64_t kChunk = 8192;

struct Batch {
  OptimizerTensor t[kBatch];
  int32_t first_block[kBatch + 1];
  int32_t count;
};

__device__ __forceinline__ int tensor_of_block(const Batch& b) {
  int k = 0;
  while (k + 1 < b.count && int32_t(blockIdx.x) >= b.first_block[k + 1]) ++k;
  return k;
}

// Calls f(i) for the block's elements; f4(i4) for aligned groups of four when `vec`.
template <typename F, typename F4>
__device__ __forceinline__ void for_chunk(const Batch& b, int k, bool vec, F f, F4 f4) {
  const int64_t begin = int64_t(int32_t(blockIdx.x) - b.first_block[k]) * kChunk;
  const int64_t end = min(b.t[k].n, begin + kChunk);
  int64_t tail = begin;
  if (vec) {
    const int64_t end4 = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin / 4 + threadIdx.x; i < end4 / 4; i += blockDim.x) f4(i);
    tail = end4;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) f(i);
}

template <typename T, bool kAms>
__global__ void adam_multi_kernel(Batch b, AdamStep s, double lr, double beta1, double beta2) {
  const int k = tensor_of_block(b);
  const OptimizerTensor t = b.t[k];
  __shared__ float step_size, bias2_sqrt;
  if (threadIdx.x == 0) {
    const double step = double(*t.step) + 1.0;
    step_size = static_cast<float>(lr / (1.0 - pow(beta1, step)));
    bias2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, step)));
  }
  __syncthreads();
  s.step_size = step_size;
  s.bias2_sqrt = bias2_sqrt;
  T* p = static_cast<T*>(t.p);
  const T* g = static_cast<const T*>(t.g);
  constexpr bool kF32 = std::is_same_v<T, float>;
  const bool vec = kF32 && aligned16(t.p) && aligned16(t.g) && aligned16(t.m) && aligned16(t.v) &&
                   (!kAms || aligned16(t.vmax));
  for_chunk(
      b, k, vec,
      [&](int64_t i) {
        float pi = to_float(p[i]);
        adam_element(s, pi, to_float(g[i]), t.m[i], t.v[i], kAms ? t.vmax + i : nullptr);
        p[i] = from_float<T>(pi);
      },
      [&](int64_t i) {
        if constexpr (kF32) {
          float4 pv = reinterpret_cast<float4*>(p)[i];
          const float4 gv = reinterpret_cast<const float4*>(g)[i];
          float4 mv = reinterpret_cast<float4*>(t.m)[i];
          float4 vv = reinterpret_cast<float4*>(t.v)[i];
          float4 xv = kAms ? reinterpret_cast<float4*>(t.vmax)[i] : float4{};
          adam_element(s, pv.x, gv.x, mv.x, vv.x, kAms ? &xv.x : nullptr);
          adam_element(s, pv.y, gv.y, mv.y, vv.y, kAms ? &xv.y : nullptr);
          adam_element(s, pv.z, gv.z, mv.z, vv.z, kAms ? &xv.z : nullptr);
          adam_element(s, pv.w, gv.w, mv.w, vv.w, kAms ? &xv.w : nullptr);
          reinterpret_cast<float4*>(p)[i] = pv;
          reinterpret_cast<float4*>(t.m)[i] = mv;
          reinterpret_cast<float4*>(t.v)[i] = vv;
          if (kAms) reinterpret_cast<float4*>(t.vmax)[i] = xv;
        }
      });
}

// Runs after every block of the update has read its counter.
__global__ void advance_steps_kernel(Batch b) {
  if (int32_t(threadIdx.x) < b.count) *b.t[threadIdx.x].step += 1;
}

template <typename T>
__global__ void sgd_multi_kernel(Batch b, SGDStep s) {
  const int k = tensor_of_block(b);
  const OptimizerTensor t = b.t[k];
  s.first = t.first;
  T* p = static_cast<T*>(t.p);
  const T* g = static_cast<const T*>(t.g);
  constexpr bool kF32 = std::is_same_v<T, float>;
  const bool momentum = s.momentum != 0.f;
  const bool vec = kF32 && aligned16(t.p) && aligned16(t.g) && (!momentum || aligned16(t.buf));
  for_chunk(
      b, k, vec,
      [&](int64_t i) {
        float bi = momentum && !s.first ? t.buf[i] : 0.f;
        float pi = to_float(p[i]);
        sgd_element(s, pi, to_float(g[i]), &bi);
        p[i] = from_float<T>(pi);
        if (momentum) t.buf[i] = bi;
      },
      [&](int64_t i) {
        if constexpr (kF32) {
          float4 pv = reinterpret_cast<float4*>(p)[i];
          const float4 gv = reinterpret_cast<const float4*>(g)[i];
          float4 bv = momentum && !s.first ? reinterpret_cast<float4*>(t.buf)[i] : float4{};
          sgd_element(s, pv.x, gv.x, &bv.x);
          sgd_element(s, pv.y, gv.y, &bv.y);
          sgd_element(s, pv.z, gv.z, &bv.z);
          sgd_element(s, pv.w, gv.w, &bv.w);
          reinterpret_cast<float4*>(p)[i] = pv;
          if (momentum) reinterpret_cast<float4*>(t.buf)[i] = bv;
        }
      });
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {
// Calls launch(tag, batch, blocks) for groups of up to kBatch tensors of one dtype, dtype by
// dtype (float32 first, then bfloat16, then float16), with tag naming the CUDA element type.
template <typename Launch>
void for_batches(const OptimizerTensor* tensors, int count, Launch launch) {
  for (int i = 0; i < count; ++i)
    GALLEY_CHECK(is_floating_point(tensors[i].dtype), "optimizer update: tensor ", i, " is ",
                 dtype_name(tensors[i].dtype), "; parameters must be float32, bfloat16 or float16");
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16}) {
    bool any = false;
    for (int i = 0; i < count && !any; ++i) any = tensors[i].dtype == dtype;
    if (!any) continue;
    with_floating_type(dtype, "optimizer update", [&](auto tag) {
      Batch b{};
      int64_t blocks = 0;
      auto flush = [&] {
        if (b.count == 0) return;
        b.first_block[b.count] = static_cast<int32_t>(blocks);
        launch(tag, b, static_cast<int>(blocks));
        b = Batch{};
        blocks = 0;
      };
      // Empty tensors stay in the batch (no blocks of their own), so their step counters
      // advance.
      for (int i = 0; i < count; ++i) {
        if (tensors[i].dtype != dtype) continue;
        const int64_t chunks = (std::max<int64_t>(tensors[i].n, 0) + kChunk - 1) / kChunk;
        // Block indices stay within int32 and one grid dimension.
        if (b.count == kBatch || blocks + chunks > (int64_t(1) << 30)) flush();
        b.t[b.count] = tensors[i];
        b.first_block[b.count] = static_cast<int32_t>(blocks);
        ++b.count;
        blocks += chunks;
      }
      flush();
    });
  }
}
}  // namespace

void adam_update_multi(const AdamStep& s, double lr, double beta1, double beta2,
                       const OptimizerTensor* tensors, int count, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  for_batches(tensors, count, [&](auto tag, const Batch& b, int blocks) {
    using T = typename decltype(tag)::type;
    if (blocks > 0 && s.amsgrad)
      adam_multi_kernel<T, true><<<blocks, kThreads, 0, st>>>(b, s, lr, beta1, beta2);
    else if (blocks > 0)
      adam_multi_kernel<T, false><<<blocks, kThreads, 0, st>>>(b, s, lr, beta1, beta2);
    advance_steps_kernel<<<1, kBatch, 0, st>>>(b);
  });
}

void sgd_update_multi(const SGDStep& s, const OptimizerTensor* tensors, int count, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  for_batches(tensors, count, [&](auto tag, const Batch& b, int blocks) {
    using T = typename decltype(tag)::type;
    if (blocks > 0) sgd_multi_kernel<T><<<blocks, kThreads, 0, st>>>(b, s);
  });
}

}  // namespace galley::kernels::cuda
