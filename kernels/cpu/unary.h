#pragma once
// Elementwise unary ops in float32, bfloat16 or float16 (computed in float32, one pass over
// memory each); the output has the input's dtype.
#include "galley/tensor.h"

namespace galley::kernels::cpu {

// a * scale + shift.
Tensor affine(const Tensor& a, float scale, float shift);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
// a^p.
Tensor pow(const Tensor& a, float p);
// grad * p * a^(p-1).
Tensor pow_backward(const Tensor& grad, const Tensor& a, float p);
Tensor relu(const Tensor& a);
// max(a, 0) in place.
void relu_(Tensor& a);
// grad where out > 0, else 0, in place into grad.
void relu_backward_(Tensor& grad, const Tensor& out);
// grad where out > 0, else 0.
Tensor relu_backward(const Tensor& grad, const Tensor& out);

}  // namespace galley::kernels::cpu
