#pragma once
// The device switch of the elementwise unary kernels, for other ops' backward passes: no checks
// beyond the kernels', no graph.
#include "galley/tensor.h"

namespace galley::detail {

// a * scale + shift, in a's dtype, on its device.
Tensor affine(const Tensor& a, float scale, float shift);
// a * scale, keeping the sign of a zero product (-0 * 2 is -0: affine's + 0 would make it +0).
Tensor scaled(const Tensor& a, float scale);

}  // namespace galley::detail
