#pragma once
// The device switch of the convolution kernels (internal): the host kernels, or cuDNN with its
// workspace taken from the caching allocator under the device's memory cap.
#include "galley/device.h"
#include "kernels/conv2d.h"

namespace galley::detail {

// y = conv(x, w) (+ b when not null), pointers into tensors on `device`: x and y of `dtype`
// (float32, bfloat16 or float16); w and b float32 on the host, `dtype` on a GPU (where only a
// float32 convolution takes b: conv2d adds a 16-bit bias itself).
void conv2d_forward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                    const void* w, const void* b, void* y);
// Gradients for the non-null outputs (overwritten): x, gy and gx of `dtype`; gw and gb of w's
// dtype as above.
void conv2d_backward(Device device, const kernels::Conv2dGeometry& g, DType dtype, const void* x,
                     const void* w, const void* gy, void* gx, void* gw, void* gb);

// The dtype of the weight and bias that conv2d_forward takes with `dtype` activations on
// `device`.
DType conv2d_weight_dtype(Device device, DType dtype);

}  // namespace galley::detail
