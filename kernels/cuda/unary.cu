// Elementwise unary ops and their backward passes in float32, bfloat16 or float16 (computed in
// float32): the GPU side of kernels/cpu/unary.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/map.cuh"
#include "kernels/unary.h"
#include "kernels/unary_math.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// kernels

namespace {

namespace um = unary_math;

// The activations and pow: kernels/unary_math.h's formulas, the CPU kernels' expressions, over
// CUDA's expf, erff, tanhf, sqrtf and powf (no fast-math: 2 ulp or better each).
struct DeviceMath {
  __host__ __device__ static float exp(float x) { return expf(x); }
  __host__ __device__ static float erf(float x) { return erff(x); }
  __host__ __device__ static float tanh(float x) { return tanhf(x); }
  __host__ __device__ static float sqrt(float x) { return sqrtf(x); }
  __host__ __device__ static float pow(float x, float p) { return powf(x, p); }
};
struct AffineOp {
  float scale, shift;
  __device__ float operator()(float x) const { return x * scale + shift; }
};
struct DivOp {
  float divisor;
  __device__ float operator()(float x) const {
    return x / divisor;
  }  // IEEE division (no fast math)
};
struct ExpOp {
  __device__ float operator()(float x) const { return expf(x); }
};
struct LogOp {
  __device__ float operator()(float x) const { return logf(x); }
};
struct PowOp {
  float p;
  __device__ float operator()(float x) const { return um::pow_scalar<DeviceMath>(x, p); }
};
struct ReluOp {
  __device__ float operator()(float x) const { return um::relu(x); }
};

struct SigmoidOp {
  __device__ float operator()(float x) const { return um::sigmoid<DeviceMath>(x); }
};
struct TanhOp {
  __device__ float operator()(float x) const { return um::tanh<DeviceMath>(x); }
};
struct SiluOp {
  __device__ float operator()(float x) const { return um::silu<DeviceMath>(x); }
};
struct GeluOp {
  __device__ float operator()(float x) const { return um::gelu<DeviceMath>(x); }
};
struct GeluTanhOp {
  __device__ float operator()(float x) const { return um::gelu_tanh<DeviceMath>(x); }
};
struct LeakyReluOp {
  float slope;
  __device__ float operator()(float x) const { return um::leaky_relu(x, slope); }
};

struct SigmoidBackwardOp {
  __device__ float operator()(float g, float y) const { return um::sigmoid_backward(g, y); }
};
struct TanhBackwardOp {
  __device__ float operator()(float g, float y) const { return um::tanh_backward(g, y); }
};
struct SiluBackwardOp {
  __device__ float operator()(float g, float x) const {
    return um::silu_backward<DeviceMath>(g, x);
  }
};
struct GeluBackwardOp {
  __device__ float operator()(float g, float x) const {
    return um::gelu_backward<DeviceMath>(g, x);
  }
};
struct GeluTanhBackwardOp {
  __device__ float operator()(float g, float x) const {
    return um::gelu_tanh_backward<DeviceMath>(g, x);
  }
};
struct LeakyReluBackwardOp {
  float slope;
  __device__ float operator()(float g, float x) const {
    return um::leaky_relu_backward(g, x, slope);
  }
};

struct PowBackwardOp {
  float p;
  // x^0's gradient is zero, also at 0 and NaN, as the host's.
  __device__ float operator()(float g, float x) const {
    return um::pow_backward<DeviceMath>(g, x, p);
  }
};
struct ReluBackwardOp {
  __device__ float operator()(float g, float y) const { return um::relu_backward(g, y); }
};

}  // namespace

// ----------------------------------------------------------------------------------------------
// launchers

void unary(UnaryOp op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1,
           void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  with_floating_type(dtype, unary_op_name(op), [&](auto tag) {
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
      case UnaryOp::Sigmoid:
        return launch_map(x, y, n, SigmoidOp{}, st);
      case UnaryOp::Tanh:
        return launch_map(x, y, n, TanhOp{}, st);
      case UnaryOp::Silu:
        return launch_map(x, y, n, SiluOp{}, st);
      case UnaryOp::Gelu:
        return launch_map(x, y, n, GeluOp{}, st);
      case UnaryOp::GeluTanh:
        return launch_map(x, y, n, GeluTanhOp{}, st);
      case UnaryOp::LeakyRelu:
        return launch_map(x, y, n, LeakyReluOp{p0}, st);
      case UnaryOp::Div:
        return launch_map(x, y, n, DivOp{p0}, st);
    }
  });
}

void unary_backward(UnaryOp op, DType dtype, const void* grad, const void* saved, void* out,
                    int64_t n, float p0, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const std::string name = std::string(unary_op_name(op)) + "_backward";
  with_floating_type(dtype, name.c_str(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = static_cast<const T*>(grad);
    const T* s = static_cast<const T*>(saved);
    T* o = static_cast<T*>(out);
    switch (op) {
      case UnaryOp::Sigmoid:
        return launch_zip(g, s, o, n, SigmoidBackwardOp{}, st);
      case UnaryOp::Tanh:
        return launch_zip(g, s, o, n, TanhBackwardOp{}, st);
      case UnaryOp::Silu:
        return launch_zip(g, s, o, n, SiluBackwardOp{}, st);
      case UnaryOp::Gelu:
        return launch_zip(g, s, o, n, GeluBackwardOp{}, st);
      case UnaryOp::GeluTanh:
        return launch_zip(g, s, o, n, GeluTanhBackwardOp{}, st);
      case UnaryOp::LeakyRelu:
        return launch_zip(g, s, o, n, LeakyReluBackwardOp{p0}, st);
      default:
        throw Error(std::string("unary_backward: ") + unary_op_name(op) +
                    " is not an activation (it has a backward kernel of its own)");
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
