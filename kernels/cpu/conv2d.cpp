#include "kernels/conv2d.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/convert.h"
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

// Unfolds channels [c0, c0 + cg) of one image into col[(c * kh + i) * kw + j][oh * ow], widening
// 16-bit values.
template <typename T>
void im2col(const Conv2dGeometry& g, const T* x, int64_t cg, float* col) {
  const int64_t P = g.oh * g.ow;
  for (int64_t c = 0; c < cg; ++c) {
    const T* xc = x + c * g.h * g.w;
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
          const T* xr = xc + ih * g.w + dj;
          std::fill_n(r, ow_lo, 0.f);
          if (g.stride != 1) {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow)
              r[ow] = static_cast<float>(xr[ow * g.stride]);
          } else if constexpr (std::is_same_v<T, float>) {
            std::memcpy(r + ow_lo, xr + ow_lo, (ow_hi - ow_lo) * sizeof(float));
          } else {
            to_float(xr + ow_lo, r + ow_lo, ow_hi - ow_lo);
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

// `n` elements of T as float32: `src` itself for float, else widened into `buf`.
template <typename T>
const float* as_float(const T* src, int64_t n, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    (void)n, (void)buf;
    return src;
  } else {
    to_float(src, buf, n);
    return buf;
  }
}

// gb[o] = the sum of gy over images and positions; 16-bit rows are widened first, so that the
// sums run in the float32 kernel's order.
template <typename T>
void bias_grad(const Conv2dGeometry& g, const T* gy, float* gb) {
  const int64_t P = g.oh * g.ow;
  std::vector<float> row(std::is_same_v<T, float> ? 0 : size_t(P));
  std::fill_n(gb, g.o, 0.f);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.o; ++o) {
      const float* r = as_float(gy + (n * g.o + o) * P, P, row.data());
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t p = 0; p < P; ++p) s += r[p];
      gb[o] += s;
    }
}

template <typename T>
void forward_im2col(const Conv2dGeometry& g, const T* x, const float* w, const float* b, T* y) {
  constexpr bool wide = std::is_same_v<T, float>;
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t K = cg * g.kh * g.kw, P = g.oh * g.ow;
  const bool pointwise = is_pointwise(g);
  parallel_for(g.n, image_grain(g), [&](int64_t n0, int64_t n1) {
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
  const int64_t grain = image_grain(g);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), (g.n + grain - 1) / grain));
  // Each thread sums its images' weight gradients privately; the partial sums are added after.
  std::vector<float> gw_parts(gw ? size_t(std::max(threads, 1)) * g.o * K : 0, 0.f);
  // A float32 gx accumulates in place; a 16-bit one is summed in float32 per group and rounded.
  if (gx && wide) std::fill_n(gx, g.n * g.c * HW, T(0.f));
  const bool nested = in_region();  // then parallel_for runs serially on this thread
  parallel_for(g.n, grain, [&](int64_t n0, int64_t n1) {
    const int t = nested ? 0 : region_thread();
    float* col = pointwise && wide ? nullptr : thread_scratch(0, size_t(K * P));
    float* gcol = pointwise ? nullptr : thread_scratch(2, size_t(K * P));
    float* gy_wide = wide ? nullptr : thread_scratch(3, size_t(og * P));
    float* gx_wide = wide || !gx ? nullptr : thread_scratch(4, size_t(cg * HW));
    float* gw_t = gw ? gw_parts.data() + size_t(t) * g.o * K : nullptr;
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
  if (gw) {
    std::copy_n(gw_parts.data(), g.o * K, gw);
    for (int t = 1; t < threads; ++t) {
      const float* part = gw_parts.data() + size_t(t) * g.o * K;
#pragma omp simd
      for (int64_t i = 0; i < g.o * K; ++i) gw[i] += part[i];
    }
  }
}

}  // namespace

void conv2d_forward(const Conv2dGeometry& g, const void* x, const float* w, const float* b, void* y,
                    DType dtype) {
  const ConvDirectUse use = conv2d_direct_use(g, dtype);
  if (use.forward)
    conv2d_direct_forward(g, x, w, b, y, dtype, use.bf16);
  else
    conv2d_forward_im2col(g, x, w, b, y, dtype);
}

void conv2d_forward_im2col(const Conv2dGeometry& g, const void* x, const float* w, const float* b,
                           void* y, DType dtype) {
  dispatch_floating(dtype, "conv2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_im2col(g, static_cast<const T*>(x), w, b, static_cast<T*>(y));
  });
}

void conv2d_backward(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                     void* gx, float* gw, float* gb, DType dtype) {
  const ConvDirectUse use = conv2d_direct_use(g, dtype);
  void* direct_gx = use.input_grad ? gx : nullptr;
  float* direct_gw = use.weight_grad ? gw : nullptr;
  if (direct_gx || direct_gw)
    conv2d_direct_backward(g, x, w, gy, direct_gx, direct_gw, dtype, use.bf16);
  if (gx != direct_gx || gw != direct_gw)
    conv2d_backward_im2col(g, x, w, gy, direct_gx ? nullptr : gx, direct_gw ? nullptr : gw, dtype);
  if (gb)
    dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      bias_grad(g, static_cast<const T*>(gy), gb);
    });
}

void conv2d_backward_im2col(const Conv2dGeometry& g, const void* x, const float* w, const void* gy,
                            void* gx, float* gw, DType dtype) {
  dispatch_floating(dtype, "conv2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_im2col(g, static_cast<const T*>(x), w, static_cast<const T*>(gy), static_cast<T*>(gx),
                    gw);
  });
}

}  // namespace galley::kernels::cpu
