#pragma once
// Row-major single-precision GEMM through Eigen: C = alpha * op(A) * op(B) + beta * C.
#include <cstdint>

namespace galley::kernels::cpu {

// op(A) is M x K, op(B) is K x N, C is M x N; lda/ldb/ldc are row strides of the stored
// matrices. Runs on galley's threads unless called from inside a parallel region.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// out[j] (+)= sum over rows i of g[i * n + j], for a rows x n matrix.
void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate);

}  // namespace galley::kernels::cpu
