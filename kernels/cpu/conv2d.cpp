#include "kernels/conv2d.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/parallel.h"
#include "kernels/gemm.h"

namespace galley::kernels::cpu {
namespace {

// Images per thread chunk: small images are batched so that forking pays for itself.
int64_t image_grain(const Conv2dGeometry& g) {
  const int64_t flops = 2 * g.o * (g.c / g.groups) * g.kh * g.kw * g.oh * g.ow;
  return std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(flops, 1));
}

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

// Unfolds channels [c0, c0 + cg) of one image into col[(c * kh + i) * kw + j][oh * ow].
void im2col(const Conv2dGeometry& g, const float* x, int64_t cg, float* col) {
  const int64_t P = g.oh * g.ow;
  for (int64_t c = 0; c < cg; ++c) {
    const float* xc = x + c * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        float* row = col + ((c * g.kh + ki) * g.kw + kj) * P;
        const int64_t dj = kj * g.dilation - g.pad;
        int64_t ow_lo, ow_hi;
        std::tie(ow_lo, ow_hi) = inside_columns(g, dj);
        for (int64_t oh = 0; oh < g.oh; ++oh) {
          float* r = row + oh * g.ow;
          const int64_t ih = oh * g.stride - g.pad + ki * g.dilation;
          if (ih < 0 || ih >= g.h) {
            std::fill_n(r, g.ow, 0.f);
            continue;
          }
          const float* xr = xc + ih * g.w + dj;
          std::fill_n(r, ow_lo, 0.f);
          if (g.stride == 1) {
            std::memcpy(r + ow_lo, xr + ow_lo, (ow_hi - ow_lo) * sizeof(float));
          } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) r[ow] = xr[ow * g.stride];
          }
          std::fill(r + ow_hi, r + g.ow, 0.f);
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
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) gr[ow * g.stride] += r[ow];
          }
        }
      }
    }
  }
}

// gb[o] = the sum of gy over images and positions.
void bias_grad(const Conv2dGeometry& g, const float* gy, float* gb) {
  const int64_t P = g.oh * g.ow;
  std::fill_n(gb, g.o, 0.f);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.o; ++o) {
      const float* r = gy + (n * g.o + o) * P;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t p = 0; p < P; ++p) s += r[p];
      gb[o] += s;
    }
}

}  // namespace

void conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w, const float* b,
                    float* y) {
  if (conv2d_direct_use(g).forward)
    conv2d_direct_forward(g, x, w, b, y);
  else
    conv2d_forward_im2col(g, x, w, b, y);
}

void conv2d_forward_im2col(const Conv2dGeometry& g, const float* x, const float* w, const float* b,
                           float* y) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t K = cg * g.kh * g.kw, P = g.oh * g.ow;
  const bool pointwise = is_pointwise(g);
  parallel_for(g.n, image_grain(g), [&](int64_t n0, int64_t n1) {
    float* col = pointwise ? nullptr : thread_scratch(0, size_t(K * P));
    for (int64_t n = n0; n < n1; ++n) {
      const float* xn = x + n * g.c * g.h * g.w;
      float* yn = y + n * g.o * P;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const float* xg = xn + grp * cg * g.h * g.w;
        const float* src = xg;
        if (!pointwise) {
          im2col(g, xg, cg, col);
          src = col;
        }
        float* yg = yn + grp * og * P;
        if (b) {  // start from the bias so the GEMM accumulates onto it
          for (int64_t o = 0; o < og; ++o) std::fill_n(yg + o * P, P, b[grp * og + o]);
        }
        gemm(false, false, og, P, K, 1.f, w + grp * og * K, K, src, P, b ? 1.f : 0.f, yg, P);
      }
    }
  });
}

void conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w, const float* gy,
                     float* gx, float* gw, float* gb) {
  const ConvDirectUse use = conv2d_direct_use(g);
  float* direct_gx = use.input_grad ? gx : nullptr;
  float* direct_gw = use.weight_grad ? gw : nullptr;
  if (direct_gx || direct_gw) conv2d_direct_backward(g, x, w, gy, direct_gx, direct_gw);
  if (gx != direct_gx || gw != direct_gw)
    conv2d_backward_im2col(g, x, w, gy, direct_gx ? nullptr : gx, direct_gw ? nullptr : gw);
  if (gb) bias_grad(g, gy, gb);
}

void conv2d_backward_im2col(const Conv2dGeometry& g, const float* x, const float* w,
                            const float* gy, float* gx, float* gw) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t K = cg * g.kh * g.kw, P = g.oh * g.ow;
  const bool pointwise = is_pointwise(g);
  const int64_t grain = image_grain(g);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), (g.n + grain - 1) / grain));
  // Each thread sums its images' weight gradients privately; the partial sums are added after.
  std::vector<float> gw_parts(gw ? size_t(std::max(threads, 1)) * g.o * K : 0, 0.f);
  if (gx) std::fill_n(gx, g.n * g.c * g.h * g.w, 0.f);
  const bool nested = in_region();  // then parallel_for runs serially on this thread
  parallel_for(g.n, grain, [&](int64_t n0, int64_t n1) {
    const int t = nested ? 0 : region_thread();
    float* col = pointwise ? nullptr : thread_scratch(0, size_t(2 * K * P));
    float* gcol = pointwise ? nullptr : col + K * P;
    float* gw_t = gw ? gw_parts.data() + size_t(t) * g.o * K : nullptr;
    for (int64_t n = n0; n < n1; ++n) {
      const float* xn = x + n * g.c * g.h * g.w;
      const float* gyn = gy + n * g.o * P;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        const float* xg = xn + grp * cg * g.h * g.w;
        const float* gyg = gyn + grp * og * P;
        const float* wg = w + grp * og * K;
        if (gw) {  // dW_g += dY_g (og x P) * col^T (P x K)
          const float* src = xg;
          if (!pointwise) {
            im2col(g, xg, cg, col);
            src = col;
          }
          gemm(false, true, og, K, P, 1.f, gyg, P, src, P, 1.f, gw_t + grp * og * K, K);
        }
        if (gx) {  // dcol = W_g^T (K x og) * dY_g (og x P), folded back into the image
          float* gxg = gx + n * g.c * g.h * g.w + grp * cg * g.h * g.w;
          if (pointwise) {
            gemm(true, false, K, P, og, 1.f, wg, K, gyg, P, 1.f, gxg, P);
          } else {
            gemm(true, false, K, P, og, 1.f, wg, K, gyg, P, 0.f, gcol, P);
            col2im(g, gcol, cg, gxg);
          }
        }
      }
    }
  });
  if (gw) {
    std::copy_n(gw_parts.data(), g.o * K, gw);
    for (int t = 1; t < threads; ++t) {
      const float* part = gw_parts.data() + size_t(t) * g.o * K;
#pragma omp simd
      for (int64_t i = 0; i < g.o * K; ++i) gw[i] += part[i];
    }
  }
}

}  // namespace galley::kernels::cpu
