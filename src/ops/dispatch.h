#pragma once
// Argument checks shared by the ops. Every op runs its kernel on the device of its inputs;
// this build has the CPU kernels, so a tensor elsewhere is refused here with a clear message.
#include "galley/tensor.h"

namespace galley::detail {

// `t` must be a defined float32 tensor on a device with kernels.
void check_float(const char* op, const Tensor& t);
// Both must pass check_float and live on the same device.
void check_float_pair(const char* op, const Tensor& a, const Tensor& b);
// `t` must be a defined float32, bfloat16 or float16 tensor on a device with kernels.
void check_floating(const char* op, const Tensor& t);
// Both must pass check_floating, have one dtype (no silent promotion: the error names both) and
// live on the same device.
void check_floating_pair(const char* op, const Tensor& a, const Tensor& b);
// `t` itself when it is float32, else a float32 copy outside the graph: how the ops whose
// kernels take float32 only (reductions, softmax) compute a 16-bit input in float32. Their result
// is rounded once with `rounded`.
Tensor widened(const Tensor& t);
// `t` (float32, outside the graph) converted to `dtype`.
Tensor rounded(const Tensor& t, DType dtype);
// Normalises a possibly negative dimension index against `rank`.
int64_t wrap_dim(const char* op, int64_t dim, int64_t rank);

}  // namespace galley::detail
