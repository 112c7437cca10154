#pragma once
// Matrix products and convolutions on CUDA through cuBLAS and cuDNN. Declared without CUDA
// types; `stream` is the cudaStream_t to run on. Every thread gets its own cuBLAS and cuDNN
// handles per device (and cuBLAS's workspace per stream), made on first use, so threads may call
// these concurrently; the caller makes `device` current.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/cpu/conv2d.h"

namespace galley::kernels::cuda {

// ----------------------------------------------------------------------------------------------
// launchers

// Row-major C = alpha * op(A) * op(B) + beta * C, as kernels/cpu/gemm.h, on device `device`.
void gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream);

// Creates this thread's cuBLAS and cuDNN handles for `device` if it has none yet (before a CUDA
// graph capture, which forbids creating them).
void prepare(int device);
// Lets cuBLAS and cuDNN use TF32 tensor cores for float32 (faster, ~1e-3 relative error).
void set_allow_tf32(bool on);
bool allow_tf32();
// Restricts convolutions to cuDNN algorithms that give the same bits at every run.
void set_deterministic(bool on);
bool deterministic();

// Scratch memory for cuDNN, supplied by the op layer from the caching allocator.
struct Workspace {
  // The most bytes one call may take: the per-call limit, lowered to what the memory cap leaves.
  size_t limit = 0;
  // Returns `bytes` on the device for work queued on the call's stream, valid until the next
  // allocate; throws galley::OutOfMemoryError when it cannot. May be empty when `limit` is 0.
  std::function<void*(size_t bytes)> allocate;
};

// y = conv(x, w) (+ bias), NCHW, as kernels/cpu/conv2d.h. cuDNN ranks the algorithms once per
// shape; each call runs the fastest whose workspace fits ws.limit and can be allocated, falling
// back to smaller workspaces (none, at the end) when memory is short.
void conv2d_forward(int device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                    const float* bias, float* y, const Workspace& ws, void* stream);
// Gradients for the non-null outputs (overwritten).
void conv2d_backward(int device, const cpu::Conv2dGeometry& g, const float* x, const float* w,
                     const float* gy, float* gx, float* gw, float* gb, const Workspace& ws,
                     void* stream);
// For messages and tests: the algorithm each direction would run with `limit` bytes of workspace
// available, with its workspace and math type.
std::string conv2d_algorithms(int device, const cpu::Conv2dGeometry& g, size_t limit);

}  // namespace galley::kernels::cuda
