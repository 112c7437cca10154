// Elementwise unary ops and their backward passes: the GPU side of kernels/cpu/unary.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/launch.cuh"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

struct AffineOp {
  float scale, shift;
  __device__ float operator()(float x) const { return x * scale + shift; }
};
struct ExpOp {
  __device__ float operator()(float x) const { return expf(x); }
};
struct LogOp {
  __device__ float operator()(float x) const { return logf(x); }
};
struct PowOp {
  float p;
  __device__ float operator()(float x) const { return powf(x, p); }
};
// `!(x <= 0)` keeps a NaN as NaN, as the CPU kernel and PyTorch do.
struct ReluOp {
  __device__ float operator()(float x) const { return !(x <= 0.f) ? x : 0.f; }
};
struct PowBackwardOp {
  float p;
  __device__ float operator()(float g, float x) const { return g * p * powf(x, p - 1.f); }
};
struct ReluBackwardOp {
  __device__ float operator()(float g, float y) const { return y > 0.f ? g : 0.f; }
};

// out = f(a). No __restrict__: out may be a. kVec: both pointers 16-byte aligned.
template <typename F, bool kVec>
__global__ void map_kernel(const float* a, float* out, int64_t n, F f) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = start; i < n4; i += stride) {
      const float4 v = a4[i];
      o4[i] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
    }
    tail = n4 * 4;
  }
  for (int64_t i = tail + start; i < n; i += stride) out[i] = f(a[i]);
}

// out = f(a, b). out may be a.
template <typename F, bool kVec>
__global__ void zip_kernel(const float* a, const float* b, float* out, int64_t n, F f) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  const int64_t start = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = start; i < n4; i += stride) {
      const float4 x = a4[i], y = b4[i];
      o4[i] = make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w));
    }
    tail = n4 * 4;
  }
  for (int64_t i = tail + start; i < n; i += stride) out[i] = f(a[i], b[i]);
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

namespace {

template <typename F>
void launch_map(const float* a, float* out, int64_t n, F f, void* stream) {
  if (n <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (aligned16(a) && aligned16(out))
    map_kernel<F, true><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(a, out, n, f);
  else
    map_kernel<F, false><<<blocks_for(n), kThreads, 0, st>>>(a, out, n, f);
}

template <typename F>
void launch_zip(const float* a, const float* b, float* out, int64_t n, F f, void* stream) {
  if (n <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (aligned16(a) && aligned16(b) && aligned16(out))
    zip_kernel<F, true><<<blocks_for((n + 3) / 4), kThreads, 0, st>>>(a, b, out, n, f);
  else
    zip_kernel<F, false><<<blocks_for(n), kThreads, 0, st>>>(a, b, out, n, f);
}

}  // namespace

void unary(Unary op, const float* a, float* out, int64_t n, float p0, float p1, void* stream) {
  switch (op) {
    case Unary::Affine:
      return launch_map(a, out, n, AffineOp{p0, p1}, stream);
    case Unary::Exp:
      return launch_map(a, out, n, ExpOp{}, stream);
    case Unary::Log:
      return launch_map(a, out, n, LogOp{}, stream);
    case Unary::Pow:
      return launch_map(a, out, n, PowOp{p0}, stream);
    case Unary::Relu:
      return launch_map(a, out, n, ReluOp{}, stream);
  }
}

void pow_backward(const float* grad, const float* a, float* out, int64_t n, float p, void* stream) {
  launch_zip(grad, a, out, n, PowBackwardOp{p}, stream);
}

void relu_backward(const float* grad, const float* out_fwd, float* out, int64_t n, void* stream) {
  launch_zip(grad, out_fwd, out, n, ReluBackwardOp{}, stream);
}

}  // namespace galley::kernels::cuda
