#include "kernels/cpu/conv2d_direct.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/parallel.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace galley::kernels::cpu {
namespace {

// The register blocking per instruction set. L floats: one vector register (the compiler splits
// it on hosts with neither). OB output channels x up to 3 vectors of outputs in the
// correlation's accumulators, and kWeightGradAcc accumulators of at most kMaxWeightGradVectors
// vectors of output channels each in the weight gradient's: with AVX-512's 32 registers 8 x 3
// and 24 (of 4 vectors); with AVX2's 16, 4 x 3 and 12 (of 2), which leaves room for the loads
// and the broadcast.
#if defined(__AVX512F__)
constexpr int64_t L = 16;
constexpr int64_t OB = 8;
constexpr int kWeightGradAcc = 24;
constexpr int64_t kMaxWeightGradVectors = 4;
#else
constexpr int64_t L = 8;
constexpr int64_t OB = 4;
constexpr int kWeightGradAcc = 12;
constexpr int64_t kMaxWeightGradVectors = 2;
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

// One stride-1 correlation: `cin` planes of h x w, zero-bordered by pad_h / pad_w, against
// kh x kw taps spaced `d` apart, giving `cout` planes of oh() x ow().
struct Plan {
  int64_t cin, h, w, pad_h, pad_w, cout, kh, kw, d;
  int64_t hp() const { return h + 2 * pad_h; }
  int64_t wp() const { return w + 2 * pad_w; }
  int64_t oh() const { return hp() - (kh - 1) * d; }
  int64_t ow() const { return wp() - (kw - 1) * d; }
  int64_t plane() const { return hp() * wp(); }
  int64_t taps() const { return kh * kw; }
  int64_t q() const { return oh() * wp(); }        // flat outputs, junk columns included
  int64_t qs() const { return round_up(q(), L); }  // ... in whole vectors
  // The bordered input, plus room for the reach of the last vector past the last plane.
  int64_t bordered_floats() const { return cin * plane() + (qs() - q()) + (kw - 1) * d + L; }
  int64_t shift(int64_t t) const { return ((t / kw) * wp() + t % kw) * d; }
  std::vector<int64_t> shifts() const {
    std::vector<int64_t> s(static_cast<size_t>(taps()));
    for (int64_t t = 0; t < taps(); ++t) s[size_t(t)] = shift(t);
    return s;
  }
};

// Copies `p.cin` planes of T into the interior of the bordered float32 buffer (16-bit values
// widened on the way); the border and the slack, zeroed once per call, stay zero.
template <typename T>
void fill_interior(const Plan& p, const T* src, float* dst) {
  for (int64_t c = 0; c < p.cin; ++c)
    for (int64_t i = 0; i < p.h; ++i) {
      float* d = dst + c * p.plane() + (i + p.pad_h) * p.wp() + p.pad_w;
      const T* s = src + (c * p.h + i) * p.w;
      if constexpr (std::is_same_v<T, float>)
        std::memcpy(d, s, p.w * sizeof(float));
      else
        to_float(s, d, p.w);
    }
}

// Writes the valid columns of the flat output: out[c][i][j] = flat[c][i * wp + j] (+ bias[c]),
// rounded once to a 16-bit T (through the flat row, which is scratch).
template <typename T>
void write_out(const Plan& p, float* flat, const float* bias, T* out) {
  const int64_t oh = p.oh(), ow = p.ow(), wp = p.wp(), qs = p.qs();
  for (int64_t c = 0; c < p.cout; ++c) {
    const float b = bias ? bias[c] : 0.f;
    for (int64_t i = 0; i < oh; ++i) {
      float* src = flat + c * qs + i * wp;
      T* dst = out + (c * oh + i) * ow;
      if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
        for (int64_t j = 0; j < ow; ++j) dst[j] = src[j] + b;
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
  const int64_t blocks = round_up(p.cout, OB) / OB, taps = p.taps();
  out.assign(size_t(blocks * p.cin * taps * OB), 0.f);
  for (int64_t cb = 0; cb < blocks; ++cb)
    for (int64_t ci = 0; ci < p.cin; ++ci)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t o = 0; o < OB && cb * OB + o < p.cout; ++o)
          out[size_t(((cb * p.cin + ci) * taps + t) * OB + o)] = at(cb * OB + o, ci, t);
}

// OB output channels x NV vectors of flat outputs, summed over every (input channel, tap).
template <int NV>
void correlate_block(const float* x, int64_t plane, int64_t cin, const int64_t* shift, int64_t taps,
                     const float* wb, float* y, int64_t ldy) {
  V acc[OB][NV];
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[o][v] = V{};
  for (int64_t c = 0; c < cin; ++c, x += plane) {
    for (int64_t t = 0; t < taps; ++t, wb += OB) {
      const float* xs = x + shift[t];
      V xv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) xv[v] = load(xs + v * L);
#pragma GCC unroll 8
      for (int o = 0; o < OB; ++o) {
        const V wv = broadcast(wb + o);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[o][v] += wv * xv[v];
      }
    }
  }
#pragma GCC unroll 8
  for (int o = 0; o < OB; ++o)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store(y + o * ldy + v * L, acc[o][v]);
}

// flat[cout rounded up to OB][qs] = the correlation of the bordered input xb with packed weights;
// shift is p.shifts().
void correlate(const Plan& p, const std::vector<int64_t>& shift, const float* xb, const float* wpk,
               float* flat) {
  const int64_t taps = p.taps(), qs = p.qs(), nvec = qs / L;
  for (int64_t cb = 0; cb * OB < p.cout; ++cb) {
    const float* wb = wpk + cb * p.cin * taps * OB;
    float* yb = flat + cb * OB * qs;
    int64_t v = 0;
    for (; v + 3 <= nvec; v += 3)
      correlate_block<3>(xb + v * L, p.plane(), p.cin, shift.data(), taps, wb, yb + v * L, qs);
    if (nvec - v == 2)
      correlate_block<2>(xb + v * L, p.plane(), p.cin, shift.data(), taps, wb, yb + v * L, qs);
    else if (nvec - v == 1)
      correlate_block<1>(xb + v * L, p.plane(), p.cin, shift.data(), taps, wb, yb + v * L, qs);
  }
}

// The weight gradient's register block: NJ (input channel, tap) columns x OV vectors of output
// channels, summed over every flat output q. gyT is the output gradient as [q][channel] with
// zeros in the junk columns; xs[j] points at column j's input, already shifted by its tap.
template <int OV, int NJ>
void weight_grad_block(const float* gyT, int64_t ldg, int64_t q, const float* const* xs, float* out,
                       int64_t ldo) {
  V acc[NJ][OV];
  const float* x[NJ];
#pragma GCC unroll 24
  for (int j = 0; j < NJ; ++j) {
    x[j] = xs[j];
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) acc[j][v] = V{};
  }
  for (int64_t i = 0; i < q; ++i, gyT += ldg) {
    V g[OV];
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) g[v] = load(gyT + v * L);
#pragma GCC unroll 24
    for (int j = 0; j < NJ; ++j) {
      const V xv = broadcast(x[j] + i);
#pragma GCC unroll 4
      for (int v = 0; v < OV; ++v) acc[j][v] += xv * g[v];
    }
  }
#pragma GCC unroll 24
  for (int j = 0; j < NJ; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < OV; ++v) {
      float* o = out + j * ldo + v * L;
      store(o, load(o) + acc[j][v]);
    }
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
std::vector<const float*> column_inputs(const Plan& p, const WeightGradLayout& lay,
                                        const float* xb) {
  const int64_t taps = p.taps(), j_real = p.cin * taps;
  std::vector<const float*> xs(static_cast<size_t>(lay.jp));
  for (int64_t j = 0; j < lay.jp; ++j)
    xs[size_t(j)] = j < j_real ? xb + (j / taps) * p.plane() + p.shift(j % taps) : xb;
  return xs;
}

// part[j][o] += sum over q of gyT[q][o] * xs[j][q] (xs from column_inputs).
void weight_grad(const Plan& p, const WeightGradLayout& lay, const std::vector<const float*>& xs,
                 const float* gyT, float* part) {
  const int64_t q = p.q();
  for (int64_t o0 = 0; o0 < lay.op; o0 += lay.ov * L)
    for (int64_t j0 = 0; j0 < lay.jp; j0 += lay.nj) {
      const float* const* x = xs.data() + j0;
      float* out = part + j0 * lay.op + o0;
      switch (lay.ov) {
        case 1:
          weight_grad_block<1, kWeightGradAcc>(gyT + o0, lay.op, q, x, out, lay.op);
          break;
        case 2:
          weight_grad_block<2, kWeightGradAcc / 2>(gyT + o0, lay.op, q, x, out, lay.op);
          break;
#if defined(__AVX512F__)
        case 3:
          weight_grad_block<3, kWeightGradAcc / 3>(gyT + o0, lay.op, q, x, out, lay.op);
          break;
        default:
          weight_grad_block<4, kWeightGradAcc / 4>(gyT + o0, lay.op, q, x, out, lay.op);
          break;
#endif
      }
    }
}

// gyT[q][o] = gy[o][oh][ow] at q = oh * wp + ow (widened); the junk columns and padded channels
// stay zero. In tiles of 16 columns by every channel, so the rows of gyT being written stay in L1.
template <typename T>
void transpose_grad(const Plan& p, int64_t op, const T* gy, float* gyT) {
  const int64_t oh = p.oh(), ow = p.ow(), wp = p.wp();
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j0 = 0; j0 < ow; j0 += L) {
      const int64_t nj = std::min(L, ow - j0);
      float* dst = gyT + (i * wp + j0) * op;
      for (int64_t o = 0; o < p.cout; ++o) {
        const T* src = gy + (o * oh + i) * ow + j0;
        for (int64_t j = 0; j < nj; ++j) dst[j * op + o] = static_cast<float>(src[j]);
      }
    }
}

Plan forward_plan(const Conv2dGeometry& g) {
  return {g.c, g.h, g.w, g.pad, g.pad, g.o, g.kh, g.kw, g.dilation};
}

}  // namespace

ConvDirectUse conv2d_direct_use(const Conv2dGeometry& g) {
  ConvDirectUse use;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  const bool fits = g.stride == 1 && g.groups == 1 && g.kh * g.kw > 1 &&
                    g.pad <= (g.kh - 1) * g.dilation && g.pad <= (g.kw - 1) * g.dilation &&
                    g.n >= num_threads();
  if (!fits) return use;
  const int64_t columns = g.c * g.kh * g.kw;  // (input channel, tap) pairs
  use.forward = columns >= 16;
  use.weight_grad = columns >= 64;
  use.input_grad = g.c >= 16;
#else
  (void)g;
#endif
  return use;
}

namespace {

template <typename T>
void direct_forward(const Conv2dGeometry& g, const T* x, const float* w, const float* b, T* y) {
  const Plan p = forward_plan(g);
  const int64_t taps = p.taps();
  std::vector<float> wpk;
  pack_weights(
      p, [&](int64_t co, int64_t ci, int64_t t) { return w[(co * g.c + ci) * taps + t]; }, wpk);
  const std::vector<int64_t> shift = p.shifts();
  parallel_for(g.n, 1, [&](int64_t n0, int64_t n1) {
    float* xb = thread_scratch(0, size_t(p.bordered_floats()));
    float* flat = thread_scratch(1, size_t(round_up(p.cout, OB) * p.qs()));
    std::fill_n(xb, p.bordered_floats(), 0.f);
    for (int64_t n = n0; n < n1; ++n) {
      fill_interior(p, x + n * g.c * g.h * g.w, xb);
      correlate(p, shift, xb, wpk.data(), flat);
      write_out(p, flat, b, y + n * g.o * g.oh * g.ow);
    }
  });
}

template <typename T>
void direct_backward(const Conv2dGeometry& g, const T* x, const float* w, const T* gy, T* gx,
                     float* gw) {
  const Plan fwd = forward_plan(g);
  const int64_t taps = fwd.taps(), d = g.dilation;
  // The input gradient: the output gradient, bordered by (k - 1) * d - pad, correlated with the
  // kernel flipped in both axes and with input and output channels swapped.
  const Plan bwd{g.o,  g.oh, g.ow, (g.kh - 1) * d - g.pad, (g.kw - 1) * d - g.pad, g.c,
                 g.kh, g.kw, d};
  std::vector<float> wpk;
  if (gx)
    pack_weights(
        bwd,
        [&](int64_t ci, int64_t o, int64_t t) { return w[(o * g.c + ci) * taps + (taps - 1 - t)]; },
        wpk);
  const std::vector<int64_t> bwd_shift = bwd.shifts();
  const WeightGradLayout lay(fwd);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), g.n));
  std::vector<float> parts(gw ? size_t(threads * lay.jp * lay.op) : 0, 0.f);
  const bool nested = in_region();  // then parallel_for runs serially on this thread
  parallel_for(g.n, 1, [&](int64_t n0, int64_t n1) {
    const int t = nested ? 0 : region_thread();
    float* xb = nullptr;
    float* gyT = nullptr;
    std::vector<const float*> xs;
    if (gw) {
      xb = thread_scratch(0, size_t(fwd.bordered_floats()));
      gyT = thread_scratch(1, size_t(fwd.q() * lay.op));
      std::fill_n(xb, fwd.bordered_floats(), 0.f);
      std::fill_n(gyT, fwd.q() * lay.op, 0.f);
      xs = column_inputs(fwd, lay, xb);
    }
    float* gyb = nullptr;
    float* flat = nullptr;
    if (gx) {
      gyb = thread_scratch(2, size_t(bwd.bordered_floats()));
      flat = thread_scratch(3, size_t(round_up(bwd.cout, OB) * bwd.qs()));
      std::fill_n(gyb, bwd.bordered_floats(), 0.f);
    }
    for (int64_t n = n0; n < n1; ++n) {
      const T* gyn = gy + n * g.o * g.oh * g.ow;
      if (gw) {
        fill_interior(fwd, x + n * g.c * g.h * g.w, xb);
        transpose_grad(fwd, lay.op, gyn, gyT);
        weight_grad(fwd, lay, xs, gyT, parts.data() + size_t(t) * lay.jp * lay.op);
      }
      if (gx) {
        fill_interior(bwd, gyn, gyb);
        correlate(bwd, bwd_shift, gyb, wpk.data(), flat);
        write_out(bwd, flat, nullptr, gx + n * g.c * g.h * g.w);
      }
    }
  });
  if (gw) {
    const int64_t j_real = g.c * taps;
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t j = 0; j < j_real; ++j) {
        float s = 0.f;
        for (int t = 0; t < threads; ++t) s += parts[size_t((t * lay.jp + j) * lay.op + o)];
        gw[o * j_real + j] = s;
      }
  }
}

}  // namespace

void conv2d_direct_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                           void* y, DType dtype) {
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    direct_forward(g, static_cast<const T*>(x), w, b, static_cast<T*>(y));
  });
}

void conv2d_direct_backward(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                            void* gx, float* gw, DType dtype) {
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    direct_backward(g, static_cast<const T*>(x), w, static_cast<const T*>(gy), static_cast<T*>(gx),
                    gw);
  });
}

}  // namespace galley::kernels::cpu
