// Elementwise unary ops and their backward passes: the GPU side of kernels/cpu/unary.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
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

void unary(Unary op, const float* a, float* out, int64_t n, float p0, float p1, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (op) {
    case Unary::Affine:
      return launch_map(a, out, n, AffineOp{p0, p1}, st);
    case Unary::Exp:
      return launch_map(a, out, n, ExpOp{}, st);
    case Unary::Log:
      return launch_map(a, out, n, LogOp{}, st);
    case Unary::Pow:
      return launch_map(a, out, n, PowOp{p0}, st);
    case Unary::Relu:
      return launch_map(a, out, n, ReluOp{}, st);
  }
}

void pow_backward(const float* grad, const float* a, float* out, int64_t n, float p, void* stream) {
  launch_zip(grad, a, out, n, PowBackwardOp{p}, static_cast<cudaStream_t>(stream));
}

void relu_backward(const float* grad, const float* out_fwd, float* out, int64_t n, void* stream) {
  launch_zip(grad, out_fwd, out, n, ReluBackwardOp{}, static_cast<cudaStream_t>(stream));
}

}  // namespace galley::kernels::cuda
