#include "kernels/gemm.h"

#include <Eigen/Core>
#include <algorithm>

#include "kernels/cpu/parallel.h"

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

namespace {
void gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
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

// Products below this many flops per thread stay on one thread: forking costs more.
constexpr double kGemmFlopsPerThread = 4e6;
// Bands of C are whole vectors wide.
constexpr int64_t kGemmAlign = 16;
}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const int64_t along = std::max(m, n);
  const int64_t threads =
      std::min<int64_t>({int64_t(num_threads()), round_up(along, kGemmAlign) / kGemmAlign,
                         std::max<int64_t>(1, int64_t(flops / kGemmFlopsPerThread))});
  if (threads <= 1 || in_region()) {
    gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Each thread takes a band of C along its longer side: rows of A, or columns of B.
  const int64_t band = (along + threads - 1) / threads;
  const int64_t width = round_up(band, kGemmAlign);
  parallel_for((along + width - 1) / width, 1, [&](int64_t b0, int64_t b1) {
    const int64_t lo = b0 * width, hi = std::min(along, b1 * width);
    if (n >= m)
      gemm_serial(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, trans_b ? b + lo * ldb : b + lo,
                  ldb, beta, c + lo, ldc);
    else
      gemm_serial(trans_a, trans_b, hi - lo, n, k, alpha, trans_a ? a + lo : a + lo * lda, lda, b,
                  ldb, beta, c + lo * ldc, ldc);
  });
}

}  // namespace galley::kernels::cpu
