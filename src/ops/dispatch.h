#pragma once
// Argument checks shared by the ops. Every op runs its kernel on the device of its inputs;
// this build has the CPU kernels, so a tensor elsewhere is refused here with a clear message.
#include "galley/tensor.h"

namespace galley::detail {

// `t` must be a defined float32 tensor on a device with kernels.
void check_float(const char* op, const Tensor& t);
// Both must pass check_float and live on the same device.
void check_float_pair(const char* op, const Tensor& a, const Tensor& b);
// Normalises a possibly negative dimension index against `rank`.
int64_t wrap_dim(const char* op, int64_t dim, int64_t rank);

}  // namespace galley::detail
