#include "kernels/conv2d.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/conv2d_channels.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/conv2d_pointwise.h"
#include "kernels/cpu/conv2d_winograd.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"
#include "kernels/cpu/strided_rows.h"
#include "kernels/gemm.h"

namespace galley::kernels::cpu {
namespace {

bool is_pointwise(const Conv2dGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.stride == 1 && g.pad == 0;
}

// Output columns [lo, hi) whose input column ow * stride + dj lies inside the image.
std::pair<int64_t, int64_t> inside_columns(const Conv2dGeometry& g, int64_t dj) {
  int64_t lo = dj >= 0 ? 0 : (-dj + g.stride - 1) / g.stride;
  int64_t hi = (g.w - dj + g.stride - 1) / g.stride;
  lo = std::min(lo, g.ow);
  return {lo, std::max(lo, std::min(hi, g.ow))};
}

// Unfolds channels [c0, c0 + cg) of one image into col[(c * kh + i) * kw + j][oh * ow] of D:
// float32 (16-bit values widened) or T itself.
template <typename T, typename D = float>
void im2col(const Conv2dGeometry& g, const T* x, int64_t cg, D* col) {
  static_assert(std::is_same_v<D, float> || std::is_same_v<D, T>);
  const D zero = D(0.f);
  const int64_t P = g.oh * g.ow;
  for (int64_t c = 0; c < cg; ++c) {
    const T* xc = x + c * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        D* row = col + ((c * g.kh + ki) * g.kw + kj) * P;
        const int64_t dj = kj * g.dilation - g.pad;
        int64_t ow_lo, ow_hi;
        std::tie(ow_lo, ow_hi) = inside_columns(g, dj);
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          D* r = row + oh * g.ow;
          const int64_t ih = oh * g.stride - g.pad + ki * g.dilation;
          if (ih < 0 || ih >= g.h) {
            std::fill_n(r, g.ow, zero);
            continue;
          }
          const T* xr = xc + ih * g.w + dj;
          std::fill_n(r, ow_lo, zero);
          if (g.stride != 1) {
            gather_strided(xr + ow_lo * g.stride, r + ow_lo, ow_hi - ow_lo, g.stride);
          } else if constexpr (std::is_same_v<T, D>) {
            copy_row(xr + ow_lo, r + ow_lo, ow_hi - ow_lo);
          } else {
            to_float(xr + ow_lo, r + ow_lo, ow_hi - ow_lo);
          }
          std::fill(r + ow_hi, r + g.ow, zero);
        }
      }
    }
  }
}

// Folds col back into an image, adding overlapping contributions into gx (pre-zeroed).
void col2im(const Conv2dGeometry& g, const float* col, int64_t cg, float* gx) {
  const int64_t P = g.oh * g.ow;
  for (int64_t c = 0; c < cg; ++c) {
    float* gc = gx + c * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const float* row = col + ((c * g.kh + ki) * g.kw + kj) * P;
        const int64_t dj = kj * g.dilation - g.pad;
        int64_t ow_lo, ow_hi;
        std::tie(ow_lo, ow_hi) = inside_columns(g, dj);
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          const int64_t ih = oh * g.stride - g.pad + ki * g.dilation;
          if (ih < 0 || ih >= g.h) continue;
          float* gr = gc + ih * g.w + dj;
          const float* r = row + oh * g.ow;
          if (g.stride == 1) {
#pragma omp simd
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) gr[ow] += r[ow];
          } else {
            scatter_strided<true>(r + ow_lo, gr + ow_lo * g.stride, ow_hi - ow_lo, g.stride);
          }
        }
      }
    }
  }
}

// gb[o] = the sum of gy over images and positions: each output channel the sum of its planes'
// sums (sum_floats) in image order; the same bits at any thread count. The planes are summed in
// memory order, images across the threads, into a sum per plane that the channels' sums then add
// (a channel at a time through the batch read 2 KiB runs a page apart: in vgg's bfloat16 step on
// AMD Zen 4 the bias gradients' share of the samples fell from 1.43% to 1.08% so). 16-bit planes
// are summed as widened, in the float32 kernel's order (sum_as_floats).
template <typename T>
void bias_grad(const Conv2dGeometry& g, const T* gy, float* gb) {
  const int64_t P = g.oh * g.ow;
  thread_local std::vector<float> plane;
  plane.resize(size_t(g.n * g.o));
  float* sums = plane.data();
  parallel_balanced(
      g.n * g.o, std::max<int64_t>(1, kElementwiseGrain / P), [&](int64_t r0, int64_t r1) {
        float* row = std::is_same_v<T, float> ? nullptr : thread_scratch(0, size_t(P));
        for (int64_t r = r0; r < r1; ++r) sums[r] = sum_as_floats(gy + r * P, P, row);
      });
  for (int64_t o = 0; o < g.o; ++o) {
    float s = 0.f;
    for (int64_t n = 0; n < g.n; ++n) s += sums[n * g.o + o];
    gb[o] = s;
  }
}

template <typename T>
void forward_im2col(const Conv2dGeometry& g, const T* x, const float* w, const float* b, T* y) {
  constexpr bool wide = std::is_same_v<T, float>;
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t K = cg * g.kh * g.kw, P = g.oh * g.ow;
  const bool pointwise = is_pointwise(g);
  parallel_chunks(g.n, conv2d_image_grain(g), [&](int64_t n0, int64_t n1, bool) {
    // The columns, or a pointwise convolution's widened input; a 16-bit output is computed in
    // float32 here and rounded once.
    float* col = pointwise && wide ? nullptr : thread_scratch(0, size_t(K * P));
    float* out = wide ? nullptr : thread_scratch(1, size_t(og * P));
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = x + n * g.c * g.h * g.w;
      T* yn = y + n * g.o * P;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* xg = xn + grp * cg * g.h * g.w;
        const float* src;
        if (!pointwise) {
          im2col(g, xg, cg, col);
          src = col;
        } else {
          src = as_float(xg, cg * P, col);
        }
        float* yg;
        if constexpr (wide)
          yg = yn + grp * og * P;
        else
          yg = out;
        if (b) {  // start from the bias so the GEMM accumulates onto it
          for (int64_t o = 0; o < og; ++o) std::fill_n(yg + o * P, P, b[grp * og + o]);
        }
        gemm(false, false, og, P, K, 1.f, w + grp * og * K, K, src, P, b ? 1.f : 0.f, yg, P);
        if constexpr (!wide) from_float(yg, yn + grp * og * P, og * P);
      }
    }
  });
}

template <typename T>
void backward_im2col(const Conv2dGeometry& g, const T* x, const float* w, const T* gy, T* gx,
                     float* gw) {
  constexpr bool wide = std::is_same_v<T, float>;
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t K = cg * g.kh * g.kw, P = g.oh * g.ow, HW = g.h * g.w;
  const bool pointwise = is_pointwise(g);
  // Each chunk of images sums its weight gradients privately; the partial sums are added after.
  const int64_t chunk = balanced_chunk(g.n, conv2d_image_grain(g));
  const ChunkSums sums(gw ? g.n : 0, chunk, g.o * K);
  // A float32 gx accumulates in place; a 16-bit one is summed in float32 per group and rounded.
  if (gx && wide) std::fill_n(gx, g.n * g.c * HW, T(0.f));
  parallel_chunks(g.n, chunk, [&](int64_t n0, int64_t n1, bool) {
    float* col = pointwise && wide ? nullptr : thread_scratch(0, size_t(K * P));
    float* gcol = pointwise ? nullptr : thread_scratch(2, size_t(K * P));
    float* gy_wide = wide ? nullptr : thread_scratch(3, size_t(og * P));
    float* gx_wide = wide || !gx ? nullptr : thread_scratch(4, size_t(cg * HW));
    float* gw_t = gw ? sums.start(n0) : nullptr;
    for (int64_t n = n0; n < n1; ++n) {
      const T* xn = x + n * g.c * HW;
      const T* gyn = gy + n * g.o * P;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const T* xg = xn + grp * cg * HW;
        const float* gyg = as_float(gyn + grp * og * P, og * P, gy_wide);
        const float* wg = w + grp * og * K;
        if (gw) {  // dW_g += dY_g (og x P) * col^T (P x K)
          const float* src;
          if (!pointwise) {
            im2col(g, xg, cg, col);
            src = col;
          } else {
            src = as_float(xg, cg * P, col);
          }
          gemm(false, true, og, K, P, 1.f, gyg, P, src, P, 1.f, gw_t + grp * og * K, K);
        }
        if (gx) {  // dcol = W_g^T (K x og) * dY_g (og x P), folded back into the image
          T* gxg = gx + n * g.c * HW + grp * cg * HW;
          float* acc;
          if constexpr (wide)
            acc = gxg;
          else
            acc = gx_wide;
          if constexpr (!wide) std::fill_n(acc, cg * HW, 0.f);  // as the float32 gx above
          if (pointwise) {
            gemm(true, false, K, P, og, 1.f, wg, K, gyg, P, 1.f, acc, P);
          } else {
            gemm(true, false, K, P, og, 1.f, wg, K, gyg, P, 0.f, gcol, P);
            col2im(g, gcol, cg, acc);
          }
          if constexpr (!wide) from_float(acc, gxg, cg * HW);
        }
      }
    }
  });
  if (gw) std::copy_n(sums.total(), g.o * K, gw);
}

// The im2col path of a bfloat16 convolution where the host has the bfloat16 GEMM
// (gemm_bf16_available()): bfloat16 columns (or the input itself, pointwise) multiplied as they
// are, float32 sums, each result rounded once. The weights, float32 widened from bfloat16 by the
// op, are rounded back exactly.
std::vector<bfloat16> bf16_weights(const Conv2dGeometry& g, const float* w) {
  std::vector<bfloat16> out(size_t(g.o * (g.c / g.groups) * g.kh * g.kw));
  from_float(w, out.data(), int64_t(out.size()));
  return out;
}

// The calling thread's scratch `slot` as n bfloat16 elements.
bfloat16* bf16_scratch(int slot, int64_t n) {
  return reinterpret_cast<bfloat16*>(thread_scratch(slot, size_t((n + 1) / 2)));
}

void forward_im2col_bf16(const Conv2dGeometry& g, const bfloat16* x, const float* w, const float* b,
                         bfloat16* y) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t K = cg * g.kh * g.kw, P = g.oh * g.ow;
  const bool pointwise = is_pointwise(g);
  const std::vector<bfloat16> w16 = bf16_weights(g, w);
  parallel_chunks(g.n, conv2d_image_grain(g), [&](int64_t n0, int64_t n1, bool) {
    bfloat16* col = pointwise ? nullptr : bf16_scratch(0, K * P);
    float* out = thread_scratch(1, size_t(og * P));
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const bfloat16* xg = x + (n * g.c + grp * cg) * g.h * g.w;
        const bfloat16* src = xg;
        if (!pointwise) {
          im2col(g, xg, cg, col);
          src = col;
        }
        if (b)  // start from the bias so the GEMM accumulates onto it
          for (int64_t o = 0; o < og; ++o) std::fill_n(out + o * P, P, b[grp * og + o]);
        gemm_bf16(false, false, og, P, K, w16.data() + grp * og * K, K, src, P, b != nullptr, out,
                  P);
        from_float(out, y + (n * g.o + grp * og) * P, og * P);
      }
  });
}

void backward_im2col_bf16(const Conv2dGeometry& g, const bfloat16* x, const float* w,
                          const bfloat16* gy, bfloat16* gx, float* gw) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t K = cg * g.kh * g.kw, P = g.oh * g.ow, HW = g.h * g.w;
  const bool pointwise = is_pointwise(g);
  const std::vector<bfloat16> w16 = bf16_weights(g, w);
  // Each chunk of images sums its weight gradients privately; the partial sums are added after.
  const int64_t chunk = balanced_chunk(g.n, conv2d_image_grain(g));
  const ChunkSums sums(gw ? g.n : 0, chunk, g.o * K);
  parallel_chunks(g.n, chunk, [&](int64_t n0, int64_t n1, bool) {
    bfloat16* col = pointwise || !gw ? nullptr : bf16_scratch(0, K * P);
    float* gcol = pointwise || !gx ? nullptr : thread_scratch(2, size_t(K * P));
    float* acc = gx ? thread_scratch(4, size_t(cg * HW)) : nullptr;
    float* gw_t = gw ? sums.start(n0) : nullptr;
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const bfloat16* xg = x + (n * g.c + grp * cg) * HW;
        const bfloat16* gyg = gy + (n * g.o + grp * og) * P;
        const bfloat16* wg = w16.data() + grp * og * K;
        if (gw) {  // dW_g += dY_g (og x P) * col^T (P x K)
          const bfloat16* src = xg;
          if (!pointwise) {
            im2col(g, xg, cg, col);
            src = col;
          }
          gemm_bf16(false, true, og, K, P, gyg, P, src, P, true, gw_t + grp * og * K, K);
        }
        if (gx) {  // dcol = W_g^T (K x og) * dY_g (og x P), folded back into the image
          if (pointwise) {
            gemm_bf16(true, false, K, P, og, wg, K, gyg, P, false, acc, P);
          } else {
            std::fill_n(acc, cg * HW, 0.f);
            gemm_bf16(true, false, K, P, og, wg, K, gyg, P, false, gcol, P);
            col2im(g, gcol, cg, acc);
          }
          from_float(acc, gx + (n * g.c + grp * cg) * HW, cg * HW);
        }
      }
  });
  if (gw) std::copy_n(sums.total(), g.o * K, gw);
}

// A strided convolution as a stride-1 one over its phases (polyphase). With stride s, row r of
// the padded input is row r / s of phase r % s, and kernel row a reads phase a % s at offset a / s
// (columns alike). So the convolution is a stride-1, unpadded one over the phase images, channels
// ordered [row phase][column phase][channel], with kernels of ceil(k / s) taps a side whose taps
// past the kernel are zero; only the phases the kernel reaches (a % s for a < k) are kept. Every
// input position lies in one phase and every tap in one phase tap, so the gradients map back
// without sums. Taken for bfloat16 on the tiles (bf16_kernels()), where the stride-1 kernels are
// the fast ones, for kernels wider than the stride.
struct Phases {
  int64_t ph, pw;  // phases kept per axis
  Conv2dGeometry g2;
  explicit Phases(const Conv2dGeometry& g) {
    const int64_t s = g.stride;
    ph = std::min(s, g.kh), pw = std::min(s, g.kw);
    const int64_t kh2 = (g.kh + s - 1) / s, kw2 = (g.kw + s - 1) / s;
    g2 = {g.n,  g.c * ph * pw, g.oh + kh2 - 1, g.ow + kw2 - 1, g.o, kh2, kw2, 1, 0, 1, 1,
          g.oh, g.ow};
  }
  // Phase channel of (row phase, column phase, input channel).
  int64_t channel(const Conv2dGeometry& g, int64_t pa, int64_t pb, int64_t c) const {
    return (pa * pw + pb) * g.c + c;
  }
};

bool by_phases(const Conv2dGeometry& g, DType dtype) {
  // On the dot products im2col on the bfloat16 GEMM is faster (AMD Zen 4, resnet's 3x3/2 layers:
  // 1.6x-2.1x forward, 1.4x backward): the phases' zero taps cost 1.8x the arithmetic there (and
  // the channels path, cpu/conv2d_channels.h, on the widened values is faster again).
  if (dtype != DType::BFloat16 || bf16_kernels() != Bf16Kernels::Tiles) return false;
  if (g.stride < 2 || g.groups != 1 || g.dilation != 1 || g.n < num_threads()) return false;
  // A kernel of one tap per phase (a strided 1x1) gains nothing on those kernels over im2col.
  const Conv2dGeometry g2 = Phases(g).g2;
  return g2.c >= 16 && g2.kh * g2.kw > 1;
}

// A buffer of the calling thread kept between calls (fresh pages for every call would cost more
// than the copies into them); slot 0 the phase images, 1 their gradient.
uint16_t* phase_buffer(int slot, size_t n) {
  thread_local std::vector<uint16_t> bufs[2];
  if (bufs[slot].size() < n) bufs[slot].resize(n);
  return bufs[slot].data();
}

// Phase images of x into xp (zero where a phase position falls in the padding or past the input).
void phase_images(const Conv2dGeometry& g, const Phases& P, const uint16_t* x, uint16_t* xp) {
  const Conv2dGeometry& g2 = P.g2;
  const int64_t s = g.stride;
  parallel_chunks(g.n, 1, [&](int64_t n0, int64_t n1, bool) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t pa = 0; pa < P.ph; ++pa)
        for (int64_t pb = 0; pb < P.pw; ++pb) {
          // Phase columns [q0, q1) fall inside the input: 0 <= q * s + pb - pad < w.
          const int64_t off = pb - g.pad;
          const int64_t q0 = std::min(g2.w, off >= 0 ? 0 : (-off + s - 1) / s);
          const int64_t q1 = std::max(q0, std::min(g2.w, (g.w - off + s - 1) / s));
          for (int64_t c = 0; c < g.c; ++c) {
            uint16_t* dst = xp + ((n * g2.c + P.channel(g, pa, pb, c)) * g2.h) * g2.w;
            const uint16_t* src = x + (n * g.c + c) * g.h * g.w;
            for (int64_t r = 0; r < g2.h; ++r, dst += g2.w) {
              const int64_t ih = r * s + pa - g.pad;
              if (ih < 0 || ih >= g.h) {
                std::fill_n(dst, g2.w, uint16_t(0));
                continue;
              }
              const uint16_t* row = src + ih * g.w + off;
              std::fill_n(dst, q0, uint16_t(0));
              for (int64_t q = q0; q < q1; ++q) dst[q] = row[q * s];
              std::fill(dst + q1, dst + g2.w, uint16_t(0));
            }
          }
        }
  });
}

// The phase kernels of w (zero past the kernel).
std::vector<float> phase_weights(const Conv2dGeometry& g, const Phases& P, const float* w) {
  const Conv2dGeometry& g2 = P.g2;
  std::vector<float> wp(size_t(g.o * g2.c * g2.kh * g2.kw), 0.f);
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t a = 0; a < g.kh; ++a)
        for (int64_t b = 0; b < g.kw; ++b) {
          const int64_t c2 = P.channel(g, a % g.stride, b % g.stride, c);
          wp[size_t(((o * g2.c + c2) * g2.kh + a / g.stride) * g2.kw + b / g.stride)] =
              w[((o * g.c + c) * g.kh + a) * g.kw + b];
        }
  return wp;
}

void phases_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                    void* y) {
  const Phases P(g);
  const Conv2dGeometry& g2 = P.g2;
  uint16_t* xp = phase_buffer(0, size_t(g2.n * g2.c * g2.h * g2.w));
  phase_images(g, P, static_cast<const uint16_t*>(x), xp);
  const std::vector<float> wp = phase_weights(g, P, w);
  conv2d_direct_forward(g2, xp, wp.data(), b, y, DType::BFloat16, bf16_kernels());
}

void phases_backward(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                     void* gx, float* gw) {
  const Phases P(g);
  const Conv2dGeometry& g2 = P.g2;
  const size_t elems = size_t(g2.n * g2.c * g2.h * g2.w);
  uint16_t* xp = phase_buffer(0, elems);
  phase_images(g, P, static_cast<const uint16_t*>(x), xp);
  const std::vector<float> wp = phase_weights(g, P, w);
  uint16_t* gxp = gx ? phase_buffer(1, elems) : nullptr;
  std::vector<float> gwp(gw ? wp.size() : 0);
  conv2d_direct_backward(g2, xp, wp.data(), gy, gxp, gw ? gwp.data() : nullptr, DType::BFloat16,
                         bf16_kernels());
  if (gx) {
    auto* out = static_cast<uint16_t*>(gx);
    const int64_t s = g.stride;
    parallel_chunks(g.n, 1, [&](int64_t n0, int64_t n1, bool) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c = 0; c < g.c; ++c)
          for (int64_t ih = 0; ih < g.h; ++ih) {
            uint16_t* dst = out + ((n * g.c + c) * g.h + ih) * g.w;
            const int64_t pa = (ih + g.pad) % s, r = (ih + g.pad) / s;
            std::fill_n(dst, g.w, uint16_t(0));  // positions no output reaches
            if (pa >= P.ph || r >= g2.h) continue;
            for (int64_t pb = 0; pb < P.pw; ++pb) {
              const uint16_t* src = gxp + ((n * g2.c + P.channel(g, pa, pb, c)) * g2.h + r) * g2.w;
              // Input columns iw = q * s + pb - pad for the phase's columns q.
              const int64_t off = pb - g.pad;
              const int64_t q0 = off >= 0 ? 0 : (-off + s - 1) / s;
              const int64_t q1 = std::min(g2.w, (g.w - off + s - 1) / s);
              for (int64_t q = q0; q < q1; ++q) dst[q * s + off] = src[q];
            }
          }
    });
  }
  if (gw)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t a = 0; a < g.kh; ++a)
          for (int64_t b = 0; b < g.kw; ++b) {
            const int64_t c2 = P.channel(g, a % g.stride, b % g.stride, c);
            gw[((o * g.c + c) * g.kh + a) * g.kw + b] =
                gwp[size_t(((o * g2.c + c2) * g2.kh + a / g.stride) * g2.kw + b / g.stride)];
          }
}

}  // namespace

int64_t conv2d_image_grain(const Conv2dGeometry& g) {
  const int64_t flops = 2 * g.o * (g.c / g.groups) * g.kh * g.kw * g.oh * g.ow;
  return std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(flops, 1));
}

void conv2d_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b, void* y,
                    DType dtype) {
  if (by_phases(g, dtype)) return phases_forward(g, x, w, b, y);
  if (conv2d_winograd_applies(g, dtype)) return conv2d_winograd_forward(g, x, w, b, y, dtype);
  if (conv2d_pointwise_applies(g, dtype)) return conv2d_pointwise_forward(g, x, w, b, y, dtype);
  if (conv2d_channels_use(g, dtype).forward) return conv2d_channels_forward(g, x, w, b, y, dtype);
  const ConvDirectUse use = conv2d_direct_use(g, dtype);
  if (use.forward)
    conv2d_direct_forward(g, x, w, b, y, dtype, use.bf16);
  else
    conv2d_forward_im2col(g, x, w, b, y, dtype);
}

void conv2d_forward_im2col(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                           void* y, DType dtype) {
  if (dtype == DType::BFloat16 && gemm_bf16_available())
    return forward_im2col_bf16(g, static_cast<const bfloat16*>(x), w, b, static_cast<bfloat16*>(y));
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_im2col(g, static_cast<const T*>(x), w, b, static_cast<T*>(y));
  });
}

void conv2d_backward(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                     void* gx, float* gw, float* gb, DType dtype) {
  if ((gx || gw) && by_phases(g, dtype)) {
    phases_backward(g, x, w, gy, gx, gw);
  } else if ((gx || gw) && conv2d_pointwise_applies(g, dtype)) {
    conv2d_pointwise_backward(g, x, w, gy, gx, gw, dtype);
  } else {
    if (gx && conv2d_winograd_applies(g, dtype)) {
      conv2d_winograd_input_grad(g, w, gy, gx, dtype);
      gx = nullptr;
    }
    const ConvChannelsUse channels = conv2d_channels_use(g, dtype);
    if (gx && channels.input_grad) {
      conv2d_channels_input_grad(g, w, gy, gx, dtype);
      gx = nullptr;
    }
    if (gw && channels.weight_grad) {
      conv2d_channels_weight_grad(g, x, gy, gw, dtype);
      gw = nullptr;
    }
    if (gw && conv2d_winograd_weight_grad_applies(g, dtype)) {
      conv2d_winograd_weight_grad(g, x, gy, gw, dtype);
      gw = nullptr;
    }
    const ConvDirectUse use = conv2d_direct_use(g, dtype);
    void* direct_gx = use.input_grad ? gx : nullptr;
    float* direct_gw = use.weight_grad ? gw : nullptr;
    // The direct weight gradient on the float32 kernels sums the bias gradient as it goes.
    float* direct_gb = direct_gw && !on_bf16_kernels(dtype, use.bf16_backward) ? gb : nullptr;
    if (direct_gx || direct_gw)
      conv2d_direct_backward(g, x, w, gy, direct_gx, direct_gw, dtype, use.bf16_backward,
                             direct_gb);
    if (direct_gb) gb = nullptr;
    if (gx != direct_gx || gw != direct_gw)
      conv2d_backward_im2col(g, x, w, gy, direct_gx ? nullptr : gx, direct_gw ? nullptr : gw,
                             dtype);
  }
  if (gb)
    dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      bias_grad(g, static_cast<const T*>(gy), gb);
    });
}

void conv2d_backward_im2col(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                            void* gx, float* gw, DType dtype) {
  if (dtype == DType::BFloat16 && gemm_bf16_available())
    return backward_im2col_bf16(g, static_cast<const bfloat16*>(x), w,
                                static_cast<const bfloat16*>(gy), static_cast<bfloat16*>(gx), gw);
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_im2col(g, static_cast<const T*>(x), w, static_cast<const T*>(gy), static_cast<T*>(gx),
                    gw);
  });
}

}  // namespace galley::kernels::cpu
