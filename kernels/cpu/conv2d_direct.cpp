#include "kernels/cpu/conv2d_direct.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "galley/error.h"
#include "kernels/convert.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/conv2d_block.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"
#include "kernels/cpu/strided_rows.h"
#include "kernels/cpu/vector_lanes.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace galley::kernels::cpu {
namespace {

// The weight gradient's register block: kWeightGradAcc accumulators of at most
// kMaxWeightGradVectors vectors of output channels each: with AVX-512's 32 registers 24 (of 4
// vectors); with AVX2's 16, 12 (of 2). The correlations' block is conv_block's (OB x 3 vectors).
using namespace conv_block;
#if defined(__AVX512F__)
constexpr int kWeightGradAcc = 24;
constexpr int64_t kMaxWeightGradVectors = 4;
#else
constexpr int kWeightGradAcc = 12;
constexpr int64_t kMaxWeightGradVectors = 2;
#endif

// The largest stride the direct path takes (conv2d_direct_use): the phases of a plane per axis.
constexpr int64_t kMaxStride = 4;

// One correlation: `cin` planes of h x w, zero-bordered by pad_h / pad_w, against kh x kw taps
// spaced `d` apart at stride `s`, giving `cout` planes of oh() x ow().
//
// Each bordered plane is held as its phases: with stride s, padded row r is row r / s of row phase
// r % s (columns alike), and tap (a, b) of output (i, j) reads phase (a d % s, b d % s) at row
// i + a d / s, column j + b d / s. So a run of consecutive outputs reads a run of consecutive
// inputs of one phase whatever the stride, every tap is a fixed shift from the flat output
// q = i * pw() + j, and no zero taps are added. Only the phases some tap reads are kept: stride 1
// has one, the plane itself. Strides above 1 take d = 1 (conv2d_direct_use), so the phases kept
// are the first min(s, k) of each axis.
struct Plan {
  int64_t cin, h, w, pad_h, pad_w, cout, kh, kw, d, s = 1;
  int64_t hp() const { return h + 2 * pad_h; }
  int64_t wp() const { return w + 2 * pad_w; }
  int64_t phase_rows() const { return std::min(s, (kh - 1) * d + 1); }  // row phases kept
  int64_t phase_cols() const { return std::min(s, (kw - 1) * d + 1); }
  int64_t ph() const { return (hp() + s - 1) / s; }  // rows of a phase
  int64_t pw() const { return (wp() + s - 1) / s; }  // columns of a phase: the flat output's pitch
  int64_t phase_size() const { return ph() * pw(); }
  int64_t oh() const { return (hp() - (kh - 1) * d - 1) / s + 1; }
  int64_t ow() const { return (wp() - (kw - 1) * d - 1) / s + 1; }
  int64_t plane() const { return phase_rows() * phase_cols() * phase_size(); }
  int64_t taps() const { return kh * kw; }
  int64_t q() const { return oh() * pw(); }        // flat outputs, junk columns included
  int64_t qs() const { return round_up(q(), L); }  // ... in whole vectors
  int64_t shift(int64_t t) const {
    const int64_t a = (t / kw) * d, b = (t % kw) * d;
    return ((a % s) * phase_cols() + b % s) * phase_size() + (a / s) * pw() + b / s;
  }
  std::vector<int64_t> shifts() const {
    std::vector<int64_t> v(static_cast<size_t>(taps()));
    for (int64_t t = 0; t < taps(); ++t) v[size_t(t)] = shift(t);
    return v;
  }
  // Room past the last plane for the reach of the last vector: (qs() - q()) + (kw - 1) * d + L
  // at stride 1.
  int64_t slack() const {
    int64_t reach = 0;
    for (int64_t t = 0; t < taps(); ++t) reach = std::max(reach, shift(t));
    return std::max<int64_t>(0, reach + qs() - plane()) + L;
  }
  // The bordered input, with the slack.
  int64_t bordered_floats() const { return cin * plane() + slack(); }
};

// Copies `p.cin` planes of T into the interior of the bordered buffer of D, float32 (16-bit
// values widened on the way) or T itself, each row split into its column phases at a stride; the
// border and the slack, zeroed once per call, stay zero.
template <typename T, typename D>
void fill_interior(const Plan& p, const T* src, D* dst) {
  if (p.s > 1) {
    // Per column phase b: the first input column it takes (j0, then every s-th), where that
    // lands in the phase's row, and how many it takes (none where j0 is past the row).
    const int64_t s = p.s, cols = p.phase_cols(), size = p.phase_size(), pw = p.pw();
    const int64_t plane = p.plane(), row_phases = p.phase_rows();
    int64_t j0[kMaxStride], at[kMaxStride], count[kMaxStride];
    for (int64_t b = 0; b < cols; ++b) {
      j0[b] = ((b - p.pad_w) % s + s) % s;
      at[b] = b * size + (j0[b] + p.pad_w) / s;
      count[b] = j0[b] < p.w ? (p.w - j0[b] + s - 1) / s : 0;
    }
    const int64_t even = j0[0] == 0 ? 0 : 1;  // at stride 2, the phase of the even columns
    for (int64_t c = 0; c < p.cin; ++c, dst += plane) {
      int64_t a = p.pad_h % s, rs = p.pad_h / s;  // padded row i + pad_h is row rs of phase a
      for (int64_t i = 0; i < p.h; ++i) {
        if (a < row_phases) {  // else a row no tap reads
          D* row = dst + a * cols * size + rs * pw;
          const T* from = src + (c * p.h + i) * p.w;
          if (s == 2 && cols == 2)  // both column phases in one pass
            deinterleave_row(from, p.w, row + at[even], row + at[1 - even]);
          else
            for (int64_t b = 0; b < cols; ++b)
              gather_strided(from + j0[b], row + at[b], count[b], s);
        }
        if (++a == s) a = 0, ++rs;
      }
    }
    return;
  }
  const int64_t plane = p.plane(), wp = p.wp();
  for (int64_t c = 0; c < p.cin; ++c)
    for (int64_t i = 0; i < p.h; ++i) {
      D* d = dst + c * plane + (i + p.pad_h) * wp + p.pad_w;
      const T* s = src + (c * p.h + i) * p.w;
      if constexpr (std::is_same_v<T, D>)
        copy_row(s, d, p.w);
      else
        to_float(s, d, p.w);
    }
}

// Writes the valid columns of the flat output: out[c][i][j] = flat[c * qs + i * pw + j] (+
// bias[c]), rounded once to a 16-bit T (through the flat row, which is scratch).
template <typename T>
void write_out(const Plan& p, float* flat, const float* bias, T* out, int64_t qs) {
  const int64_t oh = p.oh(), ow = p.ow(), pw = p.pw();
  for (int64_t c = 0; c < p.cout; ++c) {
    const float b = bias ? bias[c] : 0.f;
    for (int64_t i = 0; i < oh; ++i) {
      float* src = flat + c * qs + i * pw;
      T* dst = out + (c * oh + i) * ow;
      if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX512F__)
        const __m512 vb = _mm512_set1_ps(b);
        for (int64_t j = 0; j < ow; j += L) {
          const __mmask16 m = lanes(ow - j);
          _mm512_mask_storeu_ps(dst + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, src + j), vb));
        }
#else
#pragma omp simd
        for (int64_t j = 0; j < ow; ++j) dst[j] = src[j] + b;
#endif
      } else if constexpr (std::is_same_v<T, bfloat16>) {
        // Rounded inline: a call per row of a small image costs more than the rounding, and so
        // does a scalar loop over the tail of a short row.
#if defined(__AVX512BW__)
        const __m512 vb = _mm512_set1_ps(b);
        for (int64_t j = 0; j < ow; j += 16) {
          const __mmask16 m = lanes(ow - j);
          store_bf16(dst + j, _mm512_add_ps(_mm512_maskz_loadu_ps(m, src + j), vb), m);
        }
#else
        auto* bits = reinterpret_cast<uint16_t*>(dst);
#pragma omp simd
        for (int64_t j = 0; j < ow; ++j) bits[j] = galley::detail::float_to_bf16_bits(src[j] + b);
#endif
      } else {
#pragma omp simd
        for (int64_t j = 0; j < ow; ++j) src[j] += b;
        from_float(src, dst, ow);
      }
    }
  }
}

// Weights packed for the correlation: [cout block][cin][tap][OB], zero past cout.
// `at(co, ci, t)` gives the weight of output co, input ci, tap t.
template <typename At>
void pack_weights(const Plan& p, At at, std::vector<float>& out) {
  const int64_t taps = p.taps();
  out = pack_block_weights(p.cout, p.cin * taps,
                           [&](int64_t co, int64_t j) { return at(co, j / taps, j % taps); });
}

// flat[cout rounded up to OB][qs] = the correlation of the bordered input xb with packed weights;
// shift is p.shifts().
void correlate(const Plan& p, const std::vector<int64_t>& shift, const float* xb, const float* wpk,
               float* flat) {
  const int64_t taps = p.taps(), qs = p.qs(), nvec = qs / L;
  for (int64_t cb = 0; cb * OB < p.cout; ++cb) {
    const float* wb = wpk + cb * p.cin * taps * OB;
    correlate_vectors(xb, p.plane(), p.cin, shift.data(), taps, wb, flat + cb * OB * qs, qs, nvec);
  }
}

// A vector of outputs of a correlation written straight into its output planes: where its first
// output reads the bordered input (i * pw + j, the flat output's index) and lands in an output
// plane (i * ow + j), and how many of its L lanes are outputs (the rest, past the row's end, are
// computed and dropped).
struct RowVector {
  int64_t x, y, lanes;
};

#if defined(GALLEY_VECTOR_LANES)
// Each output row of p in vectors of L, the last one partial: every row's whole vectors first,
// then the partial ones, so that the blocks of whole vectors store without a branch a vector
// (correlate_rows_block).
std::vector<RowVector> row_vectors(const Plan& p) {
  std::vector<RowVector> v;
  const int64_t ow = p.ow(), whole = ow / L * L;
  for (int64_t i = 0; i < p.oh(); ++i)
    for (int64_t j = 0; j < whole; j += L) v.push_back({i * p.pw() + j, i * ow + j, L});
  if (whole < ow)
    for (int64_t i = 0; i < p.oh(); ++i)
      v.push_back({i * p.pw() + whole, i * ow + whole, ow - whole});
  return v;
}

// Whether writing p's outputs by rows (row_vectors) beats the flat output and its copy into the
// planes (write_out). A row's last vector computes lanes past its end: with few (input channel,
// tap) pairs (the stems) or rows that fill their vectors, the copy costs more; where the rows'
// vectors outnumber the flat ones, each extra costs a multiply-add per pair, against about two
// a vector for the copy (on AMD Zen 3, resnet's 16->32 3x3/2 lost 4% by rows, its 1->16 stem
// and vgg's 3->32 gained 5% and 13%).
bool rows_pay(const Plan& p) {
  const int64_t row_vecs = p.oh() * ((p.ow() + L - 1) / L), flat_vecs = p.qs() / L;
  return (row_vecs - flat_vecs) * p.cin * p.taps() <= 2 * flat_vecs;
}
#endif

// Whether outputs of T are stored by rows: float32, and bfloat16 where a partial vector rounds and
// stores under a mask (AVX-512; AVX2 would take a scalar loop).
template <typename T>
#if defined(GALLEY_VECTOR_LANES)
constexpr bool kRowsStore = std::is_same_v<T, float> || (L == 16 && std::is_same_v<T, bfloat16>);
#else
constexpr bool kRowsStore = false;
#endif

// row_vectors(p) for outputs of T that store by rows, where rows pay (and the build has the
// vector lanes), else none: the correlation then goes through the flat output.
template <typename T>
std::vector<RowVector> rows_for(const Plan& p) {
#if defined(GALLEY_VECTOR_LANES)
  if (kRowsStore<T> && rows_pay(p)) return row_vectors(p);
#endif
  (void)p;
  return {};
}

#if defined(GALLEY_VECTOR_LANES)
// correlate_block for the NV vectors vec[0..NV) of row_vectors: OB output channels, of which the
// first `oc` are real, stored (+ bias, rounded to T) into planes ldy apart. Inlined into
// correlate_rows: with a stem's 9 or 27 (channel, tap) pairs a call's prologue and epilogue cost
// as much as a tenth of the block (resnet's 1->16 stem 6% and vgg's 3->32 2.5% faster on AMD Zen 3;
// whole-vector stores without store_first's branches a further 2% and 5%, and whole vectors first
// in row_vectors 2% on the 1->16 stem).
template <int NV, typename T>
__attribute__((always_inline)) inline void correlate_rows_block(
    const float* x, int64_t plane, int64_t cin, const int64_t* shift, int64_t taps, const float* wb,
    const float* bias, const RowVector* vec, int64_t oc, T* y, int64_t ldy) {
  int64_t xo[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) xo[v] = vec[v].x;
  V acc[OB][NV];
  correlate_sums<NV>(x, plane, cin, shift, taps, wb, OB, xo, acc);
  // The bias is added last, as write_out adds it to the flat sums: the same bits either way.
  bool whole = oc == OB;  // every store a whole vector: no branch a store
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) whole = whole && vec[v].lanes == L;
  if (whole) {
#pragma GCC unroll 8
    for (int o = 0; o < OB; ++o) {
      const V b = bias ? splat(bias[o]) : V{};
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        if constexpr (std::is_same_v<T, float>)
          store(y + o * ldy + vec[v].y, acc[o][v] + b);
        else
          store_first(y + o * ldy + vec[v].y, acc[o][v] + b, L);
      }
    }
    return;
  }
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o) {
    if (o >= oc) break;
    const V b = bias ? splat(bias[o]) : V{};
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store_first(y + o * ldy + vec[v].y, acc[o][v] + b, vec[v].lanes);
  }
}

// The correlation of correlate(), its outputs (+ bias) written into the planes of out (cout of
// oh x ow) by rows: vecs is row_vectors(p), taken three at a time, the rest as in
// correlate_vectors.
template <typename T>
void correlate_rows(const Plan& p, const std::vector<int64_t>& shift, const float* xb,
                    const float* wpk, const float* bias, const std::vector<RowVector>& vecs,
                    T* out) {
  const int64_t taps = p.taps(), n = int64_t(vecs.size()), ldy = p.oh() * p.ow();
  const int64_t plane = p.plane(), cin = p.cin;
  for (int64_t cb = 0; cb * OB < p.cout; ++cb) {
    const float* wb = wpk + cb * p.cin * taps * OB;
    const float* b = bias ? bias + cb * OB : nullptr;
    const int64_t oc = std::min(OB, p.cout - cb * OB);
    T* y = out + cb * OB * ldy;
    int64_t v = 0;
    for (; v + 3 <= n && n - v != 4; v += 3)
      correlate_rows_block<3>(xb, plane, cin, shift.data(), taps, wb, b, &vecs[v], oc, y, ldy);
    for (; n - v >= 2; v += 2)
      correlate_rows_block<2>(xb, plane, cin, shift.data(), taps, wb, b, &vecs[v], oc, y, ldy);
    if (n - v == 1)
      correlate_rows_block<1>(xb, plane, cin, shift.data(), taps, wb, b, &vecs[v], oc, y, ldy);
  }
}
#endif

// The correlation of p (+ bias) into the planes of out: by rows where `rows` (rows_for<T>) has
// them, else into the flat scratch of thread_scratch slot `slot` and copied out.
template <typename T>
void correlate_out(const Plan& p, const std::vector<int64_t>& shift, const float* xb,
                   const float* wpk, const float* bias, const std::vector<RowVector>& rows,
                   int slot, T* out) {
#if defined(GALLEY_VECTOR_LANES)
  if constexpr (kRowsStore<T>) {
    if (!rows.empty()) return correlate_rows(p, shift, xb, wpk, bias, rows, out);
  }
#else
  (void)rows;  // none without the lanes
#endif
  float* flat = thread_scratch(slot, size_t(round_up(p.cout, OB) * p.qs()));
  correlate(p, shift, xb, wpk, flat);
  write_out(p, flat, bias, out, p.qs());
}

// Layout of the weight gradient's per-thread partial sums: [jp][op], column j = ci * taps + t,
// output channels padded to whole register blocks (ov vectors each), columns to whole blocks of
// nj.
struct WeightGradLayout {
  int64_t op, ov, nj, jp;
  explicit WeightGradLayout(const Plan& p) {
    const int64_t vecs = round_up(p.cout, L) / L;
    ov = std::min<int64_t>(vecs, kMaxWeightGradVectors);
    op = round_up(p.cout, ov * L);
    nj = kWeightGradAcc / ov;
    jp = round_up(p.cin * p.taps(), nj);
  }
};

// Where each column j of the weight gradient reads its input in the bordered buffer xb: channel
// j / taps shifted by tap j % taps. Padding columns read any valid input; their sums are unused.
template <typename E>
std::vector<const E*> column_inputs(const Plan& p, const WeightGradLayout& lay, const E* xb) {
  const int64_t taps = p.taps(), j_real = p.cin * taps;
  std::vector<const E*> xs(static_cast<size_t>(lay.jp));
  for (int64_t j = 0; j < lay.jp; ++j)
    xs[size_t(j)] = j < j_real ? xb + (j / taps) * p.plane() + p.shift(j % taps) : xb;
  return xs;
}

// Runs block(std::integral_constant<int, OV>, o0, j0) over the weight gradient's register blocks:
// OV vectors of output channels from o0, lay.nj columns from j0.
template <typename Block>
void for_weight_grad_blocks(const WeightGradLayout& lay, Block block) {
  for (int64_t o0 = 0; o0 < lay.op; o0 += lay.ov * L)
    for (int64_t j0 = 0; j0 < lay.jp; j0 += lay.nj) {
      switch (lay.ov) {
        case 1:
          block(std::integral_constant<int, 1>{}, o0, j0);
          break;
        case 2:
          block(std::integral_constant<int, 2>{}, o0, j0);
          break;
#if defined(__AVX512F__)
        case 3:
          block(std::integral_constant<int, 3>{}, o0, j0);
          break;
        default:
          block(std::integral_constant<int, 4>{}, o0, j0);
          break;
#endif
      }
    }
}

// part[j][o] += sum over q of gyT[q][o] * xs[j][q] (xs from column_inputs).
void weight_grad(const Plan& p, const WeightGradLayout& lay, const std::vector<const float*>& xs,
                 const float* gyT, float* part) {
  // 3-tap kernel rows at consecutive inputs: one pointer a row, where the blocks hold whole rows
  // (NJ a multiple of 3) and more columns than the registers hold pointers for.
  const bool rows_of_three = p.s == 1 && p.d == 1 && p.kw == 3;
  for_weight_grad_blocks(lay, [&](auto ov, int64_t o0, int64_t j0) {
    constexpr int OV = decltype(ov)::value;
    constexpr int NJ = kWeightGradAcc / OV;
    if constexpr (NJ % 3 == 0 && NJ > 8) {
      if (rows_of_three)
        return broadcast_block<OV, NJ / 3, 3, true>(gyT + o0, lay.op, p.q(), xs.data() + j0,
                                                    part + j0 * lay.op + o0, lay.op);
    }
    broadcast_block<OV, NJ, 1, true>(gyT + o0, lay.op, p.q(), xs.data() + j0,
                                     part + j0 * lay.op + o0, lay.op);
  });
}

// gyT[q][o] = gy[o][oh][ow] at q = oh * pw + ow (widened); the junk columns and padded channels
// stay zero. In L x L transposes where the build has the vector lanes.
template <typename T>
void transpose_grad(const Plan& p, int64_t op, const T* gy, float* gyT) {
#if defined(GALLEY_VECTOR_LANES)
  to_channels_last(gy, p.cout, p.oh(), p.ow(), op, gyT, p.pw() * op);
#else
  const int64_t oh = p.oh(), ow = p.ow(), pw = p.pw();
  for (int64_t o = 0; o < p.cout; ++o)
    for (int64_t i = 0; i < oh; ++i) {
      const T* src = gy + (o * oh + i) * ow;
      float* dst = gyT + i * pw * op + o;
      for (int64_t j = 0; j < ow; ++j) dst[j * op] = static_cast<float>(src[j]);
    }
#endif
}

// The weight gradient with the outputs across the lanes, for convolutions of few (input channel,
// tap) pairs (the stems: conv2d_direct_use). A block of OB output channels x kLaneColumns columns
// (consecutive (channel, tap) pairs: a kernel row's taps where the kernel is 3 wide) holds
// part[o][j] as vectors of partial sums; each output row's vectors
// (the last one partial, read masked) of the output gradient, in place, multiply the bordered
// input at the column's shift. No transpose of the output gradient into channels-last rows, which
// costs more than a few columns' products, and no columns padded to the broadcast block's 6 (a
// 3x3 kernel's 9 took 12 there with AVX2, 24 with AVX-512). The lanes are summed once, after the
// last image.
constexpr int64_t kLaneColumns = 3;

// The partial sums' layout: [op][cp][L], output channels padded to whole blocks of OB, columns to
// whole blocks of kLaneColumns.
struct LaneWeightGradLayout {
  int64_t op, cp;
  explicit LaneWeightGradLayout(const Plan& p)
      : op(round_up(p.cout, OB)), cp(round_up(p.cin * p.taps(), kLaneColumns)) {}
  int64_t floats() const { return op * cp * L; }
};

// Whether p's weight gradient runs with the outputs across the lanes: at most 27 columns (a 3x3
// kernel on three channels). On AMD Zen 3 (one thread, batch 64) resnet's 1->16 stem took 0.64x
// the time of the broadcast block and vgg's 3->32 0.76x; from 36 columns (4 channels) the
// broadcast block was 10-30% faster.
bool lanes_over_outputs(const Plan& p) {
#if defined(GALLEY_VECTOR_LANES)
  return p.cin * p.taps() <= 27;
#else
  (void)p;
  return false;
#endif
}

#if defined(GALLEY_VECTOR_LANES)
// part[o][c] += sum over the outputs (i, j) of gy[o][i * ow + j] * xs[c][i * pw + j], as vectors
// of L partial sums, for OB output channels (planes of oh x ow) and TC columns.
template <int TC>
void lane_weight_grad_block(const float* const* gy, const float* const* xs, int64_t oh, int64_t ow,
                            int64_t pw, float* part, int64_t ldp) {
  V acc[OB][TC];
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 3
    for (int c = 0; c < TC; ++c) acc[o][c] = load(part + o * ldp + c * L);
  const float* g[OB];
  const float* x[TC];
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o) g[o] = gy[o];
#pragma GCC unroll 3
  for (int c = 0; c < TC; ++c) x[c] = xs[c];
  const int64_t whole = ow / L * L, left = ow - whole;
  const Mask tail = first_lanes(left);
  auto step = [&](int64_t xo, int64_t go, bool partial) __attribute__((always_inline)) {
    V xv[TC];
#pragma GCC unroll 3
    for (int c = 0; c < TC; ++c) {
      xv[c] = load(x[c] + xo);
      in_register(xv[c]);
    }
#pragma GCC unroll 8
    for (int o = 0; o < OB; ++o) {
      V gv = partial ? load_lanes(g[o] + go, tail) : load(g[o] + go);
      held(gv);
#pragma GCC unroll 3
      for (int c = 0; c < TC; ++c) acc[o][c] += gv * xv[c];
    }
  };
  // The rows' whole vectors, then their partial ones (no test of the lanes in the first loop).
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < whole; j += L) step(i * pw + j, i * ow + j, false);
  if (left)
    for (int64_t i = 0; i < oh; ++i) step(i * pw + whole, i * ow + whole, true);
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 3
    for (int c = 0; c < TC; ++c) store(part + o * ldp + c * L, acc[o][c]);
}

#if defined(__AVX512BF16__)
// lane_weight_grad on pairs (the stems on the dot products): each 32-bit lane holds two
// consecutive outputs of a row, gy's straight from its planes and the input's from the bordered
// bfloat16 buffer at the column's shift, so vdpbf16ps adds both products of a pair to the lane;
// rows go 32 outputs a vector, a row's last one masked on both operands (a zero partner past the
// row's end, and nothing read there that a zero could turn into a NaN). The layout and the summing
// of the lanes are lane_weight_grad's.
template <int TC>
void lane_weight_grad_pairs_block(const uint16_t* const* gy, const uint16_t* const* xs, int64_t oh,
                                  int64_t ow, int64_t pw, float* part, int64_t ldp) {
  __m512 acc[OB][TC];
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 3
    for (int c = 0; c < TC; ++c) acc[o][c] = _mm512_loadu_ps(part + o * ldp + c * L);
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; j += 32) {
      const __mmask32 m = lanes32(ow - j);
      __m512i xv[TC];
#pragma GCC unroll 3
      for (int c = 0; c < TC; ++c) xv[c] = _mm512_maskz_loadu_epi16(m, xs[c] + i * pw + j);
#pragma GCC unroll 8
      for (int o = 0; o < OB; ++o) {
        const __m512i gv = _mm512_maskz_loadu_epi16(m, gy[o] + i * ow + j);
#pragma GCC unroll 3
        for (int c = 0; c < TC; ++c) acc[o][c] = dot(acc[o][c], gv, xv[c]);
      }
    }
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 3
    for (int c = 0; c < TC; ++c) _mm512_storeu_ps(part + o * ldp + c * L, acc[o][c]);
}
#endif  // __AVX512BF16__

// One image's share of the weight gradient into part (LaneWeightGradLayout): gy the image's output
// gradient (cout planes of oh x ow), `zero` a zero plane for the padded channels, xb the bordered
// input; float32, or (AVX512-BF16) bfloat16 bits on pairs of outputs.
template <typename E>
void lane_weight_grad(const Plan& p, const LaneWeightGradLayout& lay, const E* gy, const E* zero,
                      const E* xb, float* part) {
  const int64_t taps = p.taps(), cols = p.cin * taps, ohw = p.oh() * p.ow(), ldp = lay.cp * L;
  const E* xs[kLaneColumns];
  const E* g[OB];
  for (int64_t o0 = 0; o0 < lay.op; o0 += OB) {
    for (int64_t o = 0; o < OB; ++o) g[o] = o0 + o < p.cout ? gy + (o0 + o) * ohw : zero;
    for (int64_t j0 = 0; j0 < lay.cp; j0 += kLaneColumns) {
      // Padding columns read the first column's input; their sums are unused.
      for (int64_t c = 0; c < kLaneColumns; ++c) {
        const int64_t j = j0 + c < cols ? j0 + c : 0;
        xs[c] = xb + (j / taps) * p.plane() + p.shift(j % taps);
      }
      float* at = part + (o0 * lay.cp + j0) * L;
      if constexpr (std::is_same_v<E, float>) {
        lane_weight_grad_block<kLaneColumns>(g, xs, p.oh(), p.ow(), p.pw(), at, ldp);
      } else {
#if defined(__AVX512BF16__)
        lane_weight_grad_pairs_block<kLaneColumns>(g, xs, p.oh(), p.ow(), p.pw(), at, ldp);
#endif
      }
    }
  }
}
#endif

// gw[o][j] from the summed partial sums of lane_weight_grad, each the sum of its L lanes.
void write_lane_weight_grad(const Conv2dGeometry& g, const LaneWeightGradLayout& lay,
                            const float* sum, float* gw) {
  const int64_t cols = g.c * g.kh * g.kw;
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t j = 0; j < cols; ++j) {
      const float* lanes = sum + (o * lay.cp + j) * L;
      float s = 0.f;
      for (int64_t i = 0; i < L; ++i) s += lanes[i];
      gw[o * cols + j] = s;
    }
}

Plan forward_plan(const Conv2dGeometry& g) {
  return {g.c, g.h, g.w, g.pad, g.pad, g.o, g.kh, g.kw, g.dilation, g.stride};
}

// The input gradient's correlation: the output gradient, bordered by (k - 1) * d - pad,
// correlated with the kernel flipped in both axes and with input and output channels swapped
// (flipped_weight gives its taps).
Plan input_grad_plan(const Conv2dGeometry& g) {
  const int64_t d = g.dilation;
  return {g.o, g.oh, g.ow, (g.kh - 1) * d - g.pad, (g.kw - 1) * d - g.pad, g.c, g.kh, g.kw, d};
}
// Tap t of forward_plan's weight for its output co and input ci.
inline float forward_weight(const Conv2dGeometry& g, const float* w, int64_t co, int64_t ci,
                            int64_t t) {
  return w[(co * g.c + ci) * g.kh * g.kw + t];
}
// Tap t of input_grad_plan's weight for its output ci (an input channel) and input o.
inline float flipped_weight(const Conv2dGeometry& g, const float* w, int64_t ci, int64_t o,
                            int64_t t) {
  const int64_t taps = g.kh * g.kw;
  return w[(o * g.c + ci) * taps + (taps - 1 - t)];
}

// The input gradient of a strided convolution (stride s, dilation 1), by its phases. Input row iy
// with iy + pad = s m + r (row phase r) takes the forward taps a = r + s u, u < U_r =
// ceil((kh - r) / s), each from output gradient row m - u; columns alike. So phase (r, c) of the
// input gradient is a stride-1 correlation of the output gradient with U_r x V_c of the taps
// (flipped, channels swapped), and the s * s phases together take the kernel's kh * kw taps: no
// zero ones (padding every phase to the whole kernel's reach did 1.8x the work of 3x3/2 and lost to
// im2col). The phases read one bordered copy of the output gradient, its border the widest any
// phase needs; each computes its flat outputs from its first valid one to its last, and its rows
// are spread into the input gradient's at stride s.
struct GradPhase {
  Plan plan;  // over the shared bordered output gradient
  int64_t r, c;
  // Its input gradient rows s m + r - pad for m in [m0, m0 + rows); columns alike.
  int64_t m0, rows, n0, cols;
  int64_t q0, nvec;  // the flat outputs computed: [q0, q0 + nvec L)
  int64_t at;        // where they start in the scratch: [cout rounded up to OB][nvec L]
  std::vector<float> wpk;
  std::vector<int64_t> shift;
};

struct PhasedInputGrad {
  std::vector<GradPhase> phases;
  int64_t flat_floats = 0;  // every phase's flat outputs
  int64_t bordered = 0;     // the bordered output gradient, with room for the last vector's reach
  bool gaps = false;        // input positions no tap reaches (a stride above the kernel): zero
};

// The first index m >= 0 of phase r with s m + r - pad >= 0, and the count of those below `size`.
inline void phase_range(int64_t size, int64_t pad, int64_t s, int64_t r, int64_t& first,
                        int64_t& count) {
  first = pad > r ? (pad - r + s - 1) / s : 0;
  const int64_t last = size - 1 + pad - r;  // s m <= last
  count = last < 0 ? 0 : std::max<int64_t>(0, last / s - first + 1);
}

PhasedInputGrad phased_input_grad(const Conv2dGeometry& g, const float* w) {
  const int64_t s = g.stride;
  auto taps_of = [&](int64_t k, int64_t r) { return r < k ? (k - r + s - 1) / s : 0; };
  PhasedInputGrad out;
  // The border along an axis (input size n, kernel k, output size on): a phase's first output
  // reads U - 1 - m0 positions before the output gradient, its last m0 + count - on past it.
  auto border = [&](int64_t n, int64_t k, int64_t on) {
    int64_t b = 0;
    for (int64_t r = 0; r < s; ++r) {
      int64_t m0, count;
      phase_range(n, g.pad, s, r, m0, count);
      if (count == 0) continue;
      if (taps_of(k, r) == 0)
        out.gaps = true;
      else
        b = std::max({b, taps_of(k, r) - 1 - m0, m0 + count - on});
    }
    return b;
  };
  const int64_t bh = border(g.h, g.kh, g.oh), bw = border(g.w, g.kw, g.ow);
  for (int64_t r = 0; r < s; ++r)
    for (int64_t c = 0; c < s; ++c) {
      GradPhase ph;
      ph.r = r, ph.c = c;
      phase_range(g.h, g.pad, s, r, ph.m0, ph.rows);
      phase_range(g.w, g.pad, s, c, ph.n0, ph.cols);
      const int64_t U = taps_of(g.kh, r), V = taps_of(g.kw, c);
      if (ph.rows == 0 || ph.cols == 0 || U == 0 || V == 0) continue;
      ph.plan = {g.o, g.oh, g.ow, bh, bw, g.c, U, V, 1, 1};
      const int64_t pw = ph.plan.pw();
      // Output (i, j) of the phase's correlation reads output gradient rows i - bh .. i - bh +
      // U - 1, the last of them m: m = i - bh + U - 1.
      const int64_t i0 = ph.m0 + bh - U + 1, j0 = ph.n0 + bw - V + 1;
      ph.q0 = i0 * pw + j0;
      ph.nvec = ((ph.rows - 1) * pw + ph.cols + L - 1) / L;
      ph.at = out.flat_floats;
      out.flat_floats += round_up(g.c, OB) * ph.nvec * L;
      pack_weights(
          ph.plan,
          [&](int64_t ci, int64_t o, int64_t t) {
            const int64_t a = r + s * (U - 1 - t / V), b = c + s * (V - 1 - t % V);
            return w[((o * g.c + ci) * g.kh + a) * g.kw + b];
          },
          ph.wpk);
      ph.shift = ph.plan.shifts();
      out.bordered = std::max(out.bordered, g.o * ph.plan.plane() + 2 * L + g.kw);
      out.phases.push_back(std::move(ph));
    }
  return out;
}

// The input gradient of one image: gyb the output gradient in the phases' bordered buffer, flat
// the scratch, row (for a 16-bit T) one row of floats.
template <typename T>
void phased_input_grad_image(const Conv2dGeometry& g, const PhasedInputGrad& pig, const float* gyb,
                             float* flat, float* row, T* gx) {
  for (const GradPhase& ph : pig.phases) {
    const int64_t taps = ph.plan.taps(), ld = ph.nvec * L;
    for (int64_t cb = 0; cb * OB < g.c; ++cb)
      correlate_vectors(gyb + ph.q0, ph.plan.plane(), g.o, ph.shift.data(), taps,
                        ph.wpk.data() + cb * g.o * taps * OB, flat + ph.at + cb * OB * ld, ld,
                        ph.nvec);
  }
  // Where row m of channel 0 starts in each phase, by row phase and first column (src[rp][b] +
  // m * pitch[rp][b]), so that the rows below go without a division.
  const int64_t s = g.stride;
  const float* src0[kMaxStride][kMaxStride] = {};
  int64_t pitch[kMaxStride][kMaxStride] = {}, ld[kMaxStride][kMaxStride] = {};
  for (const GradPhase& ph : pig.phases) {
    const int64_t b = s * ph.n0 + ph.c - g.pad, pw = ph.plan.pw();
    src0[ph.r][b] = flat + ph.at - ph.m0 * pw;
    pitch[ph.r][b] = pw;
    ld[ph.r][b] = ph.nvec * L;
  }
  for (int64_t ci = 0; ci < g.c; ++ci) {
    int64_t rp = g.pad % s, m = g.pad / s;  // input row iy is row m of row phase rp
    for (int64_t iy = 0; iy < g.h; ++iy) {
      T* dst = gx + (ci * g.h + iy) * g.w;
      float* r = std::is_same_v<T, float> ? reinterpret_cast<float*>(dst) : row;
      const float* src[kMaxStride] = {};
      for (int64_t b = 0; b < s; ++b)
        if (src0[rp][b]) src[b] = src0[rp][b] + ci * ld[rp][b] + m * pitch[rp][b];
      if (s == 2 && src[0] && src[1]) {
        interleave_row(src[0], src[1], r, g.w);
      } else {
        if (pig.gaps) std::fill_n(r, g.w, 0.f);
        for (int64_t b = 0; b < s; ++b)
          if (src[b]) scatter_strided<false>(src[b], r + b, (g.w - b + s - 1) / s, s);
      }
      if constexpr (!std::is_same_v<T, float>) from_float(r, dst, g.w);
      if (++rp == s) rp = 0, ++m;
    }
  }
}

#if defined(__AVX512BF16__)
// bfloat16 on AVX512-BF16. vdpbf16ps multiplies 16 pairs of bfloat16 values and adds both products
// of each pair to one float32 lane (exact products, float32 sums), so one instruction does the
// work of two FMAs on half the bytes. The pairs run along each sum: in the correlations, two input
// channels at one position (the bordered input holds channel pairs interleaved, 32 bits a
// position, and each weight broadcast is the pair of the two channels' taps); in the weight
// gradient, two consecutive flat outputs (the transposed output gradient holds them interleaved
// per output channel, and the input's two consecutive positions are adjacent already). An odd
// channel count, or flat output count, is padded with a zero partner. Same register blocks as the
// float32 kernels (the correlations' is conv2d_block.h's correlate_pairs_block). The pairs are
// kernels/cpu/bf16_avx512.h's Pair words.
inline uint16_t bf16_bits(float f) {
  return galley::detail::float_to_bf16_bits(f);
}

int64_t channel_pairs(const Plan& p) {
  return (p.cin + 1) / 2;
}
// The bordered buffer of channel pairs, with the slack.
int64_t bordered_pairs(const Plan& p) {
  return channel_pairs(p) * p.plane() + p.slack();
}

// Channels 2k and 2k + 1 of `src` interleaved into pair plane k's interior (a zero partner for
// an odd last channel); the border and the slack, zeroed once per call, stay zero.
void fill_pairs(const Plan& p, const uint16_t* src, Pair* dst) {
  const int64_t hw = p.h * p.w;
  for (int64_t k = 0; k < channel_pairs(p); ++k) {
    const uint16_t* lo = src + 2 * k * hw;
    const uint16_t* hi = 2 * k + 1 < p.cin ? lo + hw : nullptr;
    for (int64_t i = 0; i < p.h; ++i) {
      Pair* d = dst + k * p.plane() + (i + p.pad_h) * p.wp() + p.pad_w;
      const uint16_t* a = lo + i * p.w;
      const uint16_t* b = hi ? hi + i * p.w : nullptr;
      // 16 pairs a vector, the tail masked: rows are short (28 positions in resnet).
      for (int64_t j = 0; j < p.w; j += 16) {
        const __mmask16 m = lanes(p.w - j);
        _mm512_mask_storeu_epi32(d + j, m, pairs_of(a + j, b ? b + j : nullptr, m));
      }
    }
  }
}

// pack_weights for pairs: [cout block][channel pair][tap][OB], zero past cout and past cin.
template <typename At>
void pack_weight_pairs(const Plan& p, At at, std::vector<Pair>& out) {
  const int64_t blocks = round_up(p.cout, OB) / OB, taps = p.taps(), kp = channel_pairs(p);
  out.assign(size_t(blocks * kp * taps * OB), 0u);
  for (int64_t cb = 0; cb < blocks; ++cb)
    for (int64_t k = 0; k < kp; ++k)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t o = 0; o < OB && cb * OB + o < p.cout; ++o) {
          const int64_t co = cb * OB + o;
          out[size_t(((cb * kp + k) * taps + t) * OB + o)] =
              pair_of(at(co, 2 * k, t), 2 * k + 1 < p.cin ? at(co, 2 * k + 1, t) : 0.f);
        }
}

// correlate() on channel pairs.
void correlate_pairs(const Plan& p, const std::vector<int64_t>& shift, const Pair* xb,
                     const Pair* wpk, float* flat) {
  const int64_t taps = p.taps(), qs = p.qs(), nvec = qs / L, kp = channel_pairs(p);
  for (int64_t cb = 0; cb * OB < p.cout; ++cb)
    correlate_pairs_vectors(xb, p.plane(), kp, shift.data(), taps, wpk + cb * kp * taps * OB,
                            flat + cb * OB * qs, qs, nvec);
}

// weight_grad() on pairs: part[j][o] += sum over q of gy[o][q] * xs[j][q].
void weight_grad_pairs(const Plan& p, const WeightGradLayout& lay,
                       const std::vector<const uint16_t*>& xs, const Pair* gyT, float* part) {
  const int64_t qp = (p.q() + 1) / 2;
  const bool rows_of_three = p.s == 1 && p.d == 1 && p.kw == 3;  // as weight_grad's
  for_weight_grad_blocks(lay, [&](auto ov, int64_t o0, int64_t j0) {
    constexpr int OV = decltype(ov)::value;
    constexpr int NJ = kWeightGradAcc / OV;
    if constexpr (NJ % 3 == 0 && NJ > 8) {
      if (rows_of_three)
        return broadcast_pairs_block<OV, NJ / 3, 3, true>(gyT + o0, lay.op, qp, xs.data() + j0,
                                                          part + j0 * lay.op + o0, lay.op);
    }
    broadcast_pairs_block<OV, NJ, 1, true>(gyT + o0, lay.op, qp, xs.data() + j0,
                                           part + j0 * lay.op + o0, lay.op);
  });
}

// Rows of the pair transpose's scratch (transpose_grad_pairs): one per channel of a block.
constexpr int64_t kPairRows = 16;

// gyT[q / 2][o] = the pair (gy[o] at q even, at q + 1), q = oh * pw + ow, as bfloat16 bits; the
// junk columns, the partner past the last q and the padded channels stay zero (op is a multiple
// of 16). Per block of 16 channels, each channel's rows are laid out flat in its row of `rows`
// (kPairRows rows of row_len elements, zero where nothing is written: the junk columns and past
// q), whose pairs are then 32-bit elements transposed 16 x 16 in registers.
void transpose_grad_pairs(const Plan& p, int64_t op, const uint16_t* gy, uint16_t* gyT,
                          uint16_t* rows, int64_t row_len) {
  const int64_t oh = p.oh(), ow = p.ow(), pw = p.pw(), qp = (p.q() + 1) / 2;
  Pair* dst = reinterpret_cast<Pair*>(gyT);
  for (int64_t o0 = 0; o0 < p.cout; o0 += kPairRows) {
    const int64_t no = std::min(kPairRows, p.cout - o0);
    for (int64_t c = 0; c < no; ++c)
      for (int64_t i = 0; i < oh; ++i)
        copy_row(gy + ((o0 + c) * oh + i) * ow, rows + c * row_len + i * pw, ow);
    for (int64_t k0 = 0; k0 < qp; k0 += 16) {
      const int64_t nk = std::min<int64_t>(16, qp - k0);
      const __mmask16 m = lanes(nk);
      __m512 r[16];  // pairs as 32-bit lanes: the shuffles move their bits unchanged
      for (int64_t c = 0; c < 16; ++c)
        r[c] = c < no ? _mm512_maskz_loadu_ps(m, rows + c * row_len + 2 * k0) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t k = 0; k < nk; ++k) _mm512_storeu_ps(dst + (k0 + k) * op + o0, r[k]);
    }
  }
}
#endif  // __AVX512BF16__

#if defined(GALLEY_AMX)
// bfloat16 on AMX: tdpbf16ps multiplies a 16 x 32 tile of bfloat16 by a 32 x 16 one (in pairs, as
// vdpbf16ps) into a 16 x 16 float32 tile, 8192 multiply-adds an instruction. Every tile here is 16
// rows of 64 bytes: four accumulators (two blocks of 16 by two), two of each operand.
//
// The correlations: C[output channel][flat output q] += A[output channel][32 input channels at one
// tap] x B[16 channel pairs][16 q]. B's rows are the bordered pair buffer's planes (fill_pairs) at
// the tap's shift, one plane apart; A the weights, packed per (block of 16 outputs, tap, block of
// 32 inputs). Input channels are padded to 32 with zero planes, outputs to 16, q to 32.
//
// The weight gradient: C[input channel][output channel] += A[input channel][32 consecutive q] x
// B[16 pairs of q][16 output channels]: A straight from the bordered bfloat16 input at the tap's
// shift (rows one plane apart), B the output gradient transposed into pairs of q
// (transpose_grad_pairs), summed over q and the images into a float32 [tap][input][output] part.
struct TilePlan {
  int64_t kp;  // channel pairs, padded to 16
  int64_t cb;  // blocks of 32 input channels
  int64_t op;  // output channels padded to 16
  int64_t qq;  // flat outputs padded to 32
  explicit TilePlan(const Plan& p)
      : kp(round_up(p.cin, 32) / 2),
        cb(kp / kTile),
        op(round_up(p.cout, kTile)),
        qq(round_up(p.q(), 32)) {}
  // The bordered pair buffer, with the reach of the last block past the last plane.
  int64_t bordered(const Plan& p) const {
    return kp * p.plane() + (qq - p.q()) + (p.kw - 1) * p.d + 2 * kTile;
  }
};

// Weights as A tiles: [block of 16 outputs][tap][block of 32 inputs][16][32] bfloat16, the inputs
// of each row in pairs as the B rows hold them; zero past cout and cin.
template <typename At>
void pack_weight_tiles(const Plan& p, const TilePlan& tp, At at, std::vector<uint16_t>& out) {
  const int64_t taps = p.taps();
  out.assign(size_t(tp.op * taps * tp.cb * 32), 0);
  for (int64_t co = 0; co < p.cout; ++co)
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t ci = 0; ci < p.cin; ++ci) {
        const int64_t tile = ((co / kTile) * taps + t) * tp.cb + ci / 32;
        out[size_t(tile * kTile * 32 + (co % kTile) * 32 + ci % 32)] = bf16_bits(at(co, ci, t));
      }
}

// MO blocks of 16 outputs (1 or 2) x 32 flat outputs from q0, summed over taps and input blocks.
// Tiles 0-3 accumulate, 4-5 hold weights, 6-7 inputs.
template <int MO>
void correlate_tiles_block(const Plan& p, const TilePlan& tp, const std::vector<int64_t>& shift,
                           const Pair* xb, const uint16_t* a, int64_t a_block, float* y) {
  const int64_t taps = p.taps(), plane_bytes = p.plane() * int64_t(sizeof(Pair));
  _tile_zero(0);
  _tile_zero(1);
  if (MO == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t t = 0; t < taps; ++t)
    for (int64_t c = 0; c < tp.cb; ++c, a += kTile * 32) {
      const Pair* b = xb + c * kTile * p.plane() + shift[size_t(t)];
      _tile_loadd(4, a, 64);
      _tile_loadd(6, b, plane_bytes);
      _tile_loadd(7, b + kTile, plane_bytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (MO == 2) {
        _tile_loadd(5, a + a_block, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
  const int64_t ld = tp.qq * int64_t(sizeof(float));
  _tile_stored(0, y, ld);
  _tile_stored(1, y + kTile, ld);
  if (MO == 2) {
    _tile_stored(2, y + kTile * tp.qq, ld);
    _tile_stored(3, y + kTile * tp.qq + kTile, ld);
  }
}

// flat[tp.op][tp.qq] = the correlation of the pair buffer xb with the packed weight tiles.
void correlate_tiles(const Plan& p, const TilePlan& tp, const std::vector<int64_t>& shift,
                     const Pair* xb, const uint16_t* wpk, float* flat) {
  const int64_t a_block = p.taps() * tp.cb * kTile * 32;  // one block of 16 outputs' tiles
  for (int64_t o0 = 0; o0 < tp.op; o0 += 32) {
    const uint16_t* a = wpk + (o0 / kTile) * a_block;
    for (int64_t q0 = 0; q0 < tp.qq; q0 += 32) {
      float* y = flat + o0 * tp.qq + q0;
      if (tp.op - o0 >= 32)
        correlate_tiles_block<2>(p, tp, shift, xb + q0, a, a_block, y);
      else
        correlate_tiles_block<1>(p, tp, shift, xb + q0, a, a_block, y);
    }
  }
}

// MC blocks of 16 input channels x NO blocks of 16 outputs (each 1 or 2) of one tap's weight
// gradient, summed over q onto c. Tiles 0-3 accumulate, 4-5 hold inputs, 6-7 gradients.
template <int MC, int NO>
void weight_grad_tiles_block(const Plan& p, const TilePlan& tp, const uint16_t* a, const Pair* b,
                             float* c, int64_t c_ld_floats) {
  const int64_t a_ld = p.plane() * int64_t(sizeof(uint16_t)), b_ld = tp.op * int64_t(sizeof(Pair));
  const int64_t c_ld = c_ld_floats * int64_t(sizeof(float));
  _tile_loadd(0, c, c_ld);
  if (NO == 2) _tile_loadd(1, c + kTile, c_ld);
  if (MC == 2) _tile_loadd(2, c + kTile * c_ld_floats, c_ld);
  if (MC == 2 && NO == 2) _tile_loadd(3, c + kTile * c_ld_floats + kTile, c_ld);
  for (int64_t q0 = 0; q0 < tp.qq; q0 += 32, a += 32, b += 16 * tp.op) {
    _tile_loadd(4, a, a_ld);
    _tile_loadd(6, b, b_ld);
    _tile_dpbf16ps(0, 4, 6);
    if (NO == 2) {
      _tile_loadd(7, b + kTile, b_ld);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (MC == 2) {
      _tile_loadd(5, a + kTile * p.plane(), a_ld);
      _tile_dpbf16ps(2, 5, 6);
      if (NO == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_ld);
  if (NO == 2) _tile_stored(1, c + kTile, c_ld);
  if (MC == 2) _tile_stored(2, c + kTile * c_ld_floats, c_ld);
  if (MC == 2 && NO == 2) _tile_stored(3, c + kTile * c_ld_floats + kTile, c_ld);
}

// part[t][input channel][output channel] += the weight gradient of one image: xb the bordered
// bfloat16 input (channels padded to 32 with zero planes), gyT the output gradient's q pairs
// ([tp.qq / 2][tp.op]). Inputs and outputs in blocks of 16, so 16 channels waste nothing.
void weight_grad_tiles(const Plan& p, const TilePlan& tp, const std::vector<int64_t>& shift,
                       const uint16_t* xb, const Pair* gyT, float* part) {
  const int64_t taps = p.taps(), cpad = tp.kp * 2, cin16 = round_up(p.cin, kTile);
  for (int64_t t = 0; t < taps; ++t)
    for (int64_t c0 = 0; c0 < cin16; c0 += 32)
      for (int64_t o0 = 0; o0 < tp.op; o0 += 32) {
        float* c = part + (t * cpad + c0) * tp.op + o0;
        const uint16_t* a = xb + c0 * p.plane() + shift[size_t(t)];
        const Pair* b = gyT + o0;
        const bool two_c = cin16 - c0 >= 32, two_o = tp.op - o0 >= 32;
        if (two_c && two_o)
          weight_grad_tiles_block<2, 2>(p, tp, a, b, c, tp.op);
        else if (two_c)
          weight_grad_tiles_block<2, 1>(p, tp, a, b, c, tp.op);
        else if (two_o)
          weight_grad_tiles_block<1, 2>(p, tp, a, b, c, tp.op);
        else
          weight_grad_tiles_block<1, 1>(p, tp, a, b, c, tp.op);
      }
}
#endif  // GALLEY_AMX

}  // namespace

int conv2d_vector_lanes() {
#if defined(GALLEY_VECTOR_LANES)
  return int(L);
#else
  return 0;
#endif
}

bool intel_avx512_cores() {
#if defined(__AVX512F__)
  static const bool intel = [] {
    __builtin_cpu_init();  // (safe to repeat; needed should a global constructor get here first)
    return conv2d_vector_lanes() == 16 && __builtin_cpu_is("intel");
  }();
  return intel;
#else
  return false;
#endif
}

ConvDirectUse conv2d_direct_use(const Conv2dGeometry& g, DType dtype) {
  ConvDirectUse use;
#if defined(GALLEY_VECTOR_LANES)
  // Strided ones (resnet's 3x3/2) on AMD Zen 3 (AVX2): 1.4-1.9x im2col.
  const bool strided = g.dilation == 1 && g.stride <= kMaxStride;
  const bool fits = (g.stride == 1 || strided) && g.groups == 1 && g.kh * g.kw > 1 &&
                    g.pad <= (g.kh - 1) * g.dilation && g.pad <= (g.kw - 1) * g.dilation &&
                    g.n >= num_threads();
  if (!fits) return use;
  if (on_bf16_kernels(dtype, bf16_kernels()) && g.c >= 16) {
    // From 16 input channels (half of a tile's 32) the tiles, and the dot products, outrun the
    // float32 kernels in every part; with fewer, padding (to whole tiles, or to the pairs' and
    // the register blocks' 16 channels) and the passes around the kernels cost more than they
    // save. Strided ones stay on the channels path (cpu/conv2d_channels.h) or the tiles' phases
    // (cpu/conv2d.cpp), but for the weight gradient on the dot products: over the forward plan's
    // phases (AMD Zen 4, two threads, batch 64: resnet's 16->32 and 32->64 3x3/2 layers ran
    // it 1.3-1.4x the channels path's widened weight gradient, their backward passes 1.17x).
    if (g.stride != 1) {
      use.weight_grad = on_dot_products(dtype);
      use.bf16 = use.bf16_backward = bf16_kernels();
      return use;
    }
    use.forward = use.input_grad = use.weight_grad = true;
    use.bf16 = use.bf16_backward = bf16_kernels();
    return use;
  }
  const int64_t columns = g.c * g.kh * g.kw;  // (input channel, tap) pairs
  // From one channel's 3x3 taps (resnet's 1->16 stem, vgg's 3->32): on an Intel Xeon, at one
  // and two threads, 1.2-1.5x im2col in float32, and in bfloat16 (widened) 2-3.4x im2col on the
  // tile GEMM; on AMD Zen 3 (AVX2) 1.3-1.6x, the weight gradient of three channels 1.4x and
  // their forward pass level (since then both stems' weight gradients run with the outputs
  // across the lanes, 1.3-1.6x faster again, and their forward passes store by rows). Against
  // im2col on the dot-product GEMM (AMD Zen 4, two threads, batch 64), the bfloat16 stems' forward
  // passes (widened) ran 1.49x (1->16) and 1.20x (3->32), but their weight gradients 0.90x and
  // 0.66x: there the weight gradient keeps im2col below 64 pairs, but for the stems' (at most 27
  // pairs, outputs across the lanes), which run on the dot products' pairs of outputs: 2.07x
  // (1->16) and 1.53x (3->32) the GEMM's.
  use.forward = columns >= 9;
  use.input_grad = g.c >= 16;
  if (on_dot_products(dtype) && lanes_over_outputs(forward_plan(g))) {
    use.weight_grad = true;
    use.bf16_backward = Bf16Kernels::DotProducts;
  } else {
    use.weight_grad = columns >= (on_dot_products(dtype) ? 64 : 9);
  }
#else
  (void)g, (void)dtype;
#endif
  return use;
}

ConvDirectWays conv2d_direct_ways(const Conv2dGeometry& g) {
  ConvDirectWays w;
  w.forward_rows = !rows_for<float>(forward_plan(g)).empty();
  w.input_grad_rows = g.stride == 1 && !rows_for<float>(input_grad_plan(g)).empty();
  w.weight_grad_lanes = lanes_over_outputs(forward_plan(g));
  return w;
}

namespace {

template <typename T>
void direct_forward(const Conv2dGeometry& g, const T* x, const float* w, const float* b, T* y) {
  const Plan p = forward_plan(g);
  std::vector<float> wpk;
  pack_weights(
      p, [&](int64_t co, int64_t ci, int64_t t) { return forward_weight(g, w, co, ci, t); }, wpk);
  const std::vector<int64_t> shift = p.shifts();
  const std::vector<RowVector> rows = rows_for<T>(p);
  parallel_chunks(g.n, 1, [&](int64_t n0, int64_t n1, bool first) {
    float* xb = thread_scratch(0, size_t(p.bordered_floats()));
    if (first) std::fill_n(xb, p.bordered_floats(), 0.f);
    for (int64_t n = n0; n < n1; ++n) {
      fill_interior(p, x + n * g.c * g.h * g.w, xb);
      correlate_out(p, shift, xb, wpk.data(), b, rows, 1, y + n * g.o * g.oh * g.ow);
    }
  });
}

// gw[o][j] from the summed partial weight gradients, laid out [jp][op].
void write_weight_grad(const Conv2dGeometry& g, const WeightGradLayout& lay, const float* sum,
                       float* gw) {
  const int64_t j_real = g.c * g.kh * g.kw;
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t j = 0; j < j_real; ++j) gw[o * j_real + j] = sum[j * lay.op + o];
}

template <typename T>
void direct_backward(const Conv2dGeometry& g, const T* x, const float* w, const T* gy, T* gx,
                     float* gw, float* gb) {
  const Plan fwd = forward_plan(g);
  const Plan bwd = input_grad_plan(g);
  // The input gradient: by phases at a stride, else one correlation with the flipped kernel.
  const bool phased = gx && g.stride > 1;
  std::vector<float> wpk;
  std::vector<int64_t> bwd_shift;
  std::vector<RowVector> bwd_rows;
  if (gx && !phased) {
    pack_weights(
        bwd, [&](int64_t ci, int64_t o, int64_t t) { return flipped_weight(g, w, ci, o, t); }, wpk);
    bwd_shift = bwd.shifts();
    bwd_rows = rows_for<T>(bwd);
  }
  const PhasedInputGrad pig = phased ? phased_input_grad(g, w) : PhasedInputGrad{};
  const WeightGradLayout lay(fwd);
  // The weight gradient with the outputs across the lanes (few columns), else broadcast.
  const bool lanes = gw && lanes_over_outputs(fwd);
  const LaneWeightGradLayout lane_lay(fwd);
  const int64_t ohw = g.oh * g.ow;
  const int64_t chunk = balanced_chunk(g.n, 1);
  const ChunkSums sums(gw ? g.n : 0, chunk, lanes ? lane_lay.floats() : lay.jp * lay.op);
  // The bias gradient's sums of each image's planes, [n][o], added in image order after the
  // images: bias_grad's order (cpu/conv2d.cpp), so its bits at any thread count.
  std::vector<float> plane_sums(gb ? size_t(g.n * g.o) : 0);
  parallel_chunks(g.n, chunk, [&](int64_t n0, int64_t n1, bool first) {
    float* xb = nullptr;
    float* gyT = nullptr;
    float* gy_wide = nullptr;  // lanes: the widened output gradient (16-bit T), then a zero plane
    float* zero = nullptr;
    float* part = nullptr;
    std::vector<const float*> xs;
    if (gw) {
      xb = thread_scratch(0, size_t(fwd.bordered_floats()));
      if (first) std::fill_n(xb, fwd.bordered_floats(), 0.f);
      const int64_t wide = std::is_same_v<T, float> || (!lanes && !gb) ? 0 : g.o * ohw;
      if (lanes) {
        gy_wide = thread_scratch(1, size_t(wide + ohw));
        zero = gy_wide + wide;
        if (first) std::fill_n(zero, ohw, 0.f);
      } else {
        gyT = thread_scratch(1, size_t(fwd.q() * lay.op));
        if (first) std::fill_n(gyT, fwd.q() * lay.op, 0.f);
        xs = column_inputs(fwd, lay, xb);
        if (wide) gy_wide = thread_scratch(5, size_t(wide));
      }
      part = sums.start(n0);
    }
    float* gyb = nullptr;
    float* flat = nullptr;
    float* row = nullptr;
    if (phased) {
      gyb = thread_scratch(2, size_t(pig.bordered));
      flat = thread_scratch(3, size_t(pig.flat_floats));
      row = thread_scratch(4, size_t(g.w));
      if (first) std::fill_n(gyb, pig.bordered, 0.f);
    } else if (gx) {
      gyb = thread_scratch(2, size_t(bwd.bordered_floats()));
      if (first) std::fill_n(gyb, bwd.bordered_floats(), 0.f);
    }
    for (int64_t n = n0; n < n1; ++n) {
      const T* gyn = gy + n * g.o * g.oh * g.ow;
      if (gw) {
        fill_interior(fwd, x + n * g.c * g.h * g.w, xb);
        const float* gyf = lanes || gb ? as_float(gyn, g.o * ohw, gy_wide) : nullptr;
        if (lanes) {
#if defined(GALLEY_VECTOR_LANES)
          lane_weight_grad(fwd, lane_lay, gyf, zero, xb, part);
#endif
        } else {
          transpose_grad(fwd, lay.op, gyn, gyT);
          weight_grad(fwd, lay, xs, gyT, part);
        }
        if (gb)
          for (int64_t o = 0; o < g.o; ++o)
            plane_sums[size_t(n * g.o + o)] = sum_floats(gyf + o * ohw, ohw);
      }
      if (phased) {
        fill_interior(pig.phases.front().plan, gyn, gyb);
        phased_input_grad_image(g, pig, gyb, flat, row, gx + n * g.c * g.h * g.w);
      } else if (gx) {
        fill_interior(bwd, gyn, gyb);
        correlate_out(bwd, bwd_shift, gyb, wpk.data(), nullptr, bwd_rows, 3,
                      gx + n * g.c * g.h * g.w);
      }
    }
  });
  if (!gw) return;
  const float* total = sums.total();
  if (lanes)
    write_lane_weight_grad(g, lane_lay, total, gw);
  else
    write_weight_grad(g, lay, total, gw);
  if (!gb) return;
  for (int64_t o = 0; o < g.o; ++o) {
    float sum = 0.f;
    for (int64_t n = 0; n < g.n; ++n) sum += plane_sums[size_t(n * g.o + o)];
    gb[o] = sum;
  }
}

#if defined(__AVX512BF16__)
void pairs_forward(const Conv2dGeometry& g, const uint16_t* x, const float* w, const float* b,
                   bfloat16* y) {
  const Plan p = forward_plan(g);
  std::vector<Pair> wpk;
  pack_weight_pairs(
      p, [&](int64_t co, int64_t ci, int64_t t) { return forward_weight(g, w, co, ci, t); }, wpk);
  const std::vector<int64_t> shift = p.shifts();
  parallel_chunks(g.n, 1, [&](int64_t n0, int64_t n1, bool first) {
    Pair* xb = reinterpret_cast<Pair*>(thread_scratch(0, size_t(bordered_pairs(p))));
    float* flat = thread_scratch(1, size_t(round_up(p.cout, OB) * p.qs()));
    if (first) std::fill_n(xb, bordered_pairs(p), 0u);
    for (int64_t n = n0; n < n1; ++n) {
      fill_pairs(p, x + n * g.c * g.h * g.w, xb);
      correlate_pairs(p, shift, xb, wpk.data(), flat);
      write_out(p, flat, b, y + n * g.o * g.oh * g.ow, p.qs());
    }
  });
}

void pairs_backward(const Conv2dGeometry& g, const uint16_t* x, const float* w, const uint16_t* gy,
                    bfloat16* gx, float* gw) {
  const Plan fwd = forward_plan(g);
  const Plan bwd = input_grad_plan(g);
  std::vector<Pair> wpk;
  if (gx)
    pack_weight_pairs(
        bwd, [&](int64_t ci, int64_t o, int64_t t) { return flipped_weight(g, w, ci, o, t); }, wpk);
  const std::vector<int64_t> bwd_shift = bwd.shifts();
  const WeightGradLayout lay(fwd);
  const LaneWeightGradLayout lane_lay(fwd);
  const bool lanes = lanes_over_outputs(fwd);
  const int64_t qp = (fwd.q() + 1) / 2, ohw = g.oh * g.ow;
  const std::vector<uint16_t> zero(lanes ? size_t(ohw) : 0, 0);  // padded channels' gradient
  const int64_t chunk = balanced_chunk(g.n, 1);
  const ChunkSums sums(gw ? g.n : 0, chunk, lanes ? lane_lay.floats() : lay.jp * lay.op);
  parallel_chunks(g.n, chunk, [&](int64_t n0, int64_t n1, bool first) {
    uint16_t* xb = nullptr;
    Pair* gyT = nullptr;
    uint16_t* row = nullptr;
    float* part = nullptr;
    std::vector<const uint16_t*> xs;
    if (gw) {
      // bordered_floats() 16-bit elements; the scratch is counted in floats.
      xb = reinterpret_cast<uint16_t*>(thread_scratch(0, size_t(fwd.bordered_floats() + 1) / 2));
      if (first) std::fill_n(xb, fwd.bordered_floats(), uint16_t(0));
      if (!lanes) {
        gyT = reinterpret_cast<Pair*>(thread_scratch(1, size_t(qp * lay.op)));
        row = reinterpret_cast<uint16_t*>(thread_scratch(4, size_t(kPairRows * qp)));
        if (first) {
          std::fill_n(gyT, qp * lay.op, 0u);
          std::fill_n(row, kPairRows * 2 * qp, uint16_t(0));
        }
        xs = column_inputs(fwd, lay, static_cast<const uint16_t*>(xb));
      }
      part = sums.start(n0);
    }
    Pair* gyb = nullptr;
    float* flat = nullptr;
    if (gx) {
      gyb = reinterpret_cast<Pair*>(thread_scratch(2, size_t(bordered_pairs(bwd))));
      flat = thread_scratch(3, size_t(round_up(bwd.cout, OB) * bwd.qs()));
      if (first) std::fill_n(gyb, bordered_pairs(bwd), 0u);
    }
    for (int64_t n = n0; n < n1; ++n) {
      const uint16_t* gyn = gy + n * g.o * g.oh * g.ow;
      if (gw) {
        fill_interior(fwd, x + n * g.c * g.h * g.w, xb);
        if (lanes) {
          lane_weight_grad(fwd, lane_lay, gyn, zero.data(), static_cast<const uint16_t*>(xb), part);
        } else {
          transpose_grad_pairs(fwd, lay.op, gyn, reinterpret_cast<uint16_t*>(gyT), row, 2 * qp);
          weight_grad_pairs(fwd, lay, xs, gyT, part);
        }
      }
      if (gx) {
        fill_pairs(bwd, gyn, gyb);
        correlate_pairs(bwd, bwd_shift, gyb, wpk.data(), flat);
        write_out(bwd, flat, nullptr, gx + n * g.c * g.h * g.w, bwd.qs());
      }
    }
  });
  if (!gw) return;
  if (lanes)
    write_lane_weight_grad(g, lane_lay, sums.total(), gw);
  else
    write_weight_grad(g, lay, sums.total(), gw);
}
#endif  // __AVX512BF16__

#if defined(GALLEY_AMX)
void tiles_forward(const Conv2dGeometry& g, const uint16_t* x, const float* w, const float* b,
                   bfloat16* y) {
  const Plan p = forward_plan(g);
  const TilePlan tp(p);
  std::vector<uint16_t> wpk;
  pack_weight_tiles(
      p, tp, [&](int64_t co, int64_t ci, int64_t t) { return forward_weight(g, w, co, ci, t); },
      wpk);
  const std::vector<int64_t> shift = p.shifts();
  parallel_chunks(g.n, 1, [&](int64_t n0, int64_t n1, bool first) {
    TileScope tiles;
    Pair* xb = reinterpret_cast<Pair*>(thread_scratch(0, size_t(tp.bordered(p))));
    float* flat = thread_scratch(1, size_t(tp.op * tp.qq));
    if (first) std::fill_n(xb, tp.bordered(p), 0u);
    for (int64_t n = n0; n < n1; ++n) {
      fill_pairs(p, x + n * g.c * g.h * g.w, xb);
      correlate_tiles(p, tp, shift, xb, wpk.data(), flat);
      write_out(p, flat, b, y + n * g.o * g.oh * g.ow, tp.qq);
    }
  });
}

void tiles_backward(const Conv2dGeometry& g, const uint16_t* x, const float* w, const uint16_t* gy,
                    bfloat16* gx, float* gw) {
  const Plan fwd = forward_plan(g);
  const int64_t taps = fwd.taps(), d = g.dilation;
  const Plan bwd = input_grad_plan(g);
  const TilePlan fwd_tp(fwd), bwd_tp(bwd);
  std::vector<uint16_t> wpk;
  if (gx)
    pack_weight_tiles(
        bwd, bwd_tp,
        [&](int64_t ci, int64_t o, int64_t t) { return flipped_weight(g, w, ci, o, t); }, wpk);
  const std::vector<int64_t> fwd_shift = fwd.shifts(), bwd_shift = bwd.shifts();
  // The weight gradient's input buffer: every channel plane padded to 32, plus the reach of the
  // last block.
  const int64_t cpad = fwd_tp.kp * 2;
  const int64_t x_elems = cpad * fwd.plane() + (fwd_tp.qq - fwd.q()) + (g.kw - 1) * d + 32;
  const int64_t part_elems = taps * cpad * fwd_tp.op;
  const int64_t chunk = balanced_chunk(g.n, 1);
  const ChunkSums sums(gw ? g.n : 0, chunk, part_elems);
  parallel_chunks(g.n, chunk, [&](int64_t n0, int64_t n1, bool first) {
    TileScope tiles;
    uint16_t* xb = nullptr;
    Pair* gyT = nullptr;
    uint16_t* row = nullptr;
    float* part = nullptr;
    if (gw) {
      xb = reinterpret_cast<uint16_t*>(thread_scratch(0, size_t(x_elems + 1) / 2));
      gyT = reinterpret_cast<Pair*>(thread_scratch(1, size_t(fwd_tp.qq / 2 * fwd_tp.op)));
      row = reinterpret_cast<uint16_t*>(thread_scratch(4, size_t(kPairRows * fwd_tp.qq / 2)));
      if (first) {
        std::fill_n(xb, x_elems, uint16_t(0));
        std::fill_n(gyT, fwd_tp.qq / 2 * fwd_tp.op, 0u);
        std::fill_n(row, kPairRows * fwd_tp.qq, uint16_t(0));
      }
      part = sums.start(n0);
    }
    Pair* gyb = nullptr;
    float* flat = nullptr;
    if (gx) {
      gyb = reinterpret_cast<Pair*>(thread_scratch(2, size_t(bwd_tp.bordered(bwd))));
      flat = thread_scratch(3, size_t(bwd_tp.op * bwd_tp.qq));
      if (first) std::fill_n(gyb, bwd_tp.bordered(bwd), 0u);
    }
    for (int64_t n = n0; n < n1; ++n) {
      const uint16_t* gyn = gy + n * g.o * g.oh * g.ow;
      if (gw) {
        fill_interior(fwd, x + n * g.c * g.h * g.w, xb);
        transpose_grad_pairs(fwd, fwd_tp.op, gyn, reinterpret_cast<uint16_t*>(gyT), row, fwd_tp.qq);
        weight_grad_tiles(fwd, fwd_tp, fwd_shift, xb, gyT, part);
      }
      if (gx) {
        fill_pairs(bwd, gyn, gyb);
        correlate_tiles(bwd, bwd_tp, bwd_shift, gyb, wpk.data(), flat);
        write_out(bwd, flat, nullptr, gx + n * g.c * g.h * g.w, bwd_tp.qq);
      }
    }
  });
  if (gw) {
    const float* sum = sums.total();
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t ci = 0; ci < g.c; ++ci)
        for (int64_t tap = 0; tap < taps; ++tap)
          gw[(o * g.c + ci) * taps + tap] = sum[(tap * cpad + ci) * fwd_tp.op + o];
  }
}
#endif  // GALLEY_AMX

// The bfloat16 kernels k are in this build and host, and take g: stride 1, but for the weight
// gradient alone on the dot products (its column inputs are the plan's phases at any stride).
void check_available(Bf16Kernels k, const Conv2dGeometry& g, bool weight_grad_only = false) {
  GALLEY_CHECK(bf16_kernels_available(k), "conv2d: the ",
               k == Bf16Kernels::Tiles ? "AMX" : "AVX512-BF16",
               " bfloat16 kernels are not available on this host or in this build");
  const bool strides = weight_grad_only && k == Bf16Kernels::DotProducts;
  GALLEY_CHECK(g.stride == 1 || strides, "conv2d: the ",
               k == Bf16Kernels::Tiles ? "AMX" : "AVX512-BF16",
               " bfloat16 kernels of the direct path take stride 1",
               k == Bf16Kernels::Tiles ? "" : " (a larger one for the weight gradient alone)",
               ", not ", g.stride);
}

// What the direct path runs: one group; a stride above 1 with dilation 1.
void check_geometry(const Conv2dGeometry& g) {
  GALLEY_CHECK(g.groups == 1, "conv2d: the direct path takes one group, not ", g.groups);
  GALLEY_CHECK(g.stride >= 1 && (g.stride == 1 || (g.dilation == 1 && g.stride <= kMaxStride)),
               "conv2d: the direct path takes stride 1, or a stride up to ", kMaxStride,
               " with dilation 1, not stride ", g.stride, " with dilation ", g.dilation);
}

}  // namespace

bool bf16_kernels_available(Bf16Kernels k) {
  switch (k) {
    case Bf16Kernels::Tiles:
#if defined(GALLEY_AMX)
      return amx_granted();
#else
      return false;
#endif
    case Bf16Kernels::DotProducts:
#if defined(__AVX512BF16__)
      return true;
#else
      return false;
#endif
    case Bf16Kernels::Widened:
      return true;
  }
  return false;
}

namespace {

// The kernels bf16_kernels() takes when GALLEY_BF16_KERNELS does not choose.
Bf16Kernels default_bf16_kernels() {
  if (bf16_kernels_available(Bf16Kernels::Tiles)) return Bf16Kernels::Tiles;
#if defined(GALLEY_AMX)
  // A host with AMX runs vdpbf16ps at half its float32 FMA rate: widening is faster there.
  return Bf16Kernels::Widened;
#elif defined(__AVX512BF16__)
  // AMD's cores (Zen 4 and 5) issue vdpbf16ps at their float32 FMA rate. Intel's issue it once
  // every two cycles against two FMAs a cycle, whether or not their AMX tiles are visible (a
  // Xeon whose hypervisor hides them: 86 against 175 GFLOP/s on one core, each vdpbf16ps
  // counted as 32 multiply-adds), which halves every product the dot products take.
  __builtin_cpu_init();
  return __builtin_cpu_is("amd") ? Bf16Kernels::DotProducts : Bf16Kernels::Widened;
#else
  return Bf16Kernels::Widened;
#endif
}

// The kernel sets by their names in GALLEY_BF16_KERNELS.
constexpr std::pair<const char*, Bf16Kernels> kBf16KernelNames[] = {
    {"tiles", Bf16Kernels::Tiles},
    {"dot", Bf16Kernels::DotProducts},
    {"widened", Bf16Kernels::Widened}};

// GALLEY_BF16_KERNELS=tiles|dot|widened, where this host and build have them; anything else is
// said once on stderr and the default taken.
Bf16Kernels chosen_bf16_kernels() {
  const Bf16Kernels fallback = default_bf16_kernels();
  const char* env = std::getenv("GALLEY_BF16_KERNELS");
  if (!env || !*env) return fallback;
  const char* fallback_name = "";
  for (const auto& [name, kernels] : kBf16KernelNames) {
    if (std::strcmp(env, name) == 0 && bf16_kernels_available(kernels)) return kernels;
    if (kernels == fallback) fallback_name = name;
  }
  std::fprintf(stderr,
               "galley: GALLEY_BF16_KERNELS='%s' is not one of tiles, dot, widened that this "
               "host and build have; using %s\n",
               env, fallback_name);
  return fallback;
}

}  // namespace

Bf16Kernels bf16_kernels() {
  static const Bf16Kernels chosen = chosen_bf16_kernels();
  return chosen;
}

void conv2d_direct_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                           void* y, DType dtype, Bf16Kernels bf16) {
  check_geometry(g);
  if (on_bf16_kernels(dtype, bf16)) {
    check_available(bf16, g);
    const auto* xs = static_cast<const uint16_t*>(x);
    auto* ys = static_cast<bfloat16*>(y);
#if defined(GALLEY_AMX)
    if (bf16 == Bf16Kernels::Tiles) return tiles_forward(g, xs, w, b, ys);
#endif
#if defined(__AVX512BF16__)
    return pairs_forward(g, xs, w, b, ys);
#endif
    (void)xs, (void)ys;  // (check_available threw: no bfloat16 kernels in this build)
  }
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    direct_forward(g, static_cast<const T*>(x), w, b, static_cast<T*>(y));
  });
}

void conv2d_direct_backward(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                            void* gx, float* gw, DType dtype, Bf16Kernels bf16, float* gb) {
  check_geometry(g);
  const bool bf16_kernels = on_bf16_kernels(dtype, bf16);
  GALLEY_CHECK(!gb || (gw && !bf16_kernels),
               "conv2d_backward: the direct path sums the bias gradient with the weight gradient "
               "(so it needs the weight gradient too) on the float32 kernels only");
  if (bf16_kernels) {
    check_available(bf16, g, !gx);
    const auto* xs = static_cast<const uint16_t*>(x);
    const auto* gys = static_cast<const uint16_t*>(gy);
    auto* gxs = static_cast<bfloat16*>(gx);
#if defined(GALLEY_AMX)
    if (bf16 == Bf16Kernels::Tiles) return tiles_backward(g, xs, w, gys, gxs, gw);
#endif
#if defined(__AVX512BF16__)
    return pairs_backward(g, xs, w, gys, gxs, gw);
#endif
    (void)xs, (void)gys, (void)gxs;  // (check_available threw, as above)
  }
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    direct_backward(g, static_cast<const T*>(x), w, static_cast<const T*>(gy), static_cast<T*>(gx),
                    gw, gb);
  });
}

}  // namespace galley::kernels::cpu
