// Batch normalisation on the host: the per-channel statistics in one pass, the normalisation
// (with the affine transform and ReLU) in one more, and the backward in two (the per-channel
// sums of the gradient and of gradient x centred input, then the input gradient; with planes of
// at least kLongPlaneBytes and a channel for every thread, both passes of one channel before
// the next, so that the second finds the channel's planes in cache).
//
// Two layouts: with spatial positions (inner > 1) a block is a run of whole images, read in
// memory order (a channel's planes are C * inner elements apart: walking one channel through
// the batch reads 7x7 planes as three cache lines every 12 KiB); without them ([N, C],
// inner == 1) a block is a run of rows, each vectorised over the channels. A block holds about
// kBlockElems elements whatever the thread count; threads take whole blocks and the blocks of a
// channel are added in block order, so the statistics and the weight and bias gradients have the
// same bits for any number of threads.
#include "kernels/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "galley/half.h"
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"
#include "kernels/unary_math.h"

namespace galley::kernels::cpu {
namespace {

constexpr int64_t kBlockElems = 1 << 14;
// Planes of at least this many bytes (512 float32 elements) are long enough to be read a channel
// at a time: the backward then takes both its passes over a channel while the channel is in cache.
// Shorter planes are read in memory order, twice. In bytes, not elements: resnet's 28x28 planes
// of bfloat16 (1.5 KiB) ran 1.08x forward and 1.07x backward in memory order (AMD Zen 4, two
// threads, batch 64), where a channel's 64 planes, each a short run 25 KiB from the next, left
// the prefetchers too little to follow.
constexpr int64_t kLongPlaneBytes = 2048;

// Whether planes of `inner` elements of T are long (kLongPlaneBytes).
template <typename T>
bool long_planes(int64_t inner) {
  return inner * int64_t(sizeof(T)) >= kLongPlaneBytes;
}

// Up to kStageBlock elements of T as float32: the data itself for float, else a widened copy.
template <typename T>
struct Staged {
  float buf[kStageBlock];
  const float* load(const T* p, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      return p;
    } else {
      to_float(p, buf, n);
      return buf;
    }
  }
};

// Where a block of float32 results for `o` goes before it is stored: `o` itself for float.
template <typename T>
struct Output {
  float buf[kStageBlock];
  float* at(T* o) {
    if constexpr (std::is_same_v<T, float>)
      return o;
    else
      return buf;
  }
  void store(T* o, int64_t n) {
    if constexpr (!std::is_same_v<T, float>) from_float(buf, o, n);
  }
};

// s += sum of u_j and q += sum of u_j (b_j - sb) with u_j = a_j - sa, for j < m
// (m <= kStageBlock): in float32 vector lanes (a fixed order for a given m and build), then in
// double.
inline void add_sums(int64_t m, const float* a, float sa, const float* b, float sb, double& s,
                     double& q) {
  float fs = 0.f, fq = 0.f;
#pragma omp simd reduction(+ : fs, fq)
  for (int64_t j = 0; j < m; ++j) {
    const float u = a[j] - sa;
    fs += u;
    fq += u * (b[j] - sb);
  }
  s += fs;
  q += fq;
}

#if defined(__AVX512BW__)
// float32 and bfloat16 planes (inner > 1) in AVX-512 registers, 16 elements a vector and the tail
// masked, the incoming gradient masked by the ReLU on the fly, instead of staged through float32
// buffers: a bfloat16 BatchNorm then moves half the bytes of a float32 one without paying for it
// in conversions (kernels/cpu/bf16_avx512.h); the sums keep add_sums's blocks.
template <typename T>
constexpr bool kInRegisters = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;

// Where the forward's ReLU let its output through: !(y <= 0) read from y (a NaN passes, as in
// PyTorch's threshold_backward), or, for float32 planes, the same test of the forward's own
// t = x * scale + shift recomputed from x (the same fmadd on the same values as affine_avx512, so
// the same bits and sign), which spares the backward a read of y.
struct ReluMask {
  bool from_x = false;
  __m512 scale = _mm512_setzero_ps(), shift = _mm512_setzero_ps();
};

// The incoming gradient g, zero where the ReLU stopped the forward's output (y given, or
// relu.from_x with x's values fx); g itself without either.
template <typename T>
inline __m512 masked_grad(const T* g, const T* y, __mmask16 m, __m512 fx, const ReluMask& relu) {
  const __m512 fg = load_as_f32(g, m);
  if (relu.from_x)
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_fmadd_ps(fx, relu.scale, relu.shift),
                                                  _mm512_setzero_ps(), _CMP_NLE_UQ),
                               fg);
  if (!y) return fg;
  return _mm512_maskz_mov_ps(
      _mm512_cmp_ps_mask(load_as_f32(y, m), _mm512_setzero_ps(), _CMP_NLE_UQ), fg);
}

// s += sum of u and q += sum of u w over n elements, with (u, w) = uw(j, m) for the 16 elements
// from j (lanes m, none past n; u zero outside them): per block of kStageBlock elements in
// float32 lanes, two vectors at a time on two chains of additions, then in double.
template <typename UW>
void lane_sums(int64_t n, UW uw, double& s, double& q) {
  for (int64_t i = 0; i < n; i += kStageBlock) {
    const int64_t end = std::min(n, i + kStageBlock);
    __m512 s0 = _mm512_setzero_ps(), q0 = s0, s1 = s0, q1 = s0;
    for (int64_t j = i; j < end; j += 32) {
      const auto [u0, w0] = uw(j, lanes(end - j));
      const auto [u1, w1] = uw(j + 16, end - j > 16 ? lanes(end - j - 16) : __mmask16(0));
      s0 = _mm512_add_ps(s0, u0);
      q0 = _mm512_fmadd_ps(u0, w0, q0);
      s1 = _mm512_add_ps(s1, u1);
      q1 = _mm512_fmadd_ps(u1, w1, q1);
    }
    s += _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    q += _mm512_reduce_add_ps(_mm512_add_ps(q0, q1));
  }
}

// The statistics' sums of a plane: s += sum of u and q += sum of u^2, u = p_j - sh.
template <typename T>
void square_sums_avx512(const T* p, int64_t n, float sh, double& s, double& q) {
  const __m512 vsh = _mm512_set1_ps(sh);
  lane_sums(
      n,
      [&](int64_t j, __mmask16 m) {
        const __m512 u = _mm512_maskz_sub_ps(m, load_as_f32(p + j, m), vsh);
        return std::pair{u, u};
      },
      s, q);
}

// The backward's sums of a plane: s += sum of g and q += sum of g (x - mean), g the incoming
// gradient masked by the ReLU (from y when given, or from x), written to `masked` when given.
template <typename T>
void grad_sums_avx512(const T* g, const T* y, const T* x, float mean, int64_t n, double& s,
                      double& q, const ReluMask& relu, T* masked) {
  const __m512 vmean = _mm512_set1_ps(mean);
  auto sums = [&](auto grad) {
    lane_sums(
        n,
        [&](int64_t j, __mmask16 m) {
          const __m512 fx = load_as_f32(x + j, m);
          const __m512 fg = grad(j, m, fx);
          if (masked) store_from_f32(masked + j, fg, m);
          return std::pair{fg, _mm512_sub_ps(fx, vmean)};
        },
        s, q);
  };
  if (relu.from_x)
    sums([&](int64_t j, __mmask16 m, __m512 fx) {
      return masked_grad(g + j, static_cast<const T*>(nullptr), m, fx, relu);
    });
  else if (y)
    sums([&](int64_t j, __mmask16 m, __m512 fx) { return masked_grad(g + j, y + j, m, fx, {}); });
  else
    sums([&](int64_t j, __mmask16 m, __m512) { return load_as_f32(g + j, m); });
}
#endif

// The partial sums of the blocks, kept between calls on the calling thread.
std::vector<double>& partials() {
  thread_local std::vector<double> p;
  return p;
}

// The images of a block of planes (inner > 1): about kBlockElems elements.
int64_t images_per_block(BatchNormGeometry g) {
  return std::clamp<int64_t>(kBlockElems / (g.channels * g.inner), 1, g.outer);
}

// Two sums per channel into out[c] and out[C + c], split into blocks by the shape alone:
//  - inner > 1: plane(o, c, s, q) adds the plane of image o and channel c to s and q; a block's
//    images go front to back, each through every channel, into a per-channel double of the
//    block, and the blocks are added in order;
//  - inner == 1: rows(o0, o1, s, q) adds rows [o0, o1) of every channel to s[c] and q[c].
template <typename Plane, typename Rows>
void channel_sums(BatchNormGeometry g, Plane plane, Rows rows, double* out) {
  const int64_t C = g.channels;
  std::vector<double>& part = partials();
  if (g.inner > 1) {
    const int64_t per_block = images_per_block(g);
    const int64_t blocks = (g.outer + per_block - 1) / per_block;
    part.assign(size_t(2 * C * blocks), 0.0);
    parallel_balanced(blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        double* s = &part[size_t(2 * C * b)];
        for (int64_t o = b * per_block; o < std::min(g.outer, (b + 1) * per_block); ++o)
          for (int64_t c = 0; c < C; ++c) plane(o, c, s[c], s[C + c]);
      }
    });
    std::fill(out, out + 2 * C, 0.0);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t c = 0; c < 2 * C; ++c) out[c] += part[size_t(2 * C * b + c)];
    return;
  }
  const int64_t per_block = std::clamp<int64_t>(kBlockElems / C, 1, g.outer);
  const int64_t blocks = (g.outer + per_block - 1) / per_block;
  part.assign(size_t(2 * C * blocks), 0.0);
  parallel_balanced(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * per_block;
      rows(o0, std::min(g.outer, o0 + per_block), &part[2 * C * b], &part[2 * C * b + C]);
    }
  });
  std::fill(out, out + 2 * C, 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < 2 * C; ++c) out[c] += part[2 * C * b + c];
}

// channel_sums' two sums of channel c alone (planes of inner > 1), over its blocks of images in
// its order, so with its bits: for the passes that take a channel at a time.
template <typename Plane>
void one_channel_sums(BatchNormGeometry g, int64_t c, Plane plane, double& s, double& q) {
  const int64_t per_block = images_per_block(g);
  s = 0, q = 0;
  for (int64_t o0 = 0; o0 < g.outer; o0 += per_block) {
    double bs = 0, bq = 0;
    for (int64_t o = o0; o < std::min(g.outer, o0 + per_block); ++o) plane(o, c, bs, bq);
    s += bs, q += bq;
  }
}

// A per-call array of float32, kept between calls on the calling thread.
float* channel_scratch(int slot, int64_t n) {
  return thread_scratch(slot, size_t(n));
}

// Adds the plane of x (inner elements) shifted by sh to s and (squared) to q.
template <typename T>
void stats_plane(const T* p, int64_t inner, float sh, double& s, double& q) {
#if defined(__AVX512BW__)
  if constexpr (kInRegisters<T>) {
    square_sums_avx512(p, inner, sh, s, q);
    return;
  }
#endif
  Staged<T> sx;
  for (int64_t i = 0; i < inner; i += kStageBlock) {
    const int64_t m = std::min(kStageBlock, inner - i);
    const float* f = sx.load(p + i, m);
    add_sums(m, f, sh, f, sh, s, q);
  }
}

// f(r, r % C) for the planes r in [r0, r1) of a [N, C, inner] tensor, the channel counted
// along rather than divided out plane by plane (a division costs as much as a 7x7 plane's
// normalisation).
template <typename F>
void each_plane(int64_t r0, int64_t r1, int64_t C, F&& f) {
  for (int64_t r = r0, c = r0 % C; r < r1; ++r) {
    f(r, c);
    if (++c == C) c = 0;
  }
}

// Channel c's mean and biased variance from its sums s and q of values shifted by sh (n of
// them), and its running update.
void finish_stats(int64_t c, double s, double q, float sh, double n, BatchNormRunning running,
                  float* mean, float* var) {
  const double ms = s / n;
  const double v = std::max(0.0, q / n - ms * ms);
  mean[c] = float(sh + ms);
  var[c] = float(v);
  if (running.mean) {
    const double m = running.momentum;
    running.mean[c] = float((1 - m) * running.mean[c] + m * mean[c]);
    running.var[c] = float((1 - m) * running.var[c] + m * v * n / std::max(n - 1, 1.0));
  }
}

template <typename T>
void stats(const T* x, BatchNormGeometry g, BatchNormRunning running, float* mean, float* var) {
  const int64_t C = g.channels, inner = g.inner;
  // Sums of x - shift[c], shift[c] the channel's first element: no cancellation for data far
  // from zero.
  float* shift = channel_scratch(0, C);
  for (int64_t c = 0; c < C; ++c) shift[c] = float(x[c * inner]);
  std::vector<double> sums(size_t(2 * C));
  channel_sums(
      g,
      [&](int64_t o, int64_t c, double& s, double& q) {
        stats_plane(x + (o * C + c) * inner, inner, shift[c], s, q);
      },
      [&](int64_t o0, int64_t o1, double* s, double* q) {
        Staged<T> sx;
        for (int64_t o = o0; o < o1; ++o)
          for (int64_t c0 = 0; c0 < C; c0 += kStageBlock) {
            const int64_t m = std::min(kStageBlock, C - c0);
            const float* f = sx.load(x + o * C + c0, m);
            for (int64_t j = 0; j < m; ++j) {
              const double d = f[j] - shift[c0 + j];
              s[c0 + j] += d;
              q[c0 + j] += d * d;
            }
          }
      },
      sums.data());
  const double n = double(g.outer) * double(inner);
  for (int64_t c = 0; c < C; ++c)
    finish_stats(c, sums[c], sums[C + c], shift[c], n, running, mean, var);
}

// scale = weight / sqrt(var + eps), shift = bias - mean * scale for channel c.
void affine_of_channel(BatchNormParams p, int64_t c, float& scale, float& shift) {
  const double invstd = 1.0 / std::sqrt(double(p.var[c]) + p.eps);
  const float a = float(invstd * (p.weight ? p.weight[c] : 1.f));
  scale = a;
  shift = (p.bias ? p.bias[c] : 0.f) - p.mean[c] * a;
}

// scale[c], shift[c] = affine_of_channel for every channel.
void affine_of(BatchNormParams p, int64_t C, float* scale, float* shift) {
  for (int64_t c = 0; c < C; ++c) affine_of_channel(p, c, scale[c], shift[c]);
}

// The forward's t = v a + b, with one rounding where the build has FMA (as its vector loops, and
// affine_avx512), so that the backward can recompute the ReLU's decision with the forward's bits
// and affine_add has batch_norm's. Every scalar form goes through it: left to the compiler,
// v * a + b is contracted at -O2 and not at -O1, and the forms' bits would part in one build.
inline float affine_t(float v, float a, float b) {
#if defined(__FMA__)
  return std::fma(v, a, b);
#else
  return v * a + b;
#endif
}

template <bool kRelu>
inline float affine(float v, float a, float b) {
  const float t = affine_t(v, a, b);
  if constexpr (kRelu) return unary_math::relu(t);
  return t;
}

// affine<kRelu> with the residual r added to the normalised value rounded to T (as batch_norm's
// output, then add_'s sum in float32).
template <bool kRelu, typename T>
inline float affine_add(float v, float a, float b, float r) {
  const float t = float(T(affine_t(v, a, b))) + r;
  if constexpr (kRelu) return unary_math::relu(t);
  return t;
}

#if defined(__AVX512BW__)
// v rounded to T and widened back (v itself for float32).
template <typename T>
inline __m512 rounded_to(__m512 v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16));
}

// affine<kRelu> over n elements, or affine_add<kRelu> with the residual r when given: two
// vectors at a time (for bfloat16 one rounding instruction for both), the tail masked.
template <bool kRelu, typename T>
void affine_avx512(const T* x, int64_t n, float a, float b, const T* r, T* y) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  auto t_of = [&](int64_t j, __mmask16 m) {
    __m512 t = _mm512_fmadd_ps(load_as_f32(x + j, m), va, vb);
    if (r) t = _mm512_add_ps(rounded_to<T>(t), load_as_f32(r + j, m));
    if constexpr (kRelu)  // as relu: NaN stays NaN
      t = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(t, _mm512_setzero_ps(), _CMP_LE_OQ),
                             _mm512_setzero_ps());
    return t;
  };
  int64_t j = 0;
  for (; j + 32 <= n; j += 32)
    store_from_f32_x2(y + j, t_of(j, __mmask16(0xffff)), t_of(j + 16, __mmask16(0xffff)));
  for (; j < n; j += 16) {
    const __mmask16 m = lanes(n - j);
    store_from_f32(y + j, t_of(j, m), m);
  }
}
#endif

// One plane of `inner` elements normalised with the channel's a and b (and the residual r).
template <bool kRelu, typename T>
void normalize_plane(const T* x, int64_t inner, float a, float b, const T* r, T* y) {
#if defined(__AVX512BW__)
  if constexpr (kInRegisters<T>) {
    affine_avx512<kRelu>(x, inner, a, b, r, y);
    return;
  }
#endif
  if (r)
    zip_n(x, 1, r, 1, y, inner,
          [a, b](float v, float rv) { return affine_add<kRelu, T>(v, a, b, rv); });
  else
    map_n(x, y, inner, [a, b](float v) { return affine<kRelu>(v, a, b); });
}

template <typename T, bool kRelu>
void forward(const T* x, BatchNormGeometry g, BatchNormParams p, const T* res, T* y) {
  const int64_t C = g.channels, inner = g.inner;
  float* scale = channel_scratch(0, 2 * C);
  float* shift = scale + C;
  affine_of(p, C, scale, shift);
  if (inner > 1) {
    parallel_balanced(g.outer * C, std::max<int64_t>(1, kElementwiseGrain / inner),
                      [&](int64_t r0, int64_t r1) {
                        each_plane(r0, r1, C, [&](int64_t r, int64_t c) {
                          normalize_plane<kRelu>(x + r * inner, inner, scale[c], shift[c],
                                                 res ? res + r * inner : nullptr, y + r * inner);
                        });
                      });
    return;
  }
  parallel_balanced(
      g.outer, std::max<int64_t>(1, kElementwiseGrain / C), [&](int64_t o0, int64_t o1) {
        Staged<T> sx, sr;
        Output<T> out;
        for (int64_t o = o0; o < o1; ++o)
          for (int64_t c0 = 0; c0 < C; c0 += kStageBlock) {
            const int64_t m = std::min(kStageBlock, C - c0);
            const float* f = sx.load(x + o * C + c0, m);
            float* r = out.at(y + o * C + c0);
            if (res) {
              const float* fr = sr.load(res + o * C + c0, m);
              for (int64_t j = 0; j < m; ++j)
                r[j] = affine_add<kRelu, T>(f[j], scale[c0 + j], shift[c0 + j], fr[j]);
            } else {
              for (int64_t j = 0; j < m; ++j)
                r[j] = affine<kRelu>(f[j], scale[c0 + j], shift[c0 + j]);
            }
            out.store(y + o * C + c0, m);
          }
      });
}

// stats, then forward with the batch's statistics (p's mean and var are replaced by mean and
// var). Long planes with a channel for every thread go a channel at a time: its sums over the
// blocks of channel_sums in its order (so the same bits), then its planes normalised while they
// are still in cache, where the two passes would read x from memory twice.
template <typename T, bool kRelu>
void stats_forward(const T* x, BatchNormGeometry g, BatchNormRunning running, float* mean,
                   float* var, BatchNormParams p, const T* res, T* y) {
  const int64_t C = g.channels, inner = g.inner;
  p.mean = mean, p.var = var;
  if (!long_planes<T>(inner) || C < num_threads()) {
    stats(x, g, running, mean, var);
    forward<T, kRelu>(x, g, p, res, y);
    return;
  }
  const double n = double(g.outer) * double(inner);
  parallel_balanced(C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float sh = float(x[c * inner]);  // as stats' shift
      double s, q;
      one_channel_sums(
          g, c,
          [&](int64_t o, int64_t ch, double& ps, double& pq) {
            stats_plane(x + (o * C + ch) * inner, inner, sh, ps, pq);
          },
          s, q);
      finish_stats(c, s, q, sh, n, running, mean, var);
      float a, b;
      affine_of_channel(p, c, a, b);
      for (int64_t o = 0; o < g.outer; ++o) {
        const int64_t base = (o * C + c) * inner;
        normalize_plane<kRelu>(x + base, inner, a, b, res ? res + base : nullptr, y + base);
      }
    }
  });
}

// Where the forward's ReLU let its output through, for a plane of one channel: !(y <= 0) read from
// y, or (from_x) the same test of the forward's t = affine_t(x, scale, shift) recomputed from x,
// which spares the backward a read of y.
struct ReluFromX {
  bool from_x = false;
  float scale = 0.f, shift = 0.f;
};

// The incoming gradient masked by the forward's ReLU: by !(y <= 0) when y is given, by x's n values
// fx through relu when relu.from_x.
template <typename T>
struct MaskedGrad {
  Staged<T> g, y;
  const float* load(const T* gp, const T* yp, int64_t n, float* masked, const float* fx = nullptr,
                    ReluFromX relu = {}) {
    const float* fg = g.load(gp, n);
    if (relu.from_x) {
      for (int64_t j = 0; j < n; ++j)
        masked[j] = unary_math::relu_backward(fg[j], affine_t(fx[j], relu.scale, relu.shift));
      return masked;
    }
    if (!yp) return fg;
    const float* fy = y.load(yp, n);
    for (int64_t j = 0; j < n; ++j) masked[j] = unary_math::relu_backward(fg[j], fy[j]);
    return masked;
  }
};

// The masked gradient fg (n float32 values of T, so exact) into o: the residual's gradient.
template <typename T>
void store_masked(const float* fg, int64_t n, T* o) {
  for (int64_t j = 0; j < n; ++j) o[j] = static_cast<T>(fg[j]);
}

template <typename T>
void backward(const T* gy, const T* x, const T* y, BatchNormGeometry g, BatchNormParams p,
              bool training, bool residual_added, T* gx, float* gweight, float* gbias, T* gres) {
  const int64_t C = g.channels, inner = g.inner;
  const double n = double(g.outer) * double(inner);
  // Per channel: the mean, k (the coefficient of the centred input), the mean gradient and
  // weight / std; gx = (g - mean_g - (x - mean) k) * a, with k = mean_g = 0 for fixed statistics.
  float* coef = channel_scratch(1, 4 * C);
  float *mean = coef, *k = coef + C, *mg = coef + 2 * C, *a = coef + 3 * C;
  std::vector<double> inv(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    inv[c] = 1.0 / std::sqrt(double(p.var[c]) + p.eps);
    mean[c] = p.mean[c];
    a[c] = float(inv[c] * (p.weight ? p.weight[c] : 1.f));
    k[c] = mg[c] = 0.f;
  }
  const bool need_sums = (training && gx) || gweight || gbias;
  // float32 planes after a ReLU: its mask from x and the forward's affine, not from y (which a
  // residual added in the forward makes the only source).
  const bool relu_from_x = y && batch_norm_relu_mask_from_x(dtype_of<T>::value, g, residual_added);
  float* fwd_affine = nullptr;
  if (relu_from_x) {
    fwd_affine = channel_scratch(2, 2 * C);
    affine_of(p, C, fwd_affine, fwd_affine + C);
  }
  const T* y_read = relu_from_x ? nullptr : y;  // what the plane paths read of y
  auto relu_of = [&](int64_t c) {               // channel c's ReLU, from x where it is taken from x
    return relu_from_x ? ReluFromX{true, fwd_affine[c], fwd_affine[C + c]} : ReluFromX{};
  };
#if defined(__AVX512BW__)
  auto relu_mask = [&](int64_t c) {  // relu_of(c) in registers
    const ReluFromX f = relu_of(c);
    ReluMask r;
    r.from_x = f.from_x, r.scale = _mm512_set1_ps(f.scale), r.shift = _mm512_set1_ps(f.shift);
    return r;
  };
  // The residual's gradient written by the sums' pass, and read back (masked already) by the
  // input gradient's in place of gy and y.
  const bool gres_first = kInRegisters<T> && gres && need_sums;
#endif
  // Channel c's sums (of the gradient, and of gradient x centred input) -> the weight and bias
  // gradients and the coefficients of its input gradient.
  auto finish_channel = [&](int64_t c, double sg, double sgx) {
    if (gweight) gweight[c] = float(sgx * inv[c]);
    if (gbias) gbias[c] = float(sg);
    if (training) {
      k[c] = float(sgx * inv[c] * inv[c] / n);
      mg[c] = float(sg / n);
    }
  };
  // Adds the plane of image o and channel c to the sums.
  auto plane_sums = [&](int64_t o, int64_t c, double& s, double& q) {
    const int64_t base = (o * C + c) * inner;
    const float mc = mean[c];
#if defined(__AVX512BW__)
    if constexpr (kInRegisters<T>) {
      grad_sums_avx512<T>(gy + base, y_read ? y_read + base : nullptr, x + base, mc, inner, s, q,
                          relu_mask(c), gres_first ? gres + base : nullptr);
      return;
    }
#endif
    MaskedGrad<T> sg;
    Staged<T> sx;
    float masked[kStageBlock];
    const ReluFromX relu = relu_of(c);
    for (int64_t i = 0; i < inner; i += kStageBlock) {
      const int64_t m = std::min(kStageBlock, inner - i);
      const float* fx = sx.load(x + base + i, m);
      const float* fg =
          sg.load(gy + base + i, y_read ? y_read + base + i : nullptr, m, masked, fx, relu);
      add_sums(m, fg, 0.f, fx, mc, s, q);
    }
  };
  // For fixed statistics (not `training`) k and mg are zero and the gradient is g * a, as
  // PyTorch's: x takes no part, so a NaN or infinite x keeps a finite gradient ((x - mean) * 0
  // would be NaN); the same bits as the full formula for finite x.
  auto dx = [&](const float* fg, const float* fx, int64_t m, int64_t c0, int64_t step, float* r) {
    if (!training) {
      for (int64_t j = 0; j < m; ++j) r[j] = fg[j] * a[c0 + j * step];
      return;
    }
    for (int64_t j = 0; j < m; ++j) {
      const int64_t c = c0 + j * step;
      r[j] = (fg[j] - mg[c] - (fx[j] - mean[c]) * k[c]) * a[c];
    }
  };
  // The input gradient of plane r (image r / C, channel c = r % C).
  auto plane_dx = [&](int64_t r, int64_t c) {
#if defined(__AVX512BW__)
    if constexpr (kInRegisters<T>) {
      const int64_t base = r * inner;
      const __m512 vmg = _mm512_set1_ps(mg[c]), vmean = _mm512_set1_ps(mean[c]),
                   vk = _mm512_set1_ps(k[c]), va = _mm512_set1_ps(a[c]);
      const ReluMask relu = relu_mask(c);
      if (!gx && gres_first) return;
      // The vector at j's gradient masked by the ReLU (x's values fx), and its input gradient
      // (g - mg - (x - mean) k) a, in the staged path's order.
      auto grad_at = [&](int64_t j, __mmask16 m, __m512 fx) {
        if (gres_first) return load_as_f32(gres + base + j, m);
        return masked_grad(gy + base + j, y_read ? y_read + base + j : nullptr, m, fx, relu);
      };
      auto dx_of = [&](__m512 fg, __m512 fx) {
        if (!training) return _mm512_mul_ps(fg, va);  // as dx: x takes no part
        const __m512 d =
            _mm512_sub_ps(_mm512_sub_ps(fg, vmg), _mm512_mul_ps(_mm512_sub_ps(fx, vmean), vk));
        return _mm512_mul_ps(d, va);
      };
      const bool write_gres = gres && !gres_first;
      int64_t j = 0;
      for (; j + 32 <= inner; j += 32) {  // two vectors at a time (one rounding for bfloat16)
        const __m512 fx0 = load_as_f32(x + base + j), fx1 = load_as_f32(x + base + j + 16);
        const __m512 fg0 = grad_at(j, __mmask16(0xffff), fx0),
                     fg1 = grad_at(j + 16, __mmask16(0xffff), fx1);
        if (write_gres) store_from_f32_x2(gres + base + j, fg0, fg1);
        if (gx) store_from_f32_x2(gx + base + j, dx_of(fg0, fx0), dx_of(fg1, fx1));
      }
      for (; j < inner; j += 16) {
        const __mmask16 m = lanes(inner - j);
        const __m512 fx = load_as_f32(x + base + j, m);
        const __m512 fg = grad_at(j, m, fx);
        if (write_gres) store_from_f32(gres + base + j, fg, m);
        if (gx) store_from_f32(gx + base + j, dx_of(fg, fx), m);
      }
      return;
    }
#endif
    MaskedGrad<T> sg;
    Staged<T> sx;
    Output<T> out;
    float masked[kStageBlock];
    const ReluFromX relu = relu_of(c);
    for (int64_t i = 0; i < inner; i += kStageBlock) {
      const int64_t m = std::min(kStageBlock, inner - i), base = r * inner + i;
      const float* fx = sx.load(x + base, m);
      const float* fg = sg.load(gy + base, y_read ? y_read + base : nullptr, m, masked, fx, relu);
      if (gres) store_masked(fg, m, gres + base);
      if (!gx) continue;
      dx(fg, fx, m, c, 0, out.at(gx + base));
      out.store(gx + base, m);
    }
  };
  if (long_planes<T>(inner) && (gx || gres) && C >= num_threads()) {
    // Long planes: one channel at a time, its sums, then its input gradient while its planes
    // are still in the cache (the two-pass form reads every tensor from memory twice). The sums
    // run over the blocks of channel_sums in its order, so the bits are the same.
    parallel_balanced(C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        if (need_sums) {
          double s, q;
          one_channel_sums(g, c, plane_sums, s, q);
          finish_channel(c, s, q);
        }
        for (int64_t o = 0; o < g.outer; ++o) plane_dx(o * C + c, c);
      }
    });
    return;
  }
  if (need_sums) {
    std::vector<double> sums(size_t(2 * C));
    channel_sums(
        g, plane_sums,
        [&](int64_t o0, int64_t o1, double* s, double* q) {
          MaskedGrad<T> sg;
          Staged<T> sx;
          float masked[kStageBlock];
          for (int64_t o = o0; o < o1; ++o)
            for (int64_t c0 = 0; c0 < C; c0 += kStageBlock) {
              const int64_t m = std::min(kStageBlock, C - c0), base = o * C + c0;
              const float* fg = sg.load(gy + base, y ? y + base : nullptr, m, masked);
              const float* fx = sx.load(x + base, m);
              for (int64_t j = 0; j < m; ++j) {
                s[c0 + j] += fg[j];
                q[c0 + j] += double(fg[j]) * (fx[j] - mean[c0 + j]);
              }
            }
        },
        sums.data());
    for (int64_t c = 0; c < C; ++c) finish_channel(c, sums[c], sums[C + c]);
  }
  if (!gx && !gres) return;
  if (inner > 1) {
    parallel_balanced(g.outer * C, std::max<int64_t>(1, kElementwiseGrain / inner),
                      [&](int64_t r0, int64_t r1) { each_plane(r0, r1, C, plane_dx); });
    return;
  }
  parallel_balanced(g.outer, std::max<int64_t>(1, kElementwiseGrain / C),
                    [&](int64_t o0, int64_t o1) {
                      MaskedGrad<T> sg;
                      Staged<T> sx;
                      Output<T> out;
                      float masked[kStageBlock];
                      for (int64_t o = o0; o < o1; ++o)
                        for (int64_t c0 = 0; c0 < C; c0 += kStageBlock) {
                          const int64_t m = std::min(kStageBlock, C - c0), base = o * C + c0;
                          const float* fg = sg.load(gy + base, y ? y + base : nullptr, m, masked);
                          if (gres) store_masked(fg, m, gres + base);
                          if (!gx) continue;
                          dx(fg, sx.load(x + base, m), m, c0, 1, out.at(gx + base));
                          out.store(gx + base, m);
                        }
                    });
}

}  // namespace

void batch_norm_stats(DType dtype, const void* x, BatchNormGeometry g, BatchNormRunning running,
                      float* mean, float* var) {
  if (g.outer * g.channels * g.inner <= 0) return;
  dispatch_floating(dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    stats(static_cast<const T*>(x), g, running, mean, var);
  });
}

void batch_norm_forward(DType dtype, const void* x, BatchNormGeometry g, BatchNormParams p,
                        bool relu, void* y, const void* residual) {
  if (g.outer * g.channels * g.inner <= 0) return;
  dispatch_floating(dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* r = static_cast<const T*>(residual);
    if (relu)
      forward<T, true>(static_cast<const T*>(x), g, p, r, static_cast<T*>(y));
    else
      forward<T, false>(static_cast<const T*>(x), g, p, r, static_cast<T*>(y));
  });
}

void batch_norm_train_forward(DType dtype, const void* x, BatchNormGeometry g,
                              BatchNormRunning running, float* mean, float* var, BatchNormParams p,
                              bool relu, void* y, const void* residual) {
  if (g.outer * g.channels * g.inner <= 0) return;
  dispatch_floating(dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    const T* r = static_cast<const T*>(residual);
    if (relu)
      stats_forward<T, true>(px, g, running, mean, var, p, r, static_cast<T*>(y));
    else
      stats_forward<T, false>(px, g, running, mean, var, p, r, static_cast<T*>(y));
  });
}

void batch_norm_backward(DType dtype, const void* gy, const void* x, const void* y,
                         BatchNormGeometry g, BatchNormParams p, bool training, void* gx,
                         float* gweight, float* gbias, bool residual_added, void* gresidual) {
  if (g.outer * g.channels * g.inner <= 0) return;
  dispatch_floating(dtype, "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward(static_cast<const T*>(gy), static_cast<const T*>(x), static_cast<const T*>(y), g, p,
             training, residual_added, static_cast<T*>(gx), gweight, gbias,
             static_cast<T*>(gresidual));
  });
}

}  // namespace galley::kernels::cpu
