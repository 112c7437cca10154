#pragma once
// The device switch of the whole-tensor sum, for the ops that reduce a result of their own (the
// mean of a loss): no checks, no graph.
#include "galley/tensor.h"

namespace galley::detail {

// scale * the sum of a float32 tensor's elements, into a float32 scalar on its device.
Tensor sum_all(const Tensor& x, float scale);

}  // namespace galley::detail
