#pragma once
// The device switch of the convolution kernels (internal): the host kernels, or cuDNN with its
// workspace taken from the caching allocator under the device's memory cap.
#include "galley/device.h"
#include "kernels/conv2d.h"

namespace galley::detail {

// y = conv(x, w) (+ b when not null), float32 pointers into tensors on `device`.
void conv2d_forward(Device device, const kernels::Conv2dGeometry& g, const float* x, const float* w,
                    const float* b, float* y);
// Gradients for the non-null outputs (overwritten).
void conv2d_backward(Device device, const kernels::Conv2dGeometry& g, const float* x,
                     const float* w, const float* gy, float* gx, float* gw, float* gb);

}  // namespace galley::detail
