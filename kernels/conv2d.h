#pragma once
// 2-D convolution, NCHW, forward and backward. On the host Winograd F(2x2, 3x3) for 3x3 "same"
// convolutions of 16 channels and more (cpu/conv2d_winograd.h; forward and input gradient), a
// direct kernel for other convolutions where it applies (cpu/conv2d_direct.h), a pointwise one for
// strided 1x1 convolutions (cpu/conv2d_pointwise.h), im2col + GEMM per image otherwise, images
// spread over threads; the activations (x, y and their gradients) may be float32, bfloat16 or
// float16, read and written in their own dtype: widened as they are copied into the kernels'
// float32 buffers (the bordered image, the im2col columns), computed in float32, and rounded once
// as the result is written out, with the same bits as the float32 kernel on the widened input,
// rounded; except bfloat16 on a host with AMX or AVX512-BF16 (cpu/conv2d_direct.h's
// bf16_kernels()), whose direct path and im2col path (on cpu::gemm_bf16, kernels/gemm.h) multiply
// bfloat16 values, sum in float32 in their own order and round once. On a GPU through cuDNN, every
// operand in one dtype (float32, on TF32 tensor cores where allowed; bfloat16 or float16 on tensor
// cores, summed in float32), each call on `stream` (a cudaStream_t) with the thread's handle for
// `device` (the caller makes `device` current).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "galley/dtype.h"

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

// y[n, o, oh, ow] = sum w * x (+ b[o] when b is not null). x and y hold `dtype` elements; w and
// b float32.
void conv2d_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b, void* y,
                    DType dtype = DType::Float32);
// Gradients for the pointers that are not null: gx (input), gw (weight), gb (bias).
// gw and gb are overwritten, not accumulated. x, gy and gx hold `dtype` elements; w, gw and gb
// float32.
void conv2d_backward(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                     void* gx, float* gw, float* gb, DType dtype = DType::Float32);

// The im2col + GEMM path alone, for any geometry (the bias gradient is conv2d_backward's).
void conv2d_forward_im2col(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                           void* y, DType dtype = DType::Float32);
void conv2d_backward_im2col(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                            void* gx, float* gw, DType dtype = DType::Float32);

// Images a thread chunk of the CPU paths takes at least: small images are batched so that forking
// pays for itself.
int64_t conv2d_image_grain(const Conv2dGeometry& g);

}  // namespace cpu

namespace cuda {

// cuDNN ranks the algorithms once per shape and dtype; each call runs the fastest whose workspace
// fits ws.limit and can be allocated, falling back to smaller workspaces (none, at the end) when
// memory is short. x, w, y and the gradients are `dtype` elements; a bias (b, gb) is float32
// only: a 16-bit convolution's bias is the op layer's own add.
void conv2d_forward(int device, const Conv2dGeometry& g, DType dtype, const void* x, const void* w,
                    const float* bias, void* y, const Workspace& ws, void* stream);
// Gradients for the non-null outputs (overwritten).
void conv2d_backward(int device, const Conv2dGeometry& g, DType dtype, const void* x, const void* w,
                     const void* gy, void* gx, void* gw, float* gb, const Workspace& ws,
                     void* stream);
// For messages and tests: the algorithm each direction would run with `limit` bytes of workspace
// available, with its workspace and math type.
std::string conv2d_algorithms(int device, const Conv2dGeometry& g, DType dtype, size_t limit);

}  // namespace cuda
}  // namespace galley::kernels
