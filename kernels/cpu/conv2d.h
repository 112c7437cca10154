#pragma once
// 2-D convolution, NCHW, float32, images spread over threads: a direct kernel for stride-1
// convolutions where it applies (conv2d_direct.h), im2col + GEMM per image otherwise.
#include <cstdint>

namespace galley::kernels::cpu {

struct Conv2dGeometry {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // output channels and kernel
  int64_t stride, pad, dilation, groups;
  int64_t oh, ow;  // output spatial size
};

// y[n, o, oh, ow] = sum w * x (+ b[o] when b is not null).
void conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w, const float* b,
                    float* y);
// Gradients for the pointers that are not null: gx (input), gw (weight), gb (bias).
// gw and gb are overwritten, not accumulated.
void conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w, const float* gy,
                     float* gx, float* gw, float* gb);

// The im2col + GEMM path alone, for any geometry (the bias gradient is conv2d_backward's).
void conv2d_forward_im2col(const Conv2dGeometry& g, const float* x, const float* w, const float* b,
                           float* y);
void conv2d_backward_im2col(const Conv2dGeometry& g, const float* x, const float* w,
                            const float* gy, float* gx, float* gw);

}  // namespace galley::kernels::cpu
