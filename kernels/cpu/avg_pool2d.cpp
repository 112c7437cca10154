// 2-D average pooling on the host: planes split over the threads, each plane computed in
// float32 (a 16-bit plane is widened into per-thread scratch first and its result rounded once).
#include "kernels/avg_pool2d.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/staged.h"

namespace galley::kernels::cpu {
namespace {

bool is_global(const AvgPool2dGeometry& g) {
  return g.k == 0 && g.oh == 1 && g.ow == 1;
}

// y = the mean of each window of one float32 plane; each window is summed row by row and
// divided by its count, as PyTorch does.
void pool_plane(const AvgPool2dGeometry& g, const float* x, float* y) {
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const PoolWindow r = avg_pool_window(g, oh, g.h, g.oh);
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const PoolWindow c = avg_pool_window(g, ow, g.w, g.ow);
      float s = 0.f;
      for (int64_t ih = r.start; ih < r.end; ++ih) {
        const float* row = x + ih * g.w;
        for (int64_t iw = c.start; iw < c.end; ++iw) s += row[iw];
      }
      y[oh * g.ow + ow] = avg_pool_divide(g, s, r, c);
    }
  }
}

// gx (overwritten) of one float32 plane: each window adds gy / count to its elements, windows in
// output order (the order the CUDA kernel gathers them in, so both give the same bits).
void unpool_plane(const AvgPool2dGeometry& g, const float* gy, float* gx) {
  std::fill_n(gx, g.h * g.w, 0.f);
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const PoolWindow r = avg_pool_window(g, oh, g.h, g.oh);
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      const PoolWindow c = avg_pool_window(g, ow, g.w, g.ow);
      const float v = avg_pool_divide(g, gy[oh * g.ow + ow], r, c);
      for (int64_t ih = r.start; ih < r.end; ++ih) {
        float* row = gx + ih * g.w;
#pragma omp simd
        for (int64_t iw = c.start; iw < c.end; ++iw) row[iw] += v;
      }
    }
  }
}

// The float32 sum of n floats, vectorised.
float plane_sum(const float* x, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// y[p] = the mean of plane p of n elements, for p in [p0, p1). 16-bit planes are widened a run
// of whole planes at a time (about 4096 elements), so small planes (7x7) cost no call each.
template <typename T>
void plane_means(const T* x, int64_t n, T* y, int64_t p0, int64_t p1) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t p = p0; p < p1; ++p) y[p] = plane_sum(x + p * n, n) / float(n);
  } else {
    const int64_t run = std::max<int64_t>(1, 4096 / n);
    float* buf = thread_scratch(0, run * n);
    for (int64_t p = p0; p < p1; p += run) {
      const int64_t q = std::min(run, p1 - p);
      to_float(x + p * n, buf, q * n);
      for (int64_t j = 0; j < q; ++j) y[p + j] = T(plane_sum(buf + j * n, n) / float(n));
    }
  }
}

// Whole planes per thread, at least kElementwiseGrain input elements a thread.
int64_t plane_grain(const AvgPool2dGeometry& g) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(g.h * g.w, 1));
}

// Runs f(float32 input plane, float32 output plane) for every plane of `in_size` -> `out_size`
// elements of T: float32 planes in place, 16-bit ones widened into scratch and rounded back.
template <typename T, typename F>
void per_plane(const AvgPool2dGeometry& g, const T* src, int64_t in_size, T* dst, int64_t out_size,
               F f) {
  parallel_for(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      if constexpr (std::is_same_v<T, float>) {
        f(src + p * in_size, dst + p * out_size);
      } else {
        float* a = thread_scratch(0, in_size);
        float* b = thread_scratch(1, out_size);
        to_float(src + p * in_size, a, in_size);
        f(a, b);
        from_float(b, dst + p * out_size, out_size);
      }
    }
  });
}

}  // namespace

void avg_pool2d_forward(const AvgPool2dGeometry& g, DType dtype, const void* x, void* y) {
  dispatch_floating(dtype, "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    const int64_t in = g.h * g.w;
    if (is_global(g)) {
      parallel_for(g.planes, plane_grain(g),
                   [&](int64_t p0, int64_t p1) { plane_means(px, in, py, p0, p1); });
      return;
    }
    per_plane(g, px, in, py, g.oh * g.ow, [&](const float* a, float* b) { pool_plane(g, a, b); });
  });
}

void avg_pool2d_backward(const AvgPool2dGeometry& g, DType dtype, const void* gy, void* gx) {
  dispatch_floating(dtype, "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pgy = static_cast<const T*>(gy);
    T* pgx = static_cast<T*>(gx);
    const int64_t in = g.h * g.w;
    if (is_global(g)) {
      parallel_for(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          std::fill_n(pgx + p * in, in, T(float(pgy[p]) / float(in)));
      });
      return;
    }
    per_plane(g, pgy, g.oh * g.ow, pgx, in,
              [&](const float* a, float* b) { unpool_plane(g, a, b); });
  });
}

}  // namespace galley::kernels::cpu
