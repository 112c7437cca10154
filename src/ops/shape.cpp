// Shape ops as free functions.
#include "galley/ops.h"
#include "galley/profiler.h"

namespace galley {

Tensor flatten(const Tensor& x, int64_t start_axis, int64_t end_axis) {
  profiler::OpScope prof("flatten", {&x});
  GALLEY_CHECK(x.defined(), "flatten: the tensor is undefined");
  return x.flatten(start_axis, end_axis);
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  profiler::OpScope prof("reshape", {&x});
  GALLEY_CHECK(x.defined(), "reshape: the tensor is undefined");
  return x.reshape(shape);
}

}  // namespace galley
