#pragma once
// Views and strided copies for the ops that move data (contiguous, cat, stack, split, narrow,
// select, transpose, permute, add_): no checks beyond these, no graph.
#include "galley/tensor.h"

namespace galley::detail {

// A view of `t`'s storage with its own shape, strides and offset (in elements); t's dtype, no
// autograd state.
Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);
// dst[...] = src[...] element by element, through both tensors' strides, on their device (one
// device, one dtype, one shape; `dst` must not overlap `src`).
void copy_strided(const Tensor& src, const Tensor& dst);
// The view of `t` with dimension `dim` cut to [start, start + length), and the view at `index`
// of dimension `dim` without it (no checks, no graph).
Tensor narrowed(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor selected(const Tensor& t, int64_t dim, int64_t index);
// `t` must be defined and on a device with kernels; any dtype (these ops only move bits).
void check_tensor(const char* op, const Tensor& t);

}  // namespace galley::detail
