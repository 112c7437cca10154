#pragma once
// The register block shared by the convolution kernels that run on float32 vectors (the direct
// path's correlations, cpu/conv2d_direct.cpp, and the Winograd path's transformed products,
// cpu/conv2d_winograd.cpp): OB output channels x NV vectors, summed over a run of inputs, each
// input one vector load and each weight one broadcast. And the 16 x 16 transpose in registers
// both use to move between planes and channels across the lanes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/bf16_avx512.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace galley::kernels::cpu::conv_block {

// L floats: one vector register (the compiler splits it on hosts with neither AVX-512 nor AVX2).
// OB output channels x up to 3 vectors of outputs in the accumulators: with AVX-512's 32
// registers 8 x 3, with AVX2's 16 4 x 3, which leaves room for the loads and the broadcast.
#if defined(__AVX512F__)
constexpr int64_t L = 16;
constexpr int64_t OB = 8;
#else
constexpr int64_t L = 8;
constexpr int64_t OB = 4;
#endif
using V = float __attribute__((vector_size(L * sizeof(float))));

inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}
inline V splat(float s) {
  return V{} + s;
}
// splat(*p), as one broadcast load (no scalar register on the way).
inline V broadcast(const float* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<V>(_mm512_set1_ps(*p));
#elif defined(__AVX__)
  return reinterpret_cast<V>(_mm256_broadcast_ss(p));
#else
  return splat(*p);
#endif
}

// Holds v in a register from here on. With AVX2's 16 registers GCC would otherwise fold the
// blocks' vector loads into their FMAs, loading each vector once per broadcast: 16 loads for 12
// FMAs, more than two loads a cycle can feed (AMD Zen 3 ran the 4 x 3 blocks at about 70% of its
// FMA rate). AVX-512's blocks keep to the compiler's choice.
inline void in_register(V& v) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  asm("" : "+x"(v));
#else
  (void)v;
#endif
}

// Holds v in a register from here on, AVX-512 builds included: for a vector that several
// multiply-adds take in a row (the stems' weight gradient's output gradient, three columns a
// load), which GCC would otherwise load again for each of them, past the two 64-byte loads a
// cycle an Intel Xeon takes.
inline void held(V& v) {
#if defined(__AVX__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// acc[o][v][i] = sum over c < cin, t < taps of wb[(c * taps + t) * ldw + o] *
// x[c * plane + shift[t] + xo[v] + i], for OB output channels o and NV vectors v: the weights
// packed [cin][taps][OB] (or in rows of ldw, the block's OB first), each vector's outputs at
// consecutive inputs from its offset xo[v].
template <int NV>
__attribute__((always_inline)) inline void correlate_sums(const float* x, int64_t plane,
                                                          int64_t cin, const int64_t* shift,
                                                          int64_t taps, const float* wb,
                                                          int64_t ldw, const int64_t (&xo)[NV],
                                                          V (&acc)[OB][NV]) {
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[o][v] = V{};
  for (int64_t c = 0; c < cin; ++c, x += plane) {
    for (int64_t t = 0; t < taps; ++t, wb += ldw) {
      const float* xs = x + shift[t];
      V xv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        xv[v] = load(xs + xo[v]);
        in_register(xv[v]);
      }
#pragma GCC unroll 8
      for (int o = 0; o < OB; ++o) {
        const V wv = broadcast(wb + o);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[o][v] += wv * xv[v];
      }
    }
  }
}

// y[o][v * L + i] (+)= the correlate_sums of NV consecutive vectors (xo[v] = v * L), rows of y
// ldy apart. kAdd adds to y, else overwrites it.
template <int NV, bool kAdd = false>
void correlate_block(const float* x, int64_t plane, int64_t cin, const int64_t* shift, int64_t taps,
                     const float* wb, float* y, int64_t ldy, int64_t ldw = OB) {
  int64_t xo[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) xo[v] = v * L;
  V acc[OB][NV];
  correlate_sums<NV>(x, plane, cin, shift, taps, wb, ldw, xo, acc);
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* out = y + o * ldy + v * L;
      store(out, kAdd ? load(out) + acc[o][v] : acc[o][v]);
    }
}

// Weights packed for correlate_block: [block of OB rows][col][OB], `at(row, col)` the weight of
// output row `row` (an output channel) and column `col` (an (input channel, tap) pair, c * taps +
// t), zero past the rows.
template <typename At>
std::vector<float> pack_block_weights(int64_t rows, int64_t cols, At at) {
  const int64_t blocks = (rows + OB - 1) / OB;
  std::vector<float> out(size_t(blocks * cols * OB), 0.f);
  for (int64_t rb = 0; rb < blocks; ++rb)
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t r = 0; r < OB && rb * OB + r < rows; ++r)
        out[size_t((rb * cols + j) * OB + r)] = at(rb * OB + r, j);
  return out;
}

// GCC would carry the loads of broadcast_block's rows over to the next step (the input at i + 1
// is the next step's at i) through scalar registers and the stack, which costs more than the
// broadcasts it saves.
#if defined(__GNUC__) && !defined(__clang__)
#define GALLEY_NO_PREDICTIVE_COMMONING __attribute__((optimize("no-predictive-commoning")))
#else
#define GALLEY_NO_PREDICTIVE_COMMONING
#endif

// One step of a register block with the weights (or gradients) across the lanes: acc[j][v] +=
// *at(j) * w[v] for NJ broadcasts and OV vectors from w, held in registers (in_register).
template <int NJ, int OV, typename At>
__attribute__((always_inline)) inline void broadcast_step(const float* w, At at, V (&acc)[NJ][OV]) {
  V wv[OV];
#pragma GCC unroll 4
  for (int v = 0; v < OV; ++v) {
    wv[v] = load(w + v * L);
    in_register(wv[v]);
  }
#pragma GCC unroll 24
  for (int j = 0; j < NJ; ++j) {
    const V xv = broadcast(at(j));
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) acc[j][v] += xv * wv[v];
  }
}

// out[j][v * L + i] (+)= sum over s < n of x_j[s] * g[s * ldg + v * L + i]: NR x KW columns j
// of OV vectors each, every step one broadcast a column and OV vector loads (the direct path's
// weight gradient, columns (input channel, tap) and vectors of output channels over the flat
// outputs; the narrow Winograd products, columns tiles and vectors of output channels over the
// input channels). kAdd adds to out, else overwrites it. The columns come in NR rows of KW whose
// inputs are consecutive (KW taps of one kernel row at stride 1 and dilation 1): row r reads
// xs[r * KW] + s + b for its column b; KW = 1 for any columns. One pointer a row: 24 columns
// would otherwise want more pointers than there are registers, and reloading them from the
// stack every step costs a third of the block's time.
template <int OV, int NR, int KW, bool kAdd>
GALLEY_NO_PREDICTIVE_COMMONING void broadcast_block(const float* g, int64_t ldg, int64_t n,
                                                    const float* const* xs, float* out,
                                                    int64_t ldo) {
  V acc[NR * KW][OV];
  const float* x[NR];
#pragma GCC unroll 24
  for (int r = 0; r < NR; ++r) x[r] = xs[r * KW];
#pragma GCC unroll 24
  for (int j = 0; j < NR * KW; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) acc[j][v] = V{};
  for (int64_t i = 0; i < n; ++i, g += ldg)
    broadcast_step(
        g, [&](int j) { return x[j / KW] + i + j % KW; }, acc);
#pragma GCC unroll 24
  for (int j = 0; j < NR * KW; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) {
      float* o = out + j * ldo + v * L;
      store(o, kAdd ? load(o) + acc[j][v] : acc[j][v]);
    }
}

// correlate_block over `nvec` consecutive vectors of outputs (OB channels, rows ldy apart), in
// blocks of three vectors and the rest in blocks of two or one: four left go as two and two (a
// block of one has a broadcast for each product and runs at about half the speed).
template <bool kAdd = false>
void correlate_vectors(const float* x, int64_t plane, int64_t cin, const int64_t* shift,
                       int64_t taps, const float* wb, float* y, int64_t ldy, int64_t nvec,
                       int64_t ldw = OB) {
  int64_t v = 0;
  for (; v + 3 <= nvec && nvec - v != 4; v += 3)
    correlate_block<3, kAdd>(x + v * L, plane, cin, shift, taps, wb, y + v * L, ldy, ldw);
  for (; nvec - v >= 2; v += 2)
    correlate_block<2, kAdd>(x + v * L, plane, cin, shift, taps, wb, y + v * L, ldy, ldw);
  if (nvec - v == 1)
    correlate_block<1, kAdd>(x + v * L, plane, cin, shift, taps, wb, y + v * L, ldy, ldw);
}

// The shift of a single tap (a 1x1 kernel, or products that are one), for the blocks above.
inline constexpr int64_t kNoShift = 0;

#if defined(__AVX512F__)
// r[j] = column j of the 16 x 16 matrix whose row k is r[k]. Three rounds of shuffles: pairs of
// rows, then quads (after which register 4g + c holds, in 128-bit lane l, column 4l + c of rows
// 4g..4g+3), then the lanes regathered so that column 4l + c takes lane l of registers c, 4 + c,
// 8 + c and 12 + c.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i]), pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i]), pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i + 1]), pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i + 1]), pd(t[i + 3])));
  }
  for (int c = 0; c < 4; ++c) {
    // u: columns c and 8 + c (rows 0-7), u8: the same of rows 8-15; v, v8: 4 + c and 12 + c.
    const __m512 u = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 v = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
    const __m512 u8 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 v8 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_f32x4(u, u8, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(u, u8, 0xdd);
    t[4 + c] = _mm512_shuffle_f32x4(v, v8, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(v, v8, 0xdd);
  }
  for (int k = 0; k < 16; ++k) r[k] = t[k];
}
#endif

#if defined(__AVX512BF16__)
// The register block on bfloat16 pairs (AVX512-BF16): vdpbf16ps multiplies 16 pairs of bfloat16
// values and adds both products of each pair to one float32 lane (exact products, float32 sums),
// so one instruction does the work of two FMAs on half the bytes. y[o][v * L + i] = the sum over
// pair planes k < kp (plane pairs apart) and taps t of the pair x[k][shift[t] + v * L + i] dotted
// with the weights' pair wb[(k * taps + t) * OB + o]: the direct path's correlations on channel
// pairs, and the Winograd path's products on pairs of transformed input channels (one tap).
inline __m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// y[r * ldy + v * L + i] = (or, kAdd, +=) lane i of acc[r][v]: a register block's sums out.
template <bool kAdd, int R, int NV>
__attribute__((always_inline)) inline void store_sums(const __m512 (&acc)[R][NV], float* y,
                                                      int64_t ldy) {
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* out = y + r * ldy + v * L;
      _mm512_storeu_ps(out, kAdd ? _mm512_add_ps(_mm512_loadu_ps(out), acc[r][v]) : acc[r][v]);
    }
}

template <int NV, bool kAdd = false>
void correlate_pairs_block(const Pair* x, int64_t plane, int64_t kp, const int64_t* shift,
                           int64_t taps, const Pair* wb, float* y, int64_t ldy) {
  __m512 acc[OB][NV];
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[o][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kp; ++k, x += plane) {
    for (int64_t t = 0; t < taps; ++t, wb += OB) {
      const Pair* xs = x + shift[t];
      __m512i xv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) xv[v] = _mm512_loadu_si512(xs + v * L);
#pragma GCC unroll 8
      for (int o = 0; o < OB; ++o) {
        const __m512i wv = _mm512_set1_epi32(int(wb[o]));
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[o][v] = dot(acc[o][v], xv[v], wv);
      }
    }
  }
  store_sums<kAdd>(acc, y, ldy);
}

// broadcast_step on bfloat16 pairs: acc[j][v] += the pair at(j)[0], at(j)[1] dotted with the
// pairs w[v * L + i], for NJ broadcasts and OV vectors of pairs from w.
template <int NJ, int OV, typename At>
__attribute__((always_inline)) inline void broadcast_pairs_step(const Pair* w, At at,
                                                                __m512 (&acc)[NJ][OV]) {
  __m512i wv[OV];
#pragma GCC unroll 4
  for (int v = 0; v < OV; ++v) wv[v] = _mm512_loadu_si512(w + v * L);
#pragma GCC unroll 24
  for (int j = 0; j < NJ; ++j) {
    const __m512i xv = _mm512_set1_epi32(int(pair_at(at(j))));
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) acc[j][v] = dot(acc[j][v], wv[v], xv);
  }
}

// broadcast_block on bfloat16 pairs: out[j][v * L + i] (+)= sum over steps s < n of the pair
// x_j[2s], x_j[2s + 1] dotted with the pair g[s * ldg + v * L + i]. The direct path's weight
// gradient (g the output gradient as pairs of flat outputs, the columns its inputs shifted by their
// taps) and the narrow Winograd products on pairs (g the transformed kernels' pairs of input
// channels, the columns tiles' channel-last transformed inputs). Rows of KW consecutive columns
// share a pointer as in broadcast_block.
template <int OV, int NR, int KW, bool kAdd>
GALLEY_NO_PREDICTIVE_COMMONING void broadcast_pairs_block(const Pair* g, int64_t ldg, int64_t n,
                                                          const uint16_t* const* xs, float* out,
                                                          int64_t ldo) {
  constexpr int NJ = NR * KW;
  __m512 acc[NJ][OV];
  const uint16_t* x[NR];
#pragma GCC unroll 24
  for (int r = 0; r < NR; ++r) x[r] = xs[r * KW];
#pragma GCC unroll 24
  for (int j = 0; j < NJ; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int64_t s = 0; s < n; ++s, g += ldg)
    broadcast_pairs_step(
        g, [&](int j) { return x[j / KW] + 2 * s + j % KW; }, acc);
  store_sums<kAdd>(acc, out, ldo);
}

// correlate_pairs_block over `nvec` consecutive vectors of outputs (OB channels, rows ldy apart):
// blocks of three vectors, then one of two or one. kAdd adds to y, else overwrites it.
template <bool kAdd = false>
void correlate_pairs_vectors(const Pair* x, int64_t plane, int64_t kp, const int64_t* shift,
                             int64_t taps, const Pair* wb, float* y, int64_t ldy, int64_t nvec) {
  int64_t v = 0;
  for (; v + 3 <= nvec; v += 3)
    correlate_pairs_block<3, kAdd>(x + v * L, plane, kp, shift, taps, wb, y + v * L, ldy);
  if (nvec - v == 2)
    correlate_pairs_block<2, kAdd>(x + v * L, plane, kp, shift, taps, wb, y + v * L, ldy);
  else if (nvec - v == 1)
    correlate_pairs_block<1, kAdd>(x + v * L, plane, kp, shift, taps, wb, y + v * L, ldy);
}
#endif  // __AVX512BF16__

}  // namespace galley::kernels::cpu::conv_block
