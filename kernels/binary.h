#pragma once
// Elementwise binary ops with NumPy broadcasting, the reduction that undoes a broadcast
// (sum_to), in-place accumulation, and the bias broadcasts that seed a GEMM or a convolution.
//
// Arrays are contiguous, of one `dtype` (float32, bfloat16 or float16; computed in float32, any
// other dtype throws galley::Error naming the op). Shapes are given as `rank` sizes each, already
// aligned to the output's rank (missing leading dimensions are 1); sizes of 1 broadcast.
// The CUDA launchers take device pointers and the cudaStream_t to run on; they only enqueue.
#include <cstdint>

#include "galley/dtype.h"

namespace galley::kernels {

enum class BinaryOp { Add, Sub, Mul, Div };

namespace cpu {

// out = a (op) b, broadcast.
void binary(BinaryOp op, DType dtype, const void* a, const int64_t* a_shape, const void* b,
            const int64_t* b_shape, void* out, const int64_t* out_shape, int rank);
// out = g (shape g_shape) summed over the dimensions where `shape` is 1, in float32.
void sum_to(DType dtype, const void* g, const int64_t* g_shape, void* out, const int64_t* shape,
            int rank);
// acc[i] += g[i]
void add_inplace(DType dtype, void* acc, const void* g, int64_t n);
// out[r, j] = bias[j] for a rows x n float32 matrix.
void broadcast_rows(const float* bias, int64_t rows, int64_t n, float* out);

}  // namespace cpu

namespace cuda {

void binary(BinaryOp op, DType dtype, const void* a, const int64_t* a_shape, const void* b,
            const int64_t* b_shape, void* out, const int64_t* out_shape, int rank, void* stream);
void sum_to(DType dtype, const void* g, const int64_t* g_shape, void* out, const int64_t* shape,
            int rank, void* stream);
void add_inplace(DType dtype, void* acc, const void* g, int64_t n, void* stream);
void broadcast_rows(const float* bias, int64_t rows, int64_t n, float* out, void* stream);
// y[n, o, p] = bias[o] for a float32 [N, O, P] tensor (seeding a convolution's output).
void broadcast_channels(const float* bias, int64_t n, int64_t o, int64_t p, float* out,
                        void* stream);

}  // namespace cuda
}  // namespace galley::kernels
