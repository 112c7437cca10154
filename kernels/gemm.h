#pragma once
// Row-major float32 GEMM: C = alpha * op(A) * op(B) + beta * C, with op(A) M x K, op(B) K x N,
// C M x N, and lda/ldb/ldc the row strides of the stored matrices. On the host through Eigen,
// spread over galley's threads unless called from inside a parallel region; on a GPU through
// cuBLAS on `stream` (a cudaStream_t), with the thread's handle for `device` (the caller makes
// `device` current).
#include <cstdint>

namespace galley::kernels {
namespace cpu {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace cpu

namespace cuda {

void gemm(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, void* stream);
// Creates this thread's cuBLAS and cuDNN handles for `device` if it has none yet (before a CUDA
// graph capture, which forbids creating them).
void prepare(int device);

}  // namespace cuda
}  // namespace galley::kernels
