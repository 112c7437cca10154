#pragma once
// Elementwise binary ops with NumPy broadcasting, and the reduction that undoes a broadcast.
#include "galley/tensor.h"

namespace galley::kernels::cpu {

enum class BinaryOp { Add, Sub, Mul, Div };

// Shape of broadcasting a with b; the error names `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// a (op) b, broadcast, float32.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// Sums g (of a broadcast shape) down to `shape`; returns g itself when the shapes agree.
Tensor sum_to(const Tensor& g, const Shape& shape);
// a + b for equal shapes.
Tensor add_same_shape(const Tensor& a, const Tensor& b);
// acc += g for equal shapes, in place.
void add_inplace(Tensor& acc, const Tensor& g);

}  // namespace galley::kernels::cpu
