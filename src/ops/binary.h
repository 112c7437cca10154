#pragma once
// The device switch of the broadcasting binary kernels, for the parts of the library that
// combine tensors outside the public ops (the autograd engine's gradient sums, other ops'
// backward passes): no checks beyond the kernels', no graph.
#include "galley/tensor.h"
#include "kernels/binary.h"

namespace galley::detail {

// Shape of broadcasting a with b; the error names `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// a (op) b, broadcast, on their device; both of one floating dtype.
Tensor binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b);
// g (of a broadcast shape) summed down to `shape`, in float32; g itself when the shapes agree.
Tensor sum_to(const Tensor& g, const Shape& shape);
// acc += g for equal shapes and dtypes, in place (acc contiguous).
void add_inplace(Tensor& acc, const Tensor& g);

}  // namespace galley::detail
