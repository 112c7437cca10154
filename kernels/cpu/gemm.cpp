#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <Eigen/Core>

#include "galley/ops.h"

namespace galley::kernels::cpu {
namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename A, typename B>
void finish(Map& c, const A& a, const B& b, float alpha, float beta) {
  if (beta == 0.f) {
    if (alpha == 1.f)
      c.noalias() = a * b;
    else
      c.noalias() = alpha * (a * b);
  } else {
    if (beta != 1.f) c *= beta;
    if (alpha == 1.f)
      c.noalias() += a * b;
    else
      c.noalias() += alpha * (a * b);
  }
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // Eigen forks omp_get_max_threads() threads for a large product; that setting is per calling
  // thread, so replicas on their own threads each keep to their own share of the cores.
  if (!omp_in_parallel() && omp_get_max_threads() != num_threads())
    omp_set_num_threads(num_threads());
  Map C(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (beta == 0.f)
      C.setZero();
    else
      C *= beta;
    return;
  }
  ConstMap A(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap B(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!trans_a && !trans_b)
    finish(C, A, B, alpha, beta);
  else if (!trans_a && trans_b)
    finish(C, A, B.transpose(), alpha, beta);
  else if (trans_a && !trans_b)
    finish(C, A.transpose(), B, alpha, beta);
  else
    finish(C, A.transpose(), B.transpose(), alpha, beta);
}

void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate) {
  if (!accumulate) std::fill_n(out, n, 0.f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = g + i * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] += r[j];
  }
}

}  // namespace galley::kernels::cpu
