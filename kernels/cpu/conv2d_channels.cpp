#include "kernels/cpu/conv2d_channels.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "galley/error.h"
#include "galley/half.h"
#include "kernels/cpu/conv2d_block.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_lanes.h"

namespace galley::kernels::cpu {

ConvChannelsUse conv2d_channels_use(const Conv2dGeometry& g, DType dtype) {
  ConvChannelsUse use;
#if defined(GALLEY_VECTOR_LANES)
  const bool float32_sums = dtype == DType::Float32 || dtype == DType::Float16 ||
                            (dtype == DType::BFloat16 && bf16_kernels() != Bf16Kernels::Tiles);
  if (!(float32_sums && g.groups == 1 && g.stride >= 2 && g.dilation == 1 && g.kh * g.kw > 1 &&
        g.o >= 16 && g.n >= num_threads()))
    return use;
  use.forward = g.c >= 8;
  // With a single vector of input channels the input gradient's register block holds six
  // accumulators (six positions x one vector): enough to cover the multiply-adds' latency where a
  // core issues one 16-lane FMA a cycle (AMD Zen 4 runs them as two halves), too few where it
  // issues two (Intel's AVX-512 cores). There it takes the direct path's phases until the input
  // channels fill two vectors: on a Xeon (family 6 model 207, one thread, batch 64) resnet's
  // 16->32 3x3/2 input gradient ran 100-104 GFLOP/s on the phases against 66-75 here, its
  // 32->64 one 115-123 here against 96 on the phases.
  // bfloat16 on the dot products keeps 16: the direct path does not take its strided input
  // gradient, which would fall to im2col.
  use.input_grad =
      g.c >= (intel_avx512_cores() && !on_dot_products(dtype) ? 2 * conv_block::L : 16);
#if defined(__AVX512F__)
  // On the dot products the direct path's weight gradient on pairs takes it (conv2d_direct_use).
  use.weight_grad = g.c >= 16 && !on_dot_products(dtype);
#else
  use.weight_grad = g.c >= 16 && g.ow <= conv_block::L;
#endif
#else
  (void)g, (void)dtype;
#endif
  return use;
}

namespace {

#if defined(GALLEY_VECTOR_LANES)
using namespace conv_block;

// The register block: kPositions positions x up to two vectors of output channels (12 of AVX2's
// 16 registers, with two for the weights and one for the broadcast).
constexpr int kPositions = 6;
constexpr int64_t kMaxVectors = 2;

// The floats of a channel-last row of n channels: whole vectors, an odd number of them. Rows of a
// power of two bytes (128 for 32 channels, 256 for 64) put the positions a block reads, a stride
// apart, in a few of the L1 cache's sets, which then held too few of them: the weight gradient's
// register block ran at the speed of the L2 cache.
inline int64_t spread(int64_t n) {
  const int64_t v = round_up(n, L);
  return (v / L) % 2 ? v : v + L;
}

// n items in as few parts of at most `most` as can be, as even as can be: part k of parts(n, most)
// holds part_size(n, parts, k), the first n % parts one more than the rest (resnet's 7 x 7 outputs
// in blocks of at most 6 take 4 of 6 and 5 of 5, not 8 of 6 and one of a single position).
inline int64_t parts(int64_t n, int64_t most) {
  return (n + most - 1) / most;
}
inline int64_t part_size(int64_t n, int64_t parts, int64_t k) {
  return n / parts + (k < n % parts ? 1 : 0);
}

// Where the forward pass reads in a zero-bordered channel-last input of rows bw positions wide, cp
// floats a position: each tap's offset from a position's first input, and each output position's
// first input.
std::vector<int64_t> forward_taps(const Conv2dGeometry& g, int64_t bw, int64_t cp) {
  std::vector<int64_t> tap;
  for (int64_t a = 0; a < g.kh; ++a)
    for (int64_t e = 0; e < g.kw; ++e) tap.push_back((a * g.dilation * bw + e * g.dilation) * cp);
  return tap;
}
std::vector<int64_t> forward_positions(const Conv2dGeometry& g, int64_t bw, int64_t cp) {
  std::vector<int64_t> at;
  for (int64_t q = 0; q < g.oh * g.ow; ++q)
    at.push_back(((q / g.ow) * g.stride * bw + (q % g.ow) * g.stride) * cp);
  return at;
}

// out[p][v * L + i] = sum over c < cin, t < taps of w[(c * taps + t) * ldw + v * L + i] *
// x[p][tap[t] + c], for NP positions (x[p] their input in a channel-last buffer, out[p] their row
// of the channel-last output) and OV vectors of output channels: each output's sum in the direct
// path's order. (Not inlined: inlined into the callers' six cases of with_size, the two blocks ran
// 10-20% slower on AMD Zen 3.)
template <int OV, int NP>
__attribute__((noinline)) void channels_block(const float* const* x, const int64_t* tap,
                                              int64_t taps, int64_t cin, const float* w,
                                              int64_t ldw, float* const* out) {
  V acc[NP][OV];
  const float* xp[NP];
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) {
    xp[p] = x[p];
#pragma GCC unroll 2
    for (int v = 0; v < OV; ++v) acc[p][v] = V{};
  }
  for (int64_t c = 0; c < cin; ++c)
    for (int64_t t = 0; t < taps; ++t, w += ldw) {
      const int64_t at = tap[t] + c;
      broadcast_step(
          w, [&](int p) { return xp[p] + at; }, acc);
    }
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p)
#pragma GCC unroll 2
    for (int v = 0; v < OV; ++v) store(out[p] + v * L, acc[p][v]);
}

#if defined(__AVX512BF16__)
// channels_block on bfloat16 pairs of input channels (vdpbf16ps): out[p][v * L + i] = sum over
// channel pairs k < kp and taps t of the pair x[p][tap[t] + 2k], x[p][tap[t] + 2k + 1] (channel-
// last bfloat16 bits) dotted with the weights' pair w[(k * taps + t) * ldw + v * L + i].
template <int OV, int NP>
__attribute__((noinline)) void channels_pairs_block(const uint16_t* const* x, const int64_t* tap,
                                                    int64_t taps, int64_t kp, const Pair* w,
                                                    int64_t ldw, float* const* out) {
  __m512 acc[NP][OV];
  const uint16_t* xp[NP];
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) {
    xp[p] = x[p];
#pragma GCC unroll 2
    for (int v = 0; v < OV; ++v) acc[p][v] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kp; ++k)
    for (int64_t t = 0; t < taps; ++t, w += ldw) {
      const int64_t at = tap[t] + 2 * k;
      broadcast_pairs_step(
          w, [&](int p) { return xp[p] + at; }, acc);
    }
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p)
#pragma GCC unroll 2
    for (int v = 0; v < OV; ++v) _mm512_storeu_ps(out[p] + v * L, acc[p][v]);
}
#endif

// f(std::integral_constant<int, n>()) for a block size n from 1 to kPositions: the register blocks'
// sizes as constants.
template <typename F>
void with_size(int n, F&& f) {
  switch (n) {
    case 6:
      return f(std::integral_constant<int, 6>());
    case 5:
      return f(std::integral_constant<int, 5>());
    case 4:
      return f(std::integral_constant<int, 4>());
    case 3:
      return f(std::integral_constant<int, 3>());
    case 2:
      return f(std::integral_constant<int, 2>());
    default:
      return f(std::integral_constant<int, 1>());
  }
}
static_assert(kPositions == 6, "with_size covers the blocks' sizes up to kPositions");

// One correlation in channel-last form: position p reads input `src + in[p]` at the taps' offsets
// and writes row out[p] of `dst` (rows `ld` floats apart); `cin` input channels; op output
// channels in whole vectors; the weights in blocks of kMaxVectors vectors of output channels (the
// last block perhaps one), each block's [channel][tap][its vectors] in a run of its own (set()).
// Rows of all op channels, 256 bytes apart for 64 of them, fell in a quarter of the L1 cache's
// sets: the block ran at 0.64 of the FMA peak on AMD Zen 3 against 0.96 on the runs.
struct Correlation {
  std::vector<int64_t> in, out, tap;
  int64_t cin = 0, op = 0;
  aligned_vector<float> w;
  // The first output channel of o's block, and its width.
  static int64_t block_of(int64_t o) { return o / (kMaxVectors * L) * (kMaxVectors * L); }
  int64_t width(int64_t o0) const { return std::min(kMaxVectors * L, op - o0); }
  // Zeroed weights for cin, op and the taps.
  void size_weights() { w.assign(size_t(cin * int64_t(tap.size()) * op), 0.f); }
  // The weight of input channel c, tap t and output channel o.
  void set(int64_t c, int64_t t, int64_t o, float v) {
    const int64_t o0 = block_of(o), taps = int64_t(tap.size());
    w[size_t(o0 * cin * taps + (c * taps + t) * width(o0) + o - o0)] = v;
  }
  // The pairs of input channels (2k, 2k + 1) for k < kp(): the weights rounded to bfloat16 in
  // each block's [pair][tap][its vectors] (a zero partner past cin).
  int64_t kp() const { return (cin + 1) / 2; }
  aligned_vector<Pair> pair_weights() const {
    const int64_t taps = int64_t(tap.size());
    aligned_vector<Pair> out(size_t(kp() * taps * op));
    // A block's channel c is a row of taps x its width: rows 2k and 2k + 1 paired.
    for (int64_t o0 = 0; o0 < op; o0 += kMaxVectors * L)
      pair_rows(w.data() + o0 * cin * taps, 1, cin, taps * width(o0),
                out.data() + o0 * kp() * taps);
    return out;
  }
};

// Runs c over one image: every output channel of every position, OV = 2 vectors at a time and
// then one. The positions go in blocks of at most kPositions, as even as can be (parts(): a block
// of a single position's two accumulators would wait on the multiply-adds' latency). src is
// channel-last float32 with c.w as the weights, or bfloat16 bits with c.pair_weights() as w.
template <typename S, typename W>
void correlate(const Correlation& c, const W* w, const S* src, float* dst, int64_t ld) {
  const int64_t n = int64_t(c.in.size()), taps = int64_t(c.tap.size());
  if (n == 0) return;
  const int64_t blocks = parts(n, kPositions);
  auto run = [&](auto ov, int64_t o0) {
    constexpr int OV = decltype(ov)::value;
    int64_t q = 0;
    for (int64_t k = 0; k < blocks; ++k) {
      const int np = int(part_size(n, blocks, k));
      const S* x[kPositions];
      float* out[kPositions];
      for (int i = 0; i < np; ++i) {
        x[i] = src + c.in[size_t(q + i)];
        out[i] = dst + c.out[size_t(q + i)] * ld + o0;
      }
      with_size(np, [&](auto size) {
        constexpr int NP = decltype(size)::value;
        if constexpr (std::is_same_v<S, float>) {
          channels_block<OV, NP>(x, c.tap.data(), taps, c.cin, w + o0 * c.cin * taps, OV * L, out);
        } else {
#if defined(__AVX512BF16__)
          channels_pairs_block<OV, NP>(x, c.tap.data(), taps, c.kp(), w + o0 * c.kp() * taps,
                                       OV * L, out);
#endif
        }
      });
      q += np;
    }
  };
  int64_t o0 = 0;
  for (; o0 + kMaxVectors * L <= c.op; o0 += kMaxVectors * L)
    run(std::integral_constant<int, 2>{}, o0);
  if (o0 < c.op) run(std::integral_constant<int, 1>{}, o0);
}

// A plane of `channels` planes h x w copied channel-last (cp elements a position: floats, or
// bfloat16 bits) into the interior of a bordered buffer of rows `bw` positions wide, from its row
// `top` and column `left`.
template <typename T, typename D>
void fill_bordered(const T* x, int64_t channels, int64_t h, int64_t w, int64_t cp, int64_t bw,
                   int64_t top, int64_t left, D* xb) {
  to_channels_last(x, channels, h, w, cp, xb + (top * bw + left) * cp, bw * cp);
}

template <typename T>
void channels_forward(const Conv2dGeometry& g, const T* x, const float* w, const float* b, T* y) {
  const int64_t taps = g.kh * g.kw, cp = spread(g.c), bw = g.w + 2 * g.pad,
                bordered = (g.h + 2 * g.pad) * bw * cp, P = g.oh * g.ow;
  Correlation c;
  c.cin = g.c, c.op = round_up(g.o, L);
  c.tap = forward_taps(g, bw, cp);
  c.size_weights();
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t ci = 0; ci < g.c; ++ci)
      for (int64_t t = 0; t < taps; ++t) c.set(ci, t, o, w[(o * g.c + ci) * taps + t]);
  c.in = forward_positions(g, bw, cp);
  for (int64_t q = 0; q < P; ++q) c.out.push_back(q);
  const bool pairs = on_dot_products(dtype_of<T>::value);
  const aligned_vector<Pair> wp = pairs ? c.pair_weights() : aligned_vector<Pair>();
  parallel_chunks(g.n, 1, [&](int64_t n0, int64_t n1, bool first) {
    const int64_t ld = spread(g.o);
    float* yc = thread_scratch(1, size_t(P * ld));
    // xb: the bordered channel-last image, floats or bfloat16 bits; w: c's weights for it.
    auto run = [&](auto* xb, const auto* wts) {
      if (first) std::fill_n(xb, bordered, 0);  // the border stays zero
      for (int64_t n = n0; n < n1; ++n) {
        fill_bordered(x + n * g.c * g.h * g.w, g.c, g.h, g.w, cp, bw, g.pad, g.pad, xb);
        correlate(c, wts, xb, yc, ld);
        // The bias added last, as the direct path adds it.
        from_channels_last(yc, ld, g.o, P, b, y + n * g.o * P);
      }
    };
    if (pairs)
      run(reinterpret_cast<uint16_t*>(thread_scratch(0, size_t(bordered + 1) / 2)), wp.data());
    else
      run(thread_scratch(0, size_t(bordered)), c.w.data());
  });
}

// The input gradient of a strided convolution (dilation 1) by its phases, as the direct path's
// (cpu/conv2d_direct.cpp): input row iy with iy + pad = s m + r takes the taps a = r + s u (u <
// U_r) from output gradient row m - u; columns alike. So every input position of phase (r, c)
// is a correlation of the output gradient, bordered, with U_r x V_c of the taps (flipped, the
// channels swapped), at its own position: one Correlation a phase over the channel-last output
// gradient, writing the positions' rows of a channel-last input gradient, which goes back into
// the planes as the forward's output does. A phase no tap reaches (a kernel narrower than the
// stride) is zero.
template <typename T>
void channels_input_grad(const Conv2dGeometry& g, const float* w, const T* gy, T* gx) {
  const int64_t s = g.stride, op = spread(g.o), P = g.h * g.w;
  auto taps_of = [&](int64_t k, int64_t r) { return r < k ? (k - r + s - 1) / s : 0; };
  // The border: row m - u of the output gradient for u < U, m = (iy + pad) / s, from -(U - 1) to
  // (h - 1 + pad) / s; columns alike.
  const int64_t top = taps_of(g.kh, 0) - 1, left = taps_of(g.kw, 0) - 1;
  const int64_t bottom = std::max<int64_t>(0, (g.h - 1 + g.pad) / s - (g.oh - 1)),
                right = std::max<int64_t>(0, (g.w - 1 + g.pad) / s - (g.ow - 1));
  const int64_t bw = left + g.ow + right, bordered = (top + g.oh + bottom) * bw * op;
  std::vector<Correlation> phases;
  std::vector<int64_t> gaps;  // the positions of phases that no tap reaches
  for (int64_t r = 0; r < s; ++r)
    for (int64_t e = 0; e < s; ++e) {
      const int64_t U = taps_of(g.kh, r), Vt = taps_of(g.kw, e);
      Correlation c;
      for (int64_t iy = 0; iy < g.h; ++iy)
        for (int64_t ix = 0; ix < g.w; ++ix) {
          if ((iy + g.pad) % s != r || (ix + g.pad) % s != e) continue;
          if (U == 0 || Vt == 0) {
            gaps.push_back(iy * g.w + ix);
            continue;
          }
          c.in.push_back((((iy + g.pad) / s + top) * bw + (ix + g.pad) / s + left) * op);
          c.out.push_back(iy * g.w + ix);
        }
      if (c.in.empty()) continue;
      c.cin = g.o, c.op = round_up(g.c, L);
      // Tap t takes u = U - 1 - t / V and v = V - 1 - t % V: the direct path's order.
      for (int64_t t = 0; t < U * Vt; ++t)
        c.tap.push_back((-(U - 1 - t / Vt) * bw - (Vt - 1 - t % Vt)) * op);
      c.size_weights();
      for (int64_t o = 0; o < g.o; ++o)
        for (int64_t t = 0; t < U * Vt; ++t)
          for (int64_t ci = 0; ci < g.c; ++ci) {
            const int64_t a = r + s * (U - 1 - t / Vt), b = e + s * (Vt - 1 - t % Vt);
            c.set(o, t, ci, w[((o * g.c + ci) * g.kh + a) * g.kw + b]);
          }
      phases.push_back(std::move(c));
    }
  const int64_t cp = spread(g.c);
  const bool pairs = on_dot_products(dtype_of<T>::value);
  std::vector<aligned_vector<Pair>> wp;
  if (pairs)
    for (const Correlation& c : phases) wp.push_back(c.pair_weights());
  parallel_chunks(g.n, 1, [&](int64_t n0, int64_t n1, bool first) {
    float* gxc = thread_scratch(1, size_t(P * cp));
    if (first)  // the gaps' rows stay zero
      for (int64_t q : gaps) std::fill_n(gxc + q * cp, cp, 0.f);
    // gyb: the bordered channel-last output gradient, floats or bfloat16 bits; wts(k): phase
    // k's weights for it.
    auto run = [&](auto* gyb, auto wts) {
      if (first) std::fill_n(gyb, bordered, 0);  // the border stays zero
      for (int64_t n = n0; n < n1; ++n) {
        fill_bordered(gy + n * g.o * g.oh * g.ow, g.o, g.oh, g.ow, op, bw, top, left, gyb);
        for (size_t k = 0; k < phases.size(); ++k) correlate(phases[k], wts(k), gyb, gxc, cp);
        from_channels_last(gxc, cp, g.c, P, static_cast<const float*>(nullptr), gx + n * g.c * P);
      }
    };
    if (pairs)
      run(reinterpret_cast<uint16_t*>(thread_scratch(0, size_t(bordered + 1) / 2)),
          [&](size_t k) { return wp[k].data(); });
    else
      run(thread_scratch(0, size_t(bordered)), [&](size_t k) { return phases[k].w.data(); });
  });
}

// part[t][c + j][o0 + v * L + i] += sum over the batch's positions p of
// x[in[p] + tap + c + j] * gy[p * ldg + o0 + v * L + i], for NC consecutive input channels c + j
// at one tap and OV vectors of output channels (x: the batch's bordered channel-last inputs from
// the tap and channel c; gy: its channel-last output gradients from o0; part's rows ldp apart). Not
// inlined, as channels_block.
template <int OV, int NC>
__attribute__((noinline)) void weight_grad_block(const float* x, const int64_t* in, int64_t n,
                                                 const float* gy, int64_t ldg, float* part,
                                                 int64_t ldp) {
  V acc[NC][OV];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j)
#pragma GCC unroll 2
    for (int v = 0; v < OV; ++v) acc[j][v] = V{};
  for (int64_t p = 0; p < n; ++p, gy += ldg) {
    const float* xp = x + in[p];
    broadcast_step(
        gy, [&](int j) { return xp + j; }, acc);
  }
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j)
#pragma GCC unroll 2
    for (int v = 0; v < OV; ++v) {
      float* out = part + j * ldp + v * L;
      store(out, load(out) + acc[j][v]);
    }
}

// The weight gradient's tiles of positions: on resnet's 32->64 3x3/2 layer (AMD Zen 3) tiles of 64
// were 1.05-1.07x tiles of 128 on one thread and two, and 1.04x and 1.08x tiles of 48 and 32.
constexpr int64_t kWeightGradTile = 64;

// The weight gradient: gw[o][c][t] = the sum over every output position of every image of
// x[c] at the position's tap t times gy[o] there. Images go in batches whose bordered channel-last
// inputs and channel-last output gradients stay in the L2 cache (256 KiB); each register block
// (kPositions input channels at one tap, whose inputs share a cache line, x up to two vectors of
// output channels) runs over all the batch's positions, its sums added into the chunk's part
// [tap][channel][output channels in whole vectors]; the chunks' parts added in chunk order.
template <typename T>
void channels_weight_grad(const Conv2dGeometry& g, const T* x, const T* gy, float* gw) {
  // (each image's bordered input a vector past the last's: a whole number of 4 KiB pages apart,
  // they would share the L1 cache's sets as the rows did)
  const int64_t taps = g.kh * g.kw, cp = spread(g.c), op = spread(g.o), ov = round_up(g.o, L);
  const int64_t bw = g.w + 2 * g.pad, bordered = (g.h + 2 * g.pad) * bw * cp + L, P = g.oh * g.ow;
  const int64_t image = (bordered + P * op) * int64_t(sizeof(float));
  const int64_t batch = std::max<int64_t>(1, (int64_t(256) << 10) / std::max<int64_t>(image, 1));
  const std::vector<int64_t> tap = forward_taps(g, bw, cp), at = forward_positions(g, bw, cp);
  const int64_t cblocks = parts(g.c, kPositions);  // blocks of input channels
  const int64_t chunk = balanced_chunk(g.n, 1);
  const ChunkSums sums(g.n, chunk, taps * g.c * op);
  parallel_chunks(g.n, chunk, [&](int64_t n0, int64_t n1, bool first) {
    const int64_t most = std::min(batch, n1 - n0);
    float* xb = thread_scratch(0, size_t(most * bordered));
    float* gyc = thread_scratch(1, size_t(most * P * op));
    int64_t* in = reinterpret_cast<int64_t*>(thread_scratch(2, size_t(2 * most * P)));
    if (first) std::fill_n(xb, most * bordered, 0.f);  // the borders stay zero
    float* part = sums.start(n0);
    for (int64_t b0 = n0; b0 < n1; b0 += batch) {
      const int64_t b1 = std::min(n1, b0 + batch), n = (b1 - b0) * P;
      for (int64_t m = 0; m < b1 - b0; ++m) {
        fill_bordered(x + (b0 + m) * g.c * g.h * g.w, g.c, g.h, g.w, cp, bw, g.pad, g.pad,
                      xb + m * bordered);
        to_channels_last(gy + (b0 + m) * g.o * P, g.o, 1, P, op, gyc + m * P * op, 0);
        for (int64_t q = 0; q < P; ++q) in[m * P + q] = m * bordered + at[size_t(q)];
      }
      // Tiles of at most kWeightGradTile positions, as even as can be: a block's sweep reads a
      // cache line of inputs and one of output gradients a position, which stay in the L1 cache
      // for the next blocks' sweeps over the tile.
      const int64_t tiles = parts(n, kWeightGradTile);
      for (int64_t k = 0, p0 = 0; k < tiles; ++k) {
        const int64_t np = part_size(n, tiles, k);
        const int64_t* tin = in + p0;
        for (int64_t o0 = 0; o0 < ov; o0 += kMaxVectors * L)
          for (int64_t t = 0; t < taps; ++t)
            for (int64_t kc = 0, c0 = 0; kc < cblocks; ++kc) {
              const int nc = int(part_size(g.c, cblocks, kc));
              const float* xt = xb + tap[size_t(t)] + c0;
              float* pt = part + (t * g.c + c0) * op + o0;
              const float* gt = gyc + p0 * op + o0;
              with_size(nc, [&](auto size) {
                constexpr int NC = decltype(size)::value;
                if (o0 + kMaxVectors * L <= ov)
                  weight_grad_block<2, NC>(xt, tin, np, gt, op, pt, op);
                else
                  weight_grad_block<1, NC>(xt, tin, np, gt, op, pt, op);
              });
              c0 += nc;
            }
        p0 += np;
      }
    }
  });
  const float* total = sums.total();
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t t = 0; t < taps; ++t)
        gw[(o * g.c + c) * taps + t] = total[(t * g.c + c) * op + o];
}
#endif

}  // namespace

void conv2d_channels_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                             void* y, DType dtype) {
  GALLEY_CHECK(g.groups == 1, "conv2d: the channels-across-lanes path takes one group, not ",
               g.groups);
#if defined(GALLEY_VECTOR_LANES)
  if (g.n == 0 || g.oh * g.ow == 0 || g.o == 0) return;
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    channels_forward(g, static_cast<const T*>(x), w, b, static_cast<T*>(y));
  });
#else
  (void)x, (void)w, (void)b, (void)y, (void)dtype;
  GALLEY_CHECK(false,
               "conv2d: the channels-across-lanes path needs AVX2 with FMA, or AVX-512, "
               "in the build");
#endif
}

void conv2d_channels_input_grad(const Conv2dGeometry& g, const float* w, const void* gy, void* gx,
                                DType dtype) {
  GALLEY_CHECK(g.groups == 1 && g.dilation == 1 && g.stride >= 1,
               "conv2d_backward: the channels-across-lanes input gradient takes one group, "
               "dilation 1 and a stride of at least 1, not ",
               g.groups, " groups, dilation ", g.dilation, " and stride ", g.stride);
#if defined(GALLEY_VECTOR_LANES)
  if (g.n == 0 || g.h * g.w == 0 || g.c == 0) return;
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    channels_input_grad(g, w, static_cast<const T*>(gy), static_cast<T*>(gx));
  });
#else
  (void)w, (void)gy, (void)gx, (void)dtype;
  GALLEY_CHECK(false,
               "conv2d_backward: the channels-across-lanes path needs AVX2 with FMA, or "
               "AVX-512, in the build");
#endif
}

void conv2d_channels_weight_grad(const Conv2dGeometry& g, const void* x, const void* gy, float* gw,
                                 DType dtype) {
  GALLEY_CHECK(g.groups == 1,
               "conv2d_backward: the channels-across-lanes path takes one group, not ", g.groups);
#if defined(GALLEY_VECTOR_LANES)
  if (g.n == 0 || g.oh * g.ow == 0 || g.c == 0) {  // no products: a zero gradient
    std::fill_n(gw, g.o * g.c * g.kh * g.kw, 0.f);
    return;
  }
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    channels_weight_grad(g, static_cast<const T*>(x), static_cast<const T*>(gy), gw);
  });
#else
  (void)x, (void)gy, (void)gw, (void)dtype;
  GALLEY_CHECK(false,
               "conv2d_backward: the channels-across-lanes path needs AVX2 with FMA, or "
               "AVX-512, in the build");
#endif
}

}  // namespace galley::kernels::cpu
