#include "kernels/gemm.h"

#include <Eigen/Core>
#include <algorithm>

#include <cstring>
#include <vector>

#include "galley/error.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/conv2d_direct.h"
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

#if defined(__AVX512BF16__)
// The bfloat16 GEMM on vdpbf16ps: each instruction multiplies 16 pairs of bfloat16 values and adds
// both products of a pair into one float32 lane, so pairs run along k. op(B) is packed into panels
// of 16 columns, [panel][k pair][16 columns x 2] (64 bytes a pair row, zero-padded in n and k);
// op(A)'s rows are read as k pairs, each broadcast to every lane, straight from A when it is
// row-major with an even k, else from a packed copy [row][k pair]. Blocks of up to 8 rows x 2
// panels keep 16 float32 accumulators in registers; a block's sums go to C once, at the end.
constexpr int64_t kPanel = 16;  // columns of a B panel: one vector of float32 sums
constexpr int64_t kRows = 8;    // rows of A in a register block

// Two bfloat16 rows interleaved into pair words (r1 null: zero partners): word j, r0[j] in its
// low half, goes to out[(j / kPanel) * chunk + j % kPanel].
void interleave_rows(const uint16_t* r0, const uint16_t* r1, int64_t count, uint32_t* out,
                     int64_t chunk) {
  for (int64_t j = 0; j < count; j += kPanel) {
    const __mmask16 m = lanes(count - j);
    _mm512_mask_storeu_epi32(out + (j / kPanel) * chunk, m,
                             pairs_of(r0 + j, r1 ? r1 + j : nullptr, m));
  }
}

// op(B) as panels of k pairs (kp of them).
std::vector<uint32_t> pack_b_pairs(bool trans_b, int64_t n, int64_t k, int64_t kp,
                                   const uint16_t* b, int64_t ldb) {
  std::vector<uint32_t> out(size_t(((n + kPanel - 1) / kPanel) * kp * kPanel), 0);
  if (!trans_b) {  // rows 2l and 2l + 1 of B make pair row l of every panel
    for (int64_t l = 0; l < kp; ++l)
      interleave_rows(b + 2 * l * ldb, 2 * l + 1 < k ? b + (2 * l + 1) * ldb : nullptr, n,
                      out.data() + l * kPanel, kp * kPanel);
    return out;
  }
  // A column of op(B) is a row of B: its pairs are consecutive words already.
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = b + j * ldb;
    uint32_t* dst = out.data() + (j / kPanel) * kp * kPanel + j % kPanel;
    for (int64_t l = 0; l < k / 2; ++l) dst[l * kPanel] = pair_at(row + 2 * l);
    if (k % 2) dst[(kp - 1) * kPanel] = row[k - 1];
  }
  return out;
}

// op(A) for a transposed A, pair-major: pair l of row i at word l * m + i (rows 2l and 2l + 1 of
// A interleaved).
std::vector<uint32_t> pack_a_pairs(int64_t m, int64_t k, int64_t kp, const uint16_t* a,
                                   int64_t lda) {
  std::vector<uint32_t> out(size_t(m * kp));
  for (int64_t l = 0; l < kp; ++l)
    interleave_rows(a + 2 * l * lda, 2 * l + 1 < k ? a + (2 * l + 1) * lda : nullptr, m,
                    out.data() + l * m, kPanel);
  return out;
}

// Where op(A)'s pairs are: pair l of row r at a + r * row + l * pair (in bfloat16 elements).
struct PairRows {
  const uint16_t* a;
  int64_t row, pair;
};

// Rows [0, R) of op(A) times NP panels of B (bp, panels kp * kPanel apart) into C's rows and the
// `cols` columns from its origin.
template <int R, int NP>
void dot_block(PairRows a, const uint32_t* bp, int64_t kp, float* c, int64_t ldc, int64_t cols,
               bool accumulate) {
  __m512 acc[R][NP];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  const uint32_t* b1 = bp + kp * kPanel;
  for (int64_t l = 0; l < kp; ++l) {
    __m512bh b[NP];
    b[0] = (__m512bh)_mm512_loadu_si512(bp + l * kPanel);
    if (NP == 2) b[NP - 1] = (__m512bh)_mm512_loadu_si512(b1 + l * kPanel);
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(pair_at(a.a + r * a.row + l * a.pair)));
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], av, b[p]);
    }
  }
  for (int p = 0; p < NP; ++p) {
    const __mmask16 mask = lanes(cols - p * kPanel);
    for (int r = 0; r < R; ++r) {
      float* row = c + r * ldc + p * kPanel;
      __m512 v = acc[r][p];
      if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, row));
      _mm512_mask_storeu_ps(row, mask, v);
    }
  }
}

template <int NP>
void dot_rows(int64_t rows, PairRows a, const uint32_t* bp, int64_t kp, float* c, int64_t ldc,
              int64_t cols, bool accumulate) {
  switch (rows) {
#define GALLEY_DOT_ROWS(R) \
  case R:                  \
    return dot_block<R, NP>(a, bp, kp, c, ldc, cols, accumulate);
    GALLEY_DOT_ROWS(1)
    GALLEY_DOT_ROWS(2)
    GALLEY_DOT_ROWS(3)
    GALLEY_DOT_ROWS(4)
    GALLEY_DOT_ROWS(5)
    GALLEY_DOT_ROWS(6)
    GALLEY_DOT_ROWS(7)
    GALLEY_DOT_ROWS(8)
#undef GALLEY_DOT_ROWS
  }
}

void gemm_bf16_dot(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                   int64_t lda, const uint16_t* b, int64_t ldb, bool accumulate, float* c,
                   int64_t ldc) {
  const int64_t kp = (k + 1) / 2;
  const std::vector<uint32_t> bp = pack_b_pairs(trans_b, n, k, kp, b, ldb);
  std::vector<uint32_t> ap;
  std::vector<uint16_t> even;
  PairRows pairs{a, lda, 2};  // row-major A: its own pairs
  if (trans_a) {
    ap = pack_a_pairs(m, k, kp, a, lda);
    pairs = {reinterpret_cast<const uint16_t*>(ap.data()), 2, 2 * m};
  } else if (k % 2) {  // the last pair would read past a row: a copy with a zero column
    even.assign(size_t(m * (k + 1)), 0);
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(even.data() + i * (k + 1), a + i * lda, size_t(k) * sizeof(uint16_t));
    pairs = {even.data(), k + 1, 2};
  }
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t col_blocks = (panels + 1) / 2, row_blocks = (m + kRows - 1) / kRows;
  // Column blocks outer, so that consecutive blocks of a thread reuse one strip of B from cache.
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t cb = blk / row_blocks, rb = blk % row_blocks;
      const int64_t j0 = cb * 2 * kPanel, i0 = rb * kRows;
      const int64_t cols = std::min(2 * kPanel, n - j0), rows = std::min(kRows, m - i0);
      const PairRows a0{pairs.a + i0 * pairs.row, pairs.row, pairs.pair};
      const uint32_t* p0 = bp.data() + (j0 / kPanel) * kp * kPanel;
      float* c0 = c + i0 * ldc + j0;
      if (cols > kPanel)
        dot_rows<2>(rows, a0, p0, kp, c0, ldc, cols, accumulate);
      else
        dot_rows<1>(rows, a0, p0, kp, c0, ldc, cols, accumulate);
    }
  };
  const double flops = 2.0 * double(m) * double(n) * double(k);
  if (in_region() || flops < 2 * kGemmFlopsPerThread)
    run(0, col_blocks * row_blocks);
  else
    parallel_balanced(col_blocks * row_blocks, 1, run);
}
#endif  // __AVX512BF16__
}  // namespace

bool gemm_bf16_available() {
  const Bf16Kernels k = bf16_kernels();
  return k == Bf16Kernels::Tiles || k == Bf16Kernels::DotProducts;
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
               int64_t lda, const bfloat16* b, int64_t ldb, bool accumulate, float* c,
               int64_t ldc) {
  GALLEY_CHECK(gemm_bf16_available(),
               "gemm: the bfloat16 GEMM needs AMX tiles or AVX512-BF16 that runs at the float32 ",
               "FMA rate, which this host or build does not have");
  if (m == 0 || n == 0) return;
#if defined(__AVX512BF16__)
  if (bf16_kernels() == Bf16Kernels::DotProducts)
    return gemm_bf16_dot(trans_a, trans_b, m, n, k, reinterpret_cast<const uint16_t*>(a), lda,
                         reinterpret_cast<const uint16_t*>(b), ldb, accumulate, c, ldc);
#endif
#if defined(GALLEY_AMX)
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
    parallel_balanced(rows * cols, 1, run);
#else
  (void)trans_a, (void)trans_b, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)accumulate,
      (void)c, (void)ldc;
#endif
}

}  // namespace galley::kernels::cpu
