#pragma once
// Matrix products and convolutions on CUDA through cuBLAS and cuDNN. Declared without CUDA
// types; `stream` is the cudaStream_t to run on. The handles, the convolution algorithm cache
// and the workspaces are per device and made on first use.
#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/cpu/conv2d.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// launchers

// Row-major C = alpha * op(A) * op(B) + beta * C, as kernels/cpu/gemm.h, on device `device`.
void gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream);

// Lets cuBLAS use TF32 tensor cores for float32 products (faster, ~1e-3 relative error).
// Creates `device`'s cuBLAS and cuDNN handles (and cuBLAS's workspace) if they do not exist yet.
void prepare(int device);
void set_allow_tf32(bool on);
bool allow_tf32();

// Scratch memory for cuDNN: returns `bytes` on the device, valid until the next call on the
// same thread; the op layer supplies it from the caching allocator.
using Workspace = std::function<void*(size_t bytes)>;

// y = conv(x, w) (+ bias), NCHW, as kernels/cpu/conv2d.h. The algorithm is chosen once per
// geometry and remembered.
void conv2d_forward(int device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                    const float* bias, float* y, const Workspace& ws, void* stream);
// Gradients for the non-null outputs (overwritten).
void conv2d_backward(int device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                     const float* gy, float* gx, float* gw, float* gb, const Workspace& ws,
                     void* stream);

}  // namespace galley::kernels::cuda
