#pragma once
// Row-major GEMM: C = alpha * op(A) * op(B) + beta * C, with op(A) M x K, op(B) K x N, C M x N,
// and lda/ldb/ldc the row strides of the stored matrices. float32 everywhere; 16-bit A and B with
// float32 C where the hardware multiplies 16-bit values (bfloat16 on AMX tiles or AVX512-BF16 on
// the host, tensor cores on a GPU). On the host through Eigen, spread over galley's threads unless
// called from inside a parallel region; on a GPU through cuBLAS on `stream` (a cudaStream_t), with
// the thread's handle for `device` (the caller makes `device` current).
#include <cstdint>

#include "galley/dtype.h"
#include "galley/half.h"

namespace galley::kernels {
namespace cpu {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Whether gemm_bf16 runs here: where the bfloat16 convolutions multiply bfloat16 values
// (cpu/conv2d_direct.h's bf16_kernels()): AMX tiles in builds for hosts with AMX-BF16 whose kernel
// grants the tile state, vdpbf16ps in builds for hosts with AVX512-BF16 and no AMX.
bool gemm_bf16_available();
// C = op(A) * op(B) (+ C when accumulate) for bfloat16 A and B and float32 C: bfloat16 products
// summed in float32, on AMX tiles or vdpbf16ps. Spread over galley's threads unless called from
// inside a parallel region; an error where gemm_bf16_available() is false.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
               int64_t lda, const bfloat16* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace cpu

namespace cuda {

void gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream);
// C = op(A) * op(B) (+ C when accumulate) for A and B of `dtype` (bfloat16 or float16) and float32
// C, on tensor cores: 16-bit products summed in float32 (cublasGemmEx, CUBLAS_COMPUTE_32F), the
// sums written to C unrounded, as cpu::gemm_bf16 does.
void gemm_16bit(int device, DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb, bool accumulate,
                float* c, int64_t ldc, void* stream);
// Creates this thread's cuBLAS and cuDNN handles for `device` if it has none yet (before a CUDA
// graph capture, which forbids creating them).
void prepare(int device);

}  // namespace cuda
}  // namespace galley::kernels
