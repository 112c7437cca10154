#pragma once
// The device switch of the elementwise unary kernels, for other ops' backward passes: no checks
// beyond the kernels', no graph.
#include "galley/tensor.h"

namespace galley::detail {

// a * scale + shift, in a's dtype, on its device.
Tensor affine(const Tensor& a, float scale, float shift);

}  // namespace galley::detail
