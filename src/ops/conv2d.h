#pragma once
// The device switch of the convolution kernels (internal): the host kernels, or cuDNN with its
// workspace taken from the caching allocator under the device's memory cap.
#include "galley/device.h"
#include "kernels/conv2d.h"

namespace galley::detail {

// y = conv(x, w) (+ b when not null), pointers into tensors on `device`: x and y of `dtype`
// (float32 on a GPU; any floating dtype on the host), w and b float32.
void conv2d_forward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                    const float* w, const float* b, void* y);
// Gradients for the non-null outputs (overwritten): x, gy and gx of `dtype`, the rest float32.
void conv2d_backward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                     const float* w, const void* gy, void* gx, float* gw, float* gb);

}  // namespace galley::detail
