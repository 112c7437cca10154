#pragma once
// Elementwise unary ops and their backward, in float32, bfloat16 or float16 (computed in float32,
// one pass over memory; any other dtype throws galley::Error naming the op). Arrays are
// contiguous and of one dtype; `out` may equal an input (in place). The CUDA launchers take
// device pointers and the cudaStream_t to run on; they only enqueue.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {

// out = f(a): Affine a * p0 + p1, Exp, Log, Pow a^p0, Relu (NaN stays NaN, as in PyTorch).
enum class UnaryOp { Affine, Exp, Log, Pow, Relu };

namespace cpu {

void unary(UnaryOp op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1);
// out = grad * p * a^(p-1)
void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p);
// out = out_fwd > 0 ? grad : 0
void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n);

}  // namespace cpu

namespace cuda {

void unary(UnaryOp op, DType dtype, const void* a, void* out, int64_t n, float p0, float p1,
           void* stream);
void pow_backward(DType dtype, const void* grad, const void* a, void* out, int64_t n, float p,
                  void* stream);
void relu_backward(DType dtype, const void* grad, const void* out_fwd, void* out, int64_t n,
                   void* stream);

}  // namespace cuda
}  // namespace galley::kernels
