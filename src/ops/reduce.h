#pragma once
// The device switch of the whole-tensor sum, for the ops that reduce a result of their own (the
// mean of a loss): no checks, no graph.
#include "galley/tensor.h"

namespace galley::detail {

// The sum of a float32 tensor's elements / divisor (summed in double), into a float32 scalar on
// its device.
Tensor sum_all(const Tensor& x, double divisor);

}  // namespace galley::detail
