// Elementwise unary ops and their backward passes in float32, bfloat16 or float16 (computed in
// float32): the GPU side of kernels/cpu/unary.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/unary.h"
#include "kernels/cuda/map.cuh"

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

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void unary(UnaryOp op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1,
           void* stream) {
  static const char* names[] = {"affine", "exp", "log", "pow", "relu"};
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, names[int(op)], [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(a);
    T* y = static_cast<T*>(out);
    switch (op) {
      case UnaryOp::Affine:
        return launch_map(x, y, n, AffineOp{p0, p1}, st);
      case UnaryOp::Exp:
        return launch_map(x, y, n, ExpOp{}, st);
      case UnaryOp::Log:
        return launch_map(x, y, n, LogOp{}, st);
      case UnaryOp::Pow:
        return launch_map(x, y, n, PowOp{p0}, st);
      case UnaryOp::Relu:
        return launch_map(x, y, n, ReluOp{}, st);
    }
  });
}

void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p,
                  void* stream) {
  with_floating_type(dtype, "pow_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_zip(static_cast<const T*>(grad), static_cast<const T*>(a), static_cast<T*>(out), n,
               PowBackwardOp{p}, static_cast<cudaStream_t>(stream));
  });
}

void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n,
                   void* stream) {
  with_floating_type(dtype, "relu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_zip(static_cast<const T*>(grad), static_cast<const T*>(out_fwd), static_cast<T*>(out), n,
               ReluBackwardOp{}, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace galley::kernels::cuda
