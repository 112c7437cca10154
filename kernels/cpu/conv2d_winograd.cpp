#include "kernels/cpu/conv2d_winograd.h"

#include <algorithm>
#include <vector>

#include "galley/error.h"
#include "galley/half.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/conv2d_block.h"
#endif

namespace galley::kernels::cpu {

#if defined(__AVX512F__)
namespace {
// A plane narrower than 13 has at most 6 tiles a row, so the transforms keep at most 6 of their 16
// lanes busy; that pays where the products, c * o a tile against c + o for the transforms, weigh
// enough: vgg's 64->128 layer on 8x8 (c o / (c + o) = 43) ran 1.56x forward at 1 thread and 1.33x
// at 2 (the input gradient 1.07x and 1.0x), resnet's 64->64 on 7x7 (32) 0.93x-1.08x.
bool narrow_plane_pays(const Conv2dGeometry& g) {
  return g.c * g.o >= 40 * (g.c + g.o);
}
}  // namespace
#endif

bool conv2d_winograd_applies(const Conv2dGeometry& g, DType dtype) {
#if defined(__AVX512F__)
  // A bfloat16 convolution on the host's bfloat16 kernels keeps to the direct path; any other
  // 16-bit one computes in float32 here as the float32 one does, with its bits.
  const bool float32_sums = dtype == DType::Float32 || dtype == DType::Float16 ||
                            (dtype == DType::BFloat16 && bf16_kernels() == Bf16Kernels::Widened);
  return float32_sums && g.kh == 3 && g.kw == 3 && g.stride == 1 && g.pad == 1 && g.dilation == 1 &&
         g.groups == 1 && g.c >= 16 && g.o >= 16 && (g.w >= 13 || narrow_plane_pays(g));
#else
  (void)g, (void)dtype;
  return false;
#endif
}

namespace {

void check_geometry(const Conv2dGeometry& g, const char* what) {
  GALLEY_CHECK(g.kh == 3 && g.kw == 3 && g.stride == 1 && g.pad == 1 && g.dilation == 1 &&
                   g.groups == 1 && g.oh == g.h && g.ow == g.w,
               what,
               ": the Winograd path takes 3x3 kernels with stride 1, padding 1, dilation 1 "
               "and one group; got ",
               g.kh, "x", g.kw, " stride ", g.stride, " padding ", g.pad, " dilation ", g.dilation,
               " groups ", g.groups);
#if !defined(__AVX512F__)
  GALLEY_CHECK(false, what, ": the Winograd path needs a build for AVX-512 hosts");
#endif
}

#if defined(__AVX512F__)
using namespace conv_block;  // 16 lanes, blocks of 8 output channels

// One correlation: `cin` planes of h x w against 3x3 kernels at padding 1, giving `cout` planes
// of h x w, computed on 2x2 output tiles (the last row and column of tiles hang over an odd
// edge; what falls outside is not written).
struct Plan {
  int64_t cin, h, w, cout;
  int64_t th() const { return (h + 1) / 2; }  // rows of tiles
  int64_t tw() const { return (w + 1) / 2; }  // tiles a row
  int64_t tiles() const { return th() * tw(); }
  int64_t coutp() const { return round_up(cout, OB); }
  // Images a chunk transforms and multiplies together: at least 96 tiles (two register blocks
  // of three vectors), so that few are padding past the last tile.
  int64_t images(int64_t n) const {
    return std::min(n, std::max<int64_t>(1, (96 + tiles() - 1) / tiles()));
  }
};

// U[k][block][ci][OB], the kernels transformed, G g G^T, with G = [1 0 0; 1/2 1/2 1/2;
// 1/2 -1/2 1/2; 0 0 1]: position k = 4 r + c for output channel block * OB + o (zero past cout)
// and input channel ci. at(co, ci, t) gives tap t of the kernel, row-major.
template <typename At>
void transform_weights(const Plan& p, At at, std::vector<float>& u) {
  const int64_t blocks = p.coutp() / OB;
  u.assign(size_t(16 * blocks * p.cin * OB), 0.f);
  for (int64_t co = 0; co < p.cout; ++co)
    for (int64_t ci = 0; ci < p.cin; ++ci) {
      float g[3][3], gg[4][3];
      for (int t = 0; t < 9; ++t) g[t / 3][t % 3] = at(co, ci, t);
      for (int c = 0; c < 3; ++c) {
        gg[0][c] = g[0][c];
        gg[1][c] = 0.5f * (g[0][c] + g[1][c] + g[2][c]);
        gg[2][c] = 0.5f * (g[0][c] - g[1][c] + g[2][c]);
        gg[3][c] = g[2][c];
      }
      for (int r = 0; r < 4; ++r) {
        const float row[4] = {gg[r][0], 0.5f * (gg[r][0] + gg[r][1] + gg[r][2]),
                              0.5f * (gg[r][0] - gg[r][1] + gg[r][2]), gg[r][2]};
        for (int c = 0; c < 4; ++c)
          u[size_t((((r * 4 + c) * blocks + co / OB) * p.cin + ci) * OB + co % OB)] = row[c];
      }
    }
}

inline V as_v(__m512 v) {
  return reinterpret_cast<V>(v);
}
inline __m512 as_m(V v) {
  return reinterpret_cast<__m512>(v);
}

// The lanes of 16 consecutive floats from x + o that fall inside [0, n).
inline __mmask16 inside(int64_t o, int64_t n) {
  const int64_t lo = std::clamp<int64_t>(-o, 0, L), hi = std::clamp<int64_t>(n - o, 0, L);
  return lo >= hi ? __mmask16(0) : __mmask16(lanes(hi) & ~lanes(lo));
}

// v[k * ldk + t0 + tile] = position k = 4 r + c of B^T d B, B^T = [1 0 -1 0; 0 1 1 0;
// 0 -1 1 0; 0 1 0 -1], for every tile of one input plane (tiles numbered row-major). Tile (i, j)
// reads rows 2i - 1 .. 2i + 2 and columns 2j - 1 .. 2j + 2, zero outside the plane; 16 tiles of a
// row take their four columns from the odd and even lanes of three pairs of vector loads (at
// 2j - 2, 2j and 2j + 2), so each tile's values come straight from the input, without a bordered
// copy.
template <typename T>
void transform_input(const Plan& p, const T* x, float* v, int64_t ldk, int64_t t0) {
  const __m512i even_lanes =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_lanes =
      _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const int64_t tw = p.tw();
  for (int64_t j0 = 0; j0 < tw; j0 += L) {
    // The loads' lanes inside the row, for the pairs at columns 2j - 2, 2j and 2j + 2.
    const int64_t o = 2 * j0;
    const __mmask16 m0 = inside(o - 2, p.w), m1 = inside(o - 2 + L, p.w), m2 = inside(o, p.w),
                    m3 = inside(o + L, p.w), m4 = inside(o + 2, p.w), m5 = inside(o + 2 + L, p.w);
    // Row r's columns 2j - 1 .. 2j + 2 for the 16 tiles, through B^T: t0..t3 (zero outside).
    auto row = [&](int64_t r, V& t0_, V& t1_, V& t2_, V& t3_) {
      if (r < 0 || r >= p.h) {
        t0_ = t1_ = t2_ = t3_ = V{};
        return;
      }
      const T* s = x + r * p.w + o;
      const __m512 d0 =
          _mm512_permutex2var_ps(load_as_f32(s - 2, m0), odd_lanes, load_as_f32(s - 2 + L, m1));
      const __m512 a = load_as_f32(s, m2), b = load_as_f32(s + L, m3);
      const __m512 d1 = _mm512_permutex2var_ps(a, even_lanes, b);
      const __m512 d2 = _mm512_permutex2var_ps(a, odd_lanes, b);
      const __m512 d3 =
          _mm512_permutex2var_ps(load_as_f32(s + 2, m4), even_lanes, load_as_f32(s + 2 + L, m5));
      t0_ = as_v(_mm512_sub_ps(d0, d2));
      t1_ = as_v(_mm512_add_ps(d1, d2));
      t2_ = as_v(_mm512_sub_ps(d2, d1));
      t3_ = as_v(_mm512_sub_ps(d1, d3));
    };
    const __mmask16 m = lanes(tw - j0);
    auto put = [&](float* dst, int c, V r0, V r1, V r2, V r3) {
      _mm512_mask_storeu_ps(dst + (0 + c) * ldk, m, as_m(r0 - r2));
      _mm512_mask_storeu_ps(dst + (4 + c) * ldk, m, as_m(r1 + r2));
      _mm512_mask_storeu_ps(dst + (8 + c) * ldk, m, as_m(r2 - r1));
      _mm512_mask_storeu_ps(dst + (12 + c) * ldk, m, as_m(r1 - r3));
    };
    // Tile rows i and i + 1 share two input rows (2i + 1 and 2i + 2): each is transformed once.
    V a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, e0, e1, e2, e3;
    row(-1, c0, c1, c2, c3);
    row(0, e0, e1, e2, e3);
    for (int64_t i = 0; i < p.th(); ++i) {
      a0 = c0, a1 = c1, a2 = c2, a3 = c3;
      b0 = e0, b1 = e1, b2 = e2, b3 = e3;
      row(2 * i + 1, c0, c1, c2, c3);
      row(2 * i + 2, e0, e1, e2, e3);
      float* dst = v + t0 + i * tw + j0;
      put(dst, 0, a0, b0, c0, e0);
      put(dst, 1, a1, b1, c1, e1);
      put(dst, 2, a2, b2, c2, e2);
      put(dst, 3, a3, b3, c3, e3);
    }
  }
}

// m[k][co][t] = sum over ci of u[k][co][ci] * v[k][ci][t] for the 16 positions k: tp tiles (whole
// vectors), output channels padded to whole blocks.
void multiply(const Plan& p, const float* u, const float* v, int64_t tp, float* m) {
  static const int64_t no_shift = 0;
  const int64_t blocks = p.coutp() / OB, nvec = tp / L;
  for (int k = 0; k < 16; ++k) {
    const float* vk = v + k * p.cin * tp;
    for (int64_t cb = 0; cb < blocks; ++cb) {
      const float* ub = u + (k * blocks + cb) * p.cin * OB;
      correlate_vectors(vk, tp, p.cin, &no_shift, 1, ub, m + (k * p.coutp() + cb * OB) * tp, tp,
                        nvec);
    }
  }
}

// y[co][2i + a][2j + b] (+ bias[co]) = A^T m A, A^T = [1 1 1 0; 0 1 -1 -1], for the tiles of one
// image, the first at t0 of m's tp; the two columns of each tile interleaved into the output row.
template <typename T>
void transform_output(const Plan& p, const float* m, int64_t tp, int64_t t0, const float* bias,
                      T* y) {
  const __m512i first_half =
      _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second_half =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const int64_t tw = p.tw(), ldk = p.coutp() * tp;
  for (int64_t co = 0; co < p.cout; ++co) {
    const V vb = splat(bias ? bias[co] : 0.f);
    const float* mc = m + co * tp + t0;
    T* yc = y + co * p.h * p.w;
    for (int64_t i = 0; i < p.th(); ++i)
      for (int64_t j0 = 0; j0 < tw; j0 += L) {
        const float* src = mc + i * tw + j0;
        V s[4][2];
        for (int a = 0; a < 4; ++a) {
          const V m0 = load(src + (4 * a) * ldk), m1 = load(src + (4 * a + 1) * ldk),
                  m2 = load(src + (4 * a + 2) * ldk), m3 = load(src + (4 * a + 3) * ldk);
          s[a][0] = m0 + m1 + m2;
          s[a][1] = m1 - m2 - m3;
        }
        const int64_t left = p.w - 2 * j0;
        for (int a = 0; a < 2 && 2 * i + a < p.h; ++a) {
          const V y0 = (a == 0 ? s[0][0] + s[1][0] + s[2][0] : s[1][0] - s[2][0] - s[3][0]) + vb;
          const V y1 = (a == 0 ? s[0][1] + s[1][1] + s[2][1] : s[1][1] - s[2][1] - s[3][1]) + vb;
          T* dst = yc + (2 * i + a) * p.w + 2 * j0;
          store_from_f32(dst, _mm512_permutex2var_ps(as_m(y0), first_half, as_m(y1)), lanes(left));
          if (left > L)
            store_from_f32(dst + L, _mm512_permutex2var_ps(as_m(y0), second_half, as_m(y1)),
                           lanes(left - L));
        }
      }
  }
}

// y[n][cout][h][w] = the correlation of x[n][cin][h][w] with the kernels `at` gives (+ bias),
// chunks of images transformed, multiplied and transformed back on each thread.
template <typename T, typename At>
void winograd(const Plan& p, int64_t n, const T* x, At at, const float* bias, T* y) {
  if (n == 0 || p.tiles() == 0) return;  // an empty output
  std::vector<float> u;
  transform_weights(p, at, u);
  const int64_t plane = p.h * p.w, tiles = p.tiles();
  parallel_chunks(n, p.images(n), [&](int64_t n0, int64_t n1, bool) {
    const int64_t t = (n1 - n0) * tiles, tp = round_up(t, L);
    float* v = thread_scratch(0, size_t(16 * p.cin * tp));
    // The output transform's last vectors read up to a vector past the last row of m.
    float* m = thread_scratch(1, size_t(16 * p.coutp() * tp + L));
    // The lanes past the chunk's tiles: zeros, so that their products stay finite.
    for (int64_t r = 0; r < 16 * p.cin; ++r) std::fill(v + r * tp + t, v + (r + 1) * tp, 0.f);
    for (int64_t i = n0; i < n1; ++i)
      for (int64_t c = 0; c < p.cin; ++c)
        transform_input(p, x + (i * p.cin + c) * plane, v + c * tp, p.cin * tp, (i - n0) * tiles);
    multiply(p, u.data(), v, tp, m);
    for (int64_t i = n0; i < n1; ++i)
      transform_output(p, m, tp, (i - n0) * tiles, bias, y + i * p.cout * plane);
  });
}
#endif

}  // namespace

void conv2d_winograd_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                             void* y, DType dtype) {
  check_geometry(g, "conv2d");
#if defined(__AVX512F__)
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    winograd(
        Plan{g.c, g.h, g.w, g.o}, g.n, static_cast<const T*>(x),
        [&](int64_t co, int64_t ci, int64_t t) { return w[(co * g.c + ci) * 9 + t]; }, b,
        static_cast<T*>(y));
  });
#else
  (void)x, (void)w, (void)b, (void)y, (void)dtype;
#endif
}

void conv2d_winograd_input_grad(const Conv2dGeometry& g, const float* w, const void* gy, void* gx,
                                DType dtype) {
  check_geometry(g, "conv2d_backward");
#if defined(__AVX512F__)
  // The output gradient against the kernel flipped in both axes, input and output channels
  // swapped: output channel ci (an input channel of the convolution) from input channel o.
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    winograd(
        Plan{g.o, g.h, g.w, g.c}, g.n, static_cast<const T*>(gy),
        [&](int64_t ci, int64_t o, int64_t t) { return w[(o * g.c + ci) * 9 + (8 - t)]; }, nullptr,
        static_cast<T*>(gx));
  });
#else
  (void)w, (void)gy, (void)gx, (void)dtype;
#endif
}

}  // namespace galley::kernels::cpu
