#pragma once
// Elementwise unary ops and their backward, in float32, bfloat16 or float16 (computed in float32,
// one pass over memory; any other dtype throws galley::Error naming the op). Arrays are
// contiguous and of one dtype; `out` may equal an input (in place). The CUDA launchers take
// device pointers and the cudaStream_t to run on; they only enqueue.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {

// out = f(a), in PyTorch's float32 forms:
//   Affine     a * p0 + p1
//   Exp, Log   e^a, ln a
//   Pow        a^p0
//   Relu       a > 0 ? a : 0 (NaN stays NaN)
//   Sigmoid    1 / (1 + e^-a)
//   Tanh       tanh a
//   Silu       a / (1 + e^-a)
//   Gelu       a * 0.5 * (1 + erf(a / sqrt 2))
//   GeluTanh   0.5 * a * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 a^3)))
//   LeakyRelu  a > 0 ? a : a * p0 (NaN stays NaN)
//   Div        a / p0 (a true division: a product with 1 / p0 overflows for a tiny p0 and is
//              off by an ulp in a third of cases)
enum class UnaryOp {
  Affine,
  Exp,
  Log,
  Pow,
  Relu,
  Sigmoid,
  Tanh,
  Silu,
  Gelu,
  GeluTanh,
  LeakyRelu,
  Div
};

// The op's name in messages (PyTorch's name: "gelu" for both forms of it).
constexpr const char* unary_op_name(UnaryOp op) {
  constexpr const char* kNames[] = {"affine", "exp",  "log",  "pow",  "relu",       "sigmoid",
                                    "tanh",   "silu", "gelu", "gelu", "leaky_relu", "div"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<int>(UnaryOp::Div) + 1);
  return kNames[static_cast<int>(op)];
}

// What unary_backward reads besides the gradient, as PyTorch's backward does: the forward's
// output y for Sigmoid (grad * (1 - y) * y) and Tanh (grad * (1 - y * y)), its input x for Silu,
// Gelu, GeluTanh and LeakyRelu (grad * (x > 0 ? 1 : p0), so x == 0 takes the slope).
constexpr bool backward_reads_output(UnaryOp op) {
  return op == UnaryOp::Sigmoid || op == UnaryOp::Tanh;
}

namespace cpu {

void unary(UnaryOp op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1);
// out = grad * f'(x) for the activations Sigmoid .. LeakyRelu, from `saved`: the forward's output
// or input as backward_reads_output(op) says; p0 as in the forward. Other ops throw.
void unary_backward(UnaryOp op, DType dtype, const void* grad, const void* saved, void* out,
                    int64_t n, float p0);
// out = grad * p * a^(p-1)
void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p);
// out = out_fwd > 0 ? grad : 0
void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n);

}  // namespace cpu

namespace cuda {

void unary(UnaryOp op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1,
           void* stream);
void unary_backward(UnaryOp op, DType dtype, const void* grad, const void* saved, void* out,
                    int64_t n, float p0, void* stream);
void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p,
                  void* stream);
void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n,
                   void* stream);

}  // namespace cuda
}  // namespace galley::kernels
