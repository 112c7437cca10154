#pragma once
// 2-D convolution, NCHW, float32, forward and backward. On the host a direct kernel for stride-1
// convolutions where it applies (cpu/conv2d_direct.h), im2col + GEMM per image otherwise, images
// spread over threads; on a GPU through cuDNN (each call on `stream`, a cudaStream_t, with the
// thread's handle for `device`; the caller makes `device` current).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace galley::kernels {

struct Conv2dGeometry {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // output channels and kernel
  int64_t stride, pad, dilation, groups;
  int64_t oh, ow;  // output spatial size
};

// Scratch memory for cuDNN, supplied by the op layer from the caching allocator.
struct Workspace {
  // The most bytes one call may take: the per-call limit, lowered to what the memory cap leaves.
  size_t limit = 0;
  // Returns `bytes` on the device for work queued on the call's stream, valid until the next
  // allocate; throws galley::OutOfMemoryError when it cannot. May be empty when `limit` is 0.
  std::function<void*(size_t bytes)> allocate;
};

namespace cpu {

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

}  // namespace cpu

namespace cuda {

// cuDNN ranks the algorithms once per shape; each call runs the fastest whose workspace fits
// ws.limit and can be allocated, falling back to smaller workspaces (none, at the end) when
// memory is short.
void conv2d_forward(int device, const Conv2dGeometry& g, const float* x, const float* w,
                    const float* bias, float* y, const Workspace& ws, void* stream);
// Gradients for the non-null outputs (overwritten).
void conv2d_backward(int device, const Conv2dGeometry& g, const float* x, const float* w,
                     const float* gy, float* gx, float* gw, float* gb, const Workspace& ws,
                     void* stream);
// For messages and tests: the algorithm each direction would run with `limit` bytes of workspace
// available, with its workspace and math type.
std::string conv2d_algorithms(int device, const Conv2dGeometry& g, size_t limit);

}  // namespace cuda
}  // namespace galley::kernels
