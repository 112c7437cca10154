#include "kernels/max_pool2d.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "kernels/cpu/bf16_avx512.h"

namespace galley::kernels::cpu {
namespace {

// The common 2x2/2 window of one plane. `v > best || v != v` lets a NaN win, so NaNs propagate
// as in PyTorch. Selects, never branches: a data-dependent branch mispredicts half the time, and
// whether the compiler turns the scalar form into selects depends on flags such as -fPIC, so
// AVX-512 machines get it spelled out (16 outputs per step).
#ifdef __AVX512BW__
// A step of up to 16 outputs of a 2x2/2 window row: the outputs' lanes, and the lanes of the
// 2 * 16 inputs of each input row, split over two registers (lo, hi).
struct WindowMasks {
  __mmask16 outputs, lo, hi;
  explicit WindowMasks(int64_t left) {
    const int64_t n = std::min<int64_t>(16, left);
    outputs = static_cast<__mmask16>((1u << n) - 1);
    lo = static_cast<__mmask16>(n >= 8 ? 0xFFFF : (1u << (2 * n)) - 1);
    hi = static_cast<__mmask16>(n > 8 ? (1u << (2 * (n - 8))) - 1 : 0);
  }
};

// The winners of 16 windows from their candidates a, b (top row), c, d (bottom row): the maximum
// into y and its offset into idx, j being a's offset and w the plane's width. `v > best || v != v`
// lets a NaN win.
inline void window_winners(__m512 a, __m512 b, __m512 c, __m512 d, __m512i j, __m512i w, __m512& y,
                           __m512i& idx) {
  const __m512i one = _mm512_set1_epi32(1);
  const __mmask16 tb =
      _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
  const __mmask16 td =
      _mm512_cmp_ps_mask(d, c, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
  const __m512 ab = _mm512_mask_blend_ps(tb, a, b), cd = _mm512_mask_blend_ps(td, c, d);
  const __mmask16 t =
      (_mm512_cmp_ps_mask(cd, ab, _CMP_GT_OQ) | _mm512_cmp_ps_mask(cd, cd, _CMP_UNORD_Q)) &
      _mm512_cmp_ps_mask(ab, ab, _CMP_ORD_Q);
  const __m512i iab = _mm512_mask_add_epi32(j, tb, j, one);
  const __m512i jc = _mm512_add_epi32(j, w);
  const __m512i icd = _mm512_mask_add_epi32(jc, td, jc, one);
  y = _mm512_mask_blend_ps(t, ab, cd);
  idx = _mm512_mask_blend_epi32(t, iab, icd);
}

// The gradient g of 16 windows at their winners win: a, b (top row), c, d (bottom row) hold g
// where that candidate won, else zero (j: a's offset, w: the plane's width).
inline void window_grads(__m512 g, __m512i win, __m512i j, __m512i w, __m512& a, __m512& b,
                         __m512& c, __m512& d) {
  const __m512i one = _mm512_set1_epi32(1), jc = _mm512_add_epi32(j, w);
  a = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(win, j), g);
  b = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(win, _mm512_add_epi32(j, one)), g);
  c = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(win, jc), g);
  d = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(win, _mm512_add_epi32(jc, one)), g);
}

// T float32, or bfloat16 widened as it is loaded and its maxima stored as they are (rounding a
// value already bfloat16 changes nothing but a NaN's quiet bit, which the staged form sets too).
template <typename T>
void pool_2x2(const Pool2dGeometry& g, const T* xp, T* yp, int32_t* ip) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i w = _mm512_set1_epi32(static_cast<int32_t>(g.w));
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const T* r0 = xp + 2 * oh * g.w;
    const T* r1 = r0 + g.w;
    const int32_t base = static_cast<int32_t>(2 * oh * g.w);
    for (int64_t ow = 0; ow < g.ow; ow += 16) {
      const WindowMasks m(g.ow - ow);
      const T* p0 = r0 + 2 * ow;
      const T* p1 = r1 + 2 * ow;
      const __m512 r0lo = load_as_f32(p0, m.lo), r0hi = load_as_f32(p0 + 16, m.hi);
      const __m512 r1lo = load_as_f32(p1, m.lo), r1hi = load_as_f32(p1 + 16, m.hi);
      const __m512 a = _mm512_permutex2var_ps(r0lo, even, r0hi),
                   b = _mm512_permutex2var_ps(r0lo, odd, r0hi);
      const __m512 c = _mm512_permutex2var_ps(r1lo, even, r1hi),
                   d = _mm512_permutex2var_ps(r1lo, odd, r1hi);
      // Winner offsets inside the plane: j = base + 2 * (ow + lane), +1 for the right column,
      // +w for the lower row.
      const __m512i j =
          _mm512_add_epi32(_mm512_set1_epi32(base + static_cast<int32_t>(2 * ow)), even);
      __m512 y;
      __m512i i;
      window_winners(a, b, c, d, j, w, y, i);
      store_from_f32(yp + oh * g.ow + ow, y, m.outputs);
      _mm512_mask_storeu_epi32(ip + oh * g.ow + ow, m.outputs, i);
    }
  }
}

// Planes of few columns (8x8, 16x16: at most 8 outputs a row) would leave most of pool_2x2's
// lanes idle. Where the height and width are even and a vector's 16 outputs are whole output rows
// of one plane (16 / ow of them), those outputs' windows tile 64 contiguous inputs (the block of
// input rows 2R .. 2R + 2 * 16 / ow - 1), so a step loads the block and gathers each window's four
// candidates from it with permutes: top left, top right, bottom left, bottom right (the order
// pool_2x2 compares them in, so the same winners); the backward scatters them back into the block.
bool flat_windows(const Pool2dGeometry& g) {
  return g.k == 2 && g.stride == 2 && g.pad == 0 && g.h == 2 * g.oh && g.w == 2 * g.ow &&
         g.ow < 16 && 16 % g.ow == 0 && g.oh % (16 / g.ow) == 0;
}

struct FlatWindows {
  __m512i at;              // each output's top left input, as an offset in its block of 64
  __m512i pick[4];         // candidate k's input: its offset in the block, modulo 32 ...
  __mmask16 second[4];     // ... and whether it lies in the block's second half
  __m512i put[4];          // input 16q + i of the block: its output's lane (+16 for a right one)
  __mmask16 lower_row[4];  // ... and whether it lies in a window's lower row
  int32_t w;

  explicit FlatWindows(const Pool2dGeometry& g) : w(static_cast<int32_t>(g.w)) {
    alignas(64) int32_t a[16], pk[4][16], pt[4][16];
    const int32_t ow = static_cast<int32_t>(g.ow), offset[4] = {0, 1, w, w + 1};
    for (int32_t l = 0; l < 16; ++l) a[l] = (l / ow) * 2 * w + 2 * (l % ow);
    for (int c = 0; c < 4; ++c) {
      second[c] = 0;
      for (int32_t l = 0; l < 16; ++l) {
        const int32_t s = a[l] + offset[c];
        pk[c][l] = s % 32;
        if (s >= 32) second[c] = static_cast<__mmask16>(second[c] | 1u << l);
      }
    }
    for (int q = 0; q < 4; ++q) {
      lower_row[q] = 0;
      for (int32_t i = 0; i < 16; ++i) {
        const int32_t p = 16 * q + i, r = p / w, col = p % w;
        pt[q][i] = (r / 2) * ow + col / 2 + 16 * (col % 2);
        if (r % 2) lower_row[q] = static_cast<__mmask16>(lower_row[q] | 1u << i);
      }
    }
    at = _mm512_load_si512(a);
    for (int c = 0; c < 4; ++c) pick[c] = _mm512_load_si512(pk[c]);
    for (int q = 0; q < 4; ++q) put[q] = _mm512_load_si512(pt[q]);
  }
};

// pool_2x2 over one plane of flat_windows(g), its 16 * n outputs.
template <typename T>
void pool_flat(const FlatWindows& f, const T* xp, T* yp, int32_t* ip, int64_t n) {
  const __m512i w = _mm512_set1_epi32(f.w);
  for (int64_t v = 0; v < n; ++v) {
    const T* in = xp + 64 * v;
    const __m512 r0 = load_as_f32(in), r1 = load_as_f32(in + 16), r2 = load_as_f32(in + 32),
                 r3 = load_as_f32(in + 48);
    auto candidate = [&](int c) {
      return _mm512_mask_blend_ps(f.second[c], _mm512_permutex2var_ps(r0, f.pick[c], r1),
                                  _mm512_permutex2var_ps(r2, f.pick[c], r3));
    };
    const __m512 a = candidate(0), b = candidate(1), c = candidate(2), d = candidate(3);
    const __m512i j = _mm512_add_epi32(f.at, _mm512_set1_epi32(static_cast<int32_t>(64 * v)));
    __m512 y;
    __m512i i;
    window_winners(a, b, c, d, j, w, y, i);
    store_from_f32(yp + 16 * v, y, 0xffff);
    _mm512_storeu_si512(ip + 16 * v, i);
  }
}
#else
void pool_2x2(const Pool2dGeometry& g, const float* xp, float* yp, int32_t* ip) {
  const int32_t w = static_cast<int32_t>(g.w);
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const float* r0 = xp + 2 * oh * g.w;
    const float* r1 = r0 + g.w;
    const int32_t base = static_cast<int32_t>(2 * oh * g.w);
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const int32_t j = static_cast<int32_t>(2 * ow);
      const float a = r0[j], b = r0[j + 1], c = r1[j], d = r1[j + 1];
      const bool tb = b > a || b != b;
      const float ab = tb ? b : a;
      const bool td = d > c || d != d;
      const float cd = td ? d : c;
      const bool t = (cd > ab || cd != cd) && ab == ab;
      yp[oh * g.ow + ow] = t ? cd : ab;
      ip[oh * g.ow + ow] = base + (t ? (td ? w + j + 1 : w + j) : (tb ? j + 1 : j));
    }
  }
}
#endif

// Any window, stride and padding; padded positions never win.
void pool_generic(const Pool2dGeometry& g, const float* xp, float* yp, int32_t* ip) {
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const int64_t h0 = oh * g.stride - g.pad;
    const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + g.k, g.h);
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const int64_t w0 = ow * g.stride - g.pad;
      const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w0 + g.k, g.w);
      float best = -std::numeric_limits<float>::infinity();
      int64_t bi = hs * g.w + ws;
      for (int64_t ih = hs; ih < he; ++ih)
        for (int64_t iw = ws; iw < we; ++iw) {
          const float v = xp[ih * g.w + iw];
          if (v > best || v != v) {
            best = v;
            bi = ih * g.w + iw;
            if (v != v) ih = he, iw = we;  // a NaN wins; stop looking
          }
        }
      yp[oh * g.ow + ow] = best;
      ip[oh * g.ow + ow] = static_cast<int32_t>(bi);
    }
  }
}

// The gradient of one plane's 2x2/2 windows: each input element gets the output's gradient if
// it was the window's winner, else zero, written once (the windows tile the plane).
#ifdef __AVX512BW__
// T float32, or bfloat16 widened and rounded as pool_2x2's.
template <typename T>
void unpool_2x2(const Pool2dGeometry& g, const T* gyp, const int32_t* ip, T* gp) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  // Interleave a and b: (a0 b0 a1 b1 ... a7 b7) and (a8 b8 ... a15 b15).
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  const __m512i w = _mm512_set1_epi32(static_cast<int32_t>(g.w));
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    T* r0 = gp + 2 * oh * g.w;
    T* r1 = r0 + g.w;
    const int32_t base = static_cast<int32_t>(2 * oh * g.w);
    for (int64_t ow = 0; ow < g.ow; ow += 16) {
      const WindowMasks m(g.ow - ow);
      const __m512 v = load_as_f32(gyp + oh * g.ow + ow, m.outputs);
      const __m512i win = _mm512_maskz_loadu_epi32(m.outputs, ip + oh * g.ow + ow);
      const __m512i j =
          _mm512_add_epi32(_mm512_set1_epi32(base + static_cast<int32_t>(2 * ow)), even);
      __m512 a, b, c, d;
      window_grads(v, win, j, w, a, b, c, d);
      T* p0 = r0 + 2 * ow;
      T* p1 = r1 + 2 * ow;
      store_from_f32(p0, _mm512_permutex2var_ps(a, lo, b), m.lo);
      store_from_f32(p0 + 16, _mm512_permutex2var_ps(a, hi, b), m.hi);
      store_from_f32(p1, _mm512_permutex2var_ps(c, lo, d), m.lo);
      store_from_f32(p1 + 16, _mm512_permutex2var_ps(c, hi, d), m.hi);
    }
    // An odd width leaves a last column outside every window.
    if (g.w > 2 * g.ow) r0[g.w - 1] = r1[g.w - 1] = T(0.f);
  }
}

// unpool_2x2 over one plane of flat_windows(g), its 16 * n outputs' gradients.
template <typename T>
void unpool_flat(const FlatWindows& f, const T* gyp, const int32_t* ip, T* gp, int64_t n) {
  const __m512i w = _mm512_set1_epi32(f.w);
  for (int64_t v = 0; v < n; ++v) {
    const __m512 g = load_as_f32(gyp + 16 * v, 0xffff);
    const __m512i win = _mm512_loadu_si512(ip + 16 * v);
    const __m512i j = _mm512_add_epi32(f.at, _mm512_set1_epi32(static_cast<int32_t>(64 * v)));
    __m512 a, b, c, d;
    window_grads(g, win, j, w, a, b, c, d);
    for (int q = 0; q < 4; ++q)
      store_from_f32(gp + 64 * v + 16 * q,
                     _mm512_mask_blend_ps(f.lower_row[q], _mm512_permutex2var_ps(a, f.put[q], b),
                                          _mm512_permutex2var_ps(c, f.put[q], d)),
                     0xffff);
  }
}
#else
void unpool_2x2(const Pool2dGeometry& g, const float* gyp, const int32_t* ip, float* gp) {
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    float* r0 = gp + 2 * oh * g.w;
    float* r1 = r0 + g.w;
    const int32_t base = static_cast<int32_t>(2 * oh * g.w), w = static_cast<int32_t>(g.w);
    // Bit masks instead of selects: whether the compiler turns `?:` into branches (which
    // mispredict on random winners) depends on its mood; a mask is always branch-free and keeps
    // a NaN gradient at the winner only.
    uint32_t* q0 = reinterpret_cast<uint32_t*>(r0);
    uint32_t* q1 = reinterpret_cast<uint32_t*>(r1);
    const uint32_t* gbits = reinterpret_cast<const uint32_t*>(gyp + oh * g.ow);
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const uint32_t v = gbits[ow];
      const int32_t win = ip[oh * g.ow + ow] - base;
      const int32_t j = static_cast<int32_t>(2 * ow);
      q0[j] = v & (0u - uint32_t(win == j));
      q0[j + 1] = v & (0u - uint32_t(win == j + 1));
      q1[j] = v & (0u - uint32_t(win == w + j));
      q1[j + 1] = v & (0u - uint32_t(win == w + j + 1));
    }
    // An odd width leaves a last column outside every window.
    if (g.w > 2 * g.ow) r0[g.w - 1] = r1[g.w - 1] = 0.f;
  }
}
#endif

// One plane's gradient through its 2x2/2 windows (unpool_2x2), and zeros in the last row that an
// odd height leaves outside every window.
template <typename E>
void unpool_plane(const Pool2dGeometry& g, const E* gyp, const int32_t* ip, E* gp) {
  unpool_2x2(g, gyp, ip, gp);
  if (g.h > 2 * g.oh) std::fill_n(gp + (g.h - 1) * g.w, g.w, E(0.f));
}

int64_t plane_grain(const Pool2dGeometry& g) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(g.h * g.w, 1));
}

// f(p) for every plane p, across the threads.
template <typename F>
void each_plane(const Pool2dGeometry& g, F&& f) {
  parallel_balanced(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) f(p);
  });
}

#ifdef __AVX512BW__
// f(windows, p) for every plane p, across the threads, where flat_windows(g); false elsewhere.
template <typename F>
bool each_flat_plane(const Pool2dGeometry& g, F&& f) {
  if (!flat_windows(g)) return false;
  const FlatWindows windows(g);
  each_plane(g, [&](int64_t p) { f(windows, p); });
  return true;
}
#endif

// Whether the 2x2/2 kernels read and write T in place (float32; bfloat16 with AVX-512), rather
// than a plane staged through float32.
template <typename T>
constexpr bool kInPlace = std::is_same_v<T, float>
#ifdef __AVX512BW__
                          || std::is_same_v<T, bfloat16>
#endif
    ;

template <typename T>
void forward(const Pool2dGeometry& g, const T* x, T* y, int32_t* idx) {
  constexpr bool wide = std::is_same_v<T, float>;
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const bool fast = g.k == 2 && g.stride == 2 && g.pad == 0;
#ifdef __AVX512BW__
  if constexpr (kInPlace<T>) {
    if (each_flat_plane(g, [&](const FlatWindows& f, int64_t p) {
          pool_flat(f, x + p * in_plane, y + p * out_plane, idx + p * out_plane, out_plane / 16);
        }))
      return;
  }
#endif
  if constexpr (kInPlace<T> && !wide) {
    if (fast)
      return each_plane(g, [&](int64_t p) {
        pool_2x2(g, x + p * in_plane, y + p * out_plane, idx + p * out_plane);
      });
  }
  parallel_balanced(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
    // A 16-bit plane is widened and its result rounded (exactly: the maxima are inputs) in
    // per-thread buffers, which stay in cache.
    float* xin = wide ? nullptr : thread_scratch(0, size_t(in_plane));
    float* yout = wide ? nullptr : thread_scratch(1, size_t(out_plane));
    for (int64_t p = p0; p < p1; ++p) {
      const float* xp = as_float(x + p * in_plane, in_plane, xin);
      float* yp;
      if constexpr (wide)
        yp = y + p * out_plane;
      else
        yp = yout;
      if (fast)
        pool_2x2(g, xp, yp, idx + p * out_plane);
      else
        pool_generic(g, xp, yp, idx + p * out_plane);
      if constexpr (!wide) from_float(yp, y + p * out_plane, out_plane);
    }
  });
}

template <typename T>
void backward(const Pool2dGeometry& g, const T* gy, const int32_t* idx, T* gx) {
  constexpr bool wide = std::is_same_v<T, float>;
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  // 2x2/2 windows tile the plane: every input element is written exactly once (the gradient at
  // the winner, zero elsewhere), so no separate zeroing pass over gx is needed.
  const bool tiled = g.k == 2 && g.stride == 2 && g.pad == 0;
#ifdef __AVX512BW__
  if constexpr (kInPlace<T>) {
    if (each_flat_plane(g, [&](const FlatWindows& f, int64_t p) {
          unpool_flat(f, gy + p * out_plane, idx + p * out_plane, gx + p * in_plane,
                      out_plane / 16);
        }))
      return;
  }
#endif
  if constexpr (kInPlace<T> && !wide) {
    if (tiled)
      return each_plane(g, [&](int64_t p) {
        unpool_plane(g, gy + p * out_plane, idx + p * out_plane, gx + p * in_plane);
      });
  }
  parallel_balanced(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
    // A 16-bit plane: overlapping windows sum in float32, and the plane is rounded once.
    float* gyin = wide ? nullptr : thread_scratch(0, size_t(out_plane));
    float* gxout = wide ? nullptr : thread_scratch(1, size_t(in_plane));
    for (int64_t p = p0; p < p1; ++p) {
      float* gp;
      if constexpr (wide)
        gp = gx + p * in_plane;
      else
        gp = gxout;
      const float* gyp = as_float(gy + p * out_plane, out_plane, gyin);
      const int32_t* ip = idx + p * out_plane;
      if (!tiled) {
        std::fill_n(gp, in_plane, 0.f);
        for (int64_t i = 0; i < out_plane; ++i) gp[ip[i]] += gyp[i];
      } else {
        unpool_plane(g, gyp, ip, gp);
      }
      if constexpr (!wide) from_float(gp, gx + p * in_plane, in_plane);
    }
  });
}

}  // namespace

void max_pool2d_forward(const Pool2dGeometry& g, const void* x, void* y, int32_t* idx,
                        DType dtype) {
  dispatch_floating(dtype, "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward(g, static_cast<const T*>(x), static_cast<T*>(y), idx);
  });
}

void max_pool2d_backward(const Pool2dGeometry& g, const void* gy, const int32_t* idx, void* gx,
                         DType dtype) {
  dispatch_floating(dtype, "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward(g, static_cast<const T*>(gy), idx, static_cast<T*>(gx));
  });
}

}  // namespace galley::kernels::cpu
