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

// acc[ow] += the window's elements in input row `row`, for outputs [lo, hi) whose windows lie
// inside the row: K taps at a stride of S (compile-time, so the loop vectorises over outputs).
template <int K, int S>
void add_row_taps(const float* row, float* acc, int64_t lo, int64_t hi, int64_t pad) {
#pragma omp simd
  for (int64_t ow = lo; ow < hi; ++ow) {
    const float* p = row + ow * S - pad;
    float a = acc[ow];
    for (int b = 0; b < K; ++b) a += p[b];
    acc[ow] = a;
  }
}

// [lo, hi): the outputs whose fixed windows lie inside a row (ow * stride - pad >= 0 and
// ow * stride - pad + k <= w).
void inside_outputs(const AvgPool2dGeometry& g, int64_t* lo, int64_t* hi) {
  *lo = std::min(g.ow, (g.pad + g.stride - 1) / g.stride);
  *hi = g.w + g.pad >= g.k ? std::min(g.ow, (g.w + g.pad - g.k) / g.stride + 1) : 0;
  *hi = std::max(*hi, *lo);
}

using AddRowFn = void (*)(const float*, float*, int64_t, int64_t, int64_t);

// The vectorised row of the common windows (2x2/2, 3x3/1, 3x3/2), else null.
AddRowFn row_taps_for(const AvgPool2dGeometry& g) {
  if (g.k == 2 && g.stride == 2) return add_row_taps<2, 2>;
  if (g.k == 3 && g.stride == 1) return add_row_taps<3, 1>;
  if (g.k == 3 && g.stride == 2) return add_row_taps<3, 2>;
  return nullptr;
}

// y = the mean of each window of one float32 plane; each window is summed row by row and
// divided by its count, as PyTorch does. The sums build up in y one input row at a time, in
// that same order, so that the common windows' rows vectorise over the outputs.
void pool_plane(const AvgPool2dGeometry& g, const float* x, float* y) {
  const AddRowFn taps = g.k > 0 ? row_taps_for(g) : nullptr;
  int64_t lo = 0, hi = 0;
  if (taps) inside_outputs(g, &lo, &hi);
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const PoolWindow r = avg_pool_window(g, oh, g.h, g.oh);
    float* acc = y + oh * g.ow;
    std::fill_n(acc, g.ow, 0.f);
    for (int64_t ih = r.start; ih < r.end; ++ih) {
      const float* row = x + ih * g.w;
      if (taps) taps(row, acc, lo, hi, g.pad);
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        if (ow == lo && taps) ow = hi;
        if (ow >= g.ow) break;
        const PoolWindow c = avg_pool_window(g, ow, g.w, g.ow);
        float a = acc[ow];
        for (int64_t iw = c.start; iw < c.end; ++iw) a += row[iw];
        acc[ow] = a;
      }
    }
    for (int64_t ow = 0; ow < g.ow; ++ow)
      acc[ow] = avg_pool_divide(g, acc[ow], r, avg_pool_window(g, ow, g.w, g.ow));
  }
}

// row[ow * S - pad + b] += v[ow] for b < K and outputs [lo, hi) whose windows lie inside the
// row; S >= K, so no two outputs touch one element and the loop vectorises over outputs.
template <int K, int S>
void scatter_row_taps(float* row, const float* v, int64_t lo, int64_t hi, int64_t pad) {
  static_assert(S >= K, "windows that overlap would add out of output order");
#pragma omp simd
  for (int64_t ow = lo; ow < hi; ++ow) {
    float* p = row + ow * S - pad;
    for (int b = 0; b < K; ++b) p[b] += v[ow];
  }
}

using ScatterRowFn = void (*)(float*, const float*, int64_t, int64_t, int64_t);

// The vectorised row of the common windows that do not overlap (2x2/2, 3x3/3), else null.
ScatterRowFn scatter_taps_for(const AvgPool2dGeometry& g) {
  if (g.k == 2 && g.stride == 2) return scatter_row_taps<2, 2>;
  if (g.k == 3 && g.stride == 3) return scatter_row_taps<3, 3>;
  return nullptr;
}

// gx (overwritten) of one float32 plane: each window adds gy / count to its elements, windows in
// output order (the order the CUDA kernel gathers them in, so both give the same bits). Output
// rows go one input row at a time, which keeps that order for every element.
void unpool_plane(const AvgPool2dGeometry& g, const float* gy, float* gx) {
  std::fill_n(gx, g.h * g.w, 0.f);
  const ScatterRowFn taps = g.k > 0 ? scatter_taps_for(g) : nullptr;
  int64_t lo = 0, hi = 0;
  if (taps) inside_outputs(g, &lo, &hi);
  float* v = thread_scratch(2, g.ow);
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    const PoolWindow r = avg_pool_window(g, oh, g.h, g.oh);
    for (int64_t ow = 0; ow < g.ow; ++ow)
      v[ow] = avg_pool_divide(g, gy[oh * g.ow + ow], r, avg_pool_window(g, ow, g.w, g.ow));
    for (int64_t ih = r.start; ih < r.end; ++ih) {
      float* row = gx + ih * g.w;
      if (taps) taps(row, v, lo, hi, g.pad);
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        if (ow == lo && taps) ow = hi;
        if (ow >= g.ow) break;
        const PoolWindow c = avg_pool_window(g, ow, g.w, g.ow);
        for (int64_t iw = c.start; iw < c.end; ++iw) row[iw] += v[ow];
      }
    }
  }
}

// y[p] = the mean of plane p of n elements, for p in [p0, p1). 16-bit planes are widened a run
// of whole planes at a time (about 4096 elements), so small planes (7x7) cost no call each.
template <typename T>
void plane_means(const T* x, int64_t n, T* y, int64_t p0, int64_t p1) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t p = p0; p < p1; ++p) y[p] = sum_floats(x + p * n, n) / float(n);
  } else {
    const int64_t run = std::max<int64_t>(1, 4096 / n);
    float* buf = thread_scratch(0, run * n);
    for (int64_t p = p0; p < p1; p += run) {
      const int64_t q = std::min(run, p1 - p);
      to_float(x + p * n, buf, q * n);
      for (int64_t j = 0; j < q; ++j) y[p + j] = T(sum_floats(buf + j * n, n) / float(n));
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
  parallel_balanced(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
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
      parallel_balanced(g.planes, plane_grain(g),
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
      parallel_balanced(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
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
