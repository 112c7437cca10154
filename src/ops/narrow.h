#pragma once
// narrow's view and autograd record without its argument checks, for split.
#include "galley/tensor.h"

namespace galley::detail {

// The view of x's dimension `dim` (already wrapped) over [start, start + length) (in range),
// recorded as `name`: its backward writes the gradient into that slice of zeros.
Tensor narrow_view(const Tensor& x, int64_t dim, int64_t start, int64_t length, const char* name);

}  // namespace galley::detail
