#include "kernels/gemm.h"

#include <Eigen/Core>
#include <algorithm>

#include <cstring>
#include <vector>

#include "galley/error.h"
#include "kernels/cpu/amx.h"
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

namespace {
#if defined(GALLEY_AMX)
// The bfloat16 GEMM on tiles. op(A) is packed as [block of 16 rows][block of 32 k][16][32], op(B)
// as [block of 16 columns][block of 32 k][16 pairs of k][16 columns x 2], both zero-padded, so each
// tile is one contiguous 1 KiB load; blocks of 2 x 2 output tiles accumulate over k in tiles 0-3
// (4-5 hold A, 6-7 B) and go to C through a float32 buffer (C's edges need not be whole tiles).
struct Bf16Packed {
  int64_t mb, nb, kb;  // blocks of 16 rows, 16 columns, 32 k
  std::vector<uint16_t> a, b;
};

Bf16Packed pack_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                     int64_t lda, const uint16_t* b, int64_t ldb) {
  Bf16Packed p;
  p.mb = (m + kTile - 1) / kTile, p.nb = (n + kTile - 1) / kTile, p.kb = (k + 31) / 32;
  p.a.assign(size_t(p.mb * p.kb * kTile * 32), 0);
  p.b.assign(size_t(p.nb * p.kb * kTile * 32), 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l)
      p.a[size_t(((i / kTile) * p.kb + l / 32) * kTile * 32 + (i % kTile) * 32 + l % 32)] =
          trans_a ? a[l * lda + i] : a[i * lda + l];
  for (int64_t l = 0; l < k; ++l)
    for (int64_t j = 0; j < n; ++j)
      p.b[size_t(((j / kTile) * p.kb + l / 32) * kTile * 32 + ((l % 32) / 2) * 32 +
                 (j % kTile) * 2 + l % 2)] = trans_b ? b[j * ldb + l] : b[l * ldb + j];
  return p;
}

// Output tiles (bi, bj) and (bi + 1, bj), ... of a 2 x 2 block at most (mt x nt tiles) into c.
template <int MT, int NT>
void bf16_block(const Bf16Packed& p, int64_t bi, int64_t bj, float* buf) {
  const int64_t tile = kTile * 32;
  _tile_zero(0);
  if (NT == 2) _tile_zero(1);
  if (MT == 2) _tile_zero(2);
  if (MT == 2 && NT == 2) _tile_zero(3);
  const uint16_t* a0 = p.a.data() + bi * p.kb * tile;
  const uint16_t* b0 = p.b.data() + bj * p.kb * tile;
  for (int64_t l = 0; l < p.kb; ++l) {
    _tile_loadd(4, a0 + l * tile, 64);
    _tile_loadd(6, b0 + l * tile, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (NT == 2) {
      _tile_loadd(7, b0 + (p.kb + l) * tile, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (MT == 2) {
      _tile_loadd(5, a0 + (p.kb + l) * tile, 64);
      _tile_dpbf16ps(2, 5, 6);
      if (NT == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  const int64_t ld = 2 * kTile * int64_t(sizeof(float));  // buf is 32 x 32
  _tile_stored(0, buf, ld);
  if (NT == 2) _tile_stored(1, buf + kTile, ld);
  if (MT == 2) _tile_stored(2, buf + kTile * 2 * kTile, ld);
  if (MT == 2 && NT == 2) _tile_stored(3, buf + kTile * 2 * kTile + kTile, ld);
}
#endif  // GALLEY_AMX
}  // namespace

bool gemm_bf16_available() {
#if defined(GALLEY_AMX)
  return amx_granted();
#else
  return false;
#endif
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
               int64_t lda, const bfloat16* b, int64_t ldb, bool accumulate, float* c,
               int64_t ldc) {
  GALLEY_CHECK(gemm_bf16_available(),
               "gemm: the bfloat16 GEMM needs AMX tiles, which this host or build does not have");
#if defined(GALLEY_AMX)
  if (m == 0 || n == 0) return;
  const Bf16Packed p = pack_bf16(trans_a, trans_b, m, n, k, reinterpret_cast<const uint16_t*>(a),
                                 lda, reinterpret_cast<const uint16_t*>(b), ldb);
  const int64_t rows = (p.mb + 1) / 2, cols = (p.nb + 1) / 2;  // blocks of 2 x 2 tiles
  const double flops = 2.0 * double(m) * double(n) * double(k);
  auto run = [&](int64_t b0, int64_t b1) {
    TileScope tiles;
    alignas(64) float buf[4 * kTile * kTile];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t bi = 2 * (blk / cols), bj = 2 * (blk % cols);
      const bool two_m = bi + 1 < p.mb, two_n = bj + 1 < p.nb;
      if (two_m && two_n)
        bf16_block<2, 2>(p, bi, bj, buf);
      else if (two_m)
        bf16_block<2, 1>(p, bi, bj, buf);
      else if (two_n)
        bf16_block<1, 2>(p, bi, bj, buf);
      else
        bf16_block<1, 1>(p, bi, bj, buf);
      const int64_t i0 = bi * kTile, j0 = bj * kTile;
      const int64_t mi = std::min<int64_t>(2 * kTile, m - i0),
                    nj = std::min<int64_t>(2 * kTile, n - j0);
      for (int64_t i = 0; i < mi; ++i) {
        float* row = c + (i0 + i) * ldc + j0;
        const float* src = buf + i * 2 * kTile;
        if (accumulate) {
#pragma omp simd
          for (int64_t j = 0; j < nj; ++j) row[j] += src[j];
        } else {
          std::memcpy(row, src, size_t(nj) * sizeof(float));
        }
      }
    }
  };
  if (in_region() || flops < 2 * kGemmFlopsPerThread)
    run(0, rows * cols);
  else
    parallel_for(rows * cols, 1, run);
#else
  (void)trans_a, (void)trans_b, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)accumulate,
      (void)c, (void)ldc;
#endif
}

}  // namespace galley::kernels::cpu
