#include "kernels/reduce.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, float* out) {
  parallel_balanced(outer,
                    std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(len * inner, 1)),
                    [&](int64_t o0, int64_t o1) {
                      for (int64_t o = o0; o < o1; ++o) {
                        float* r = out + o * inner;
                        std::fill_n(r, inner, 0.f);
                        for (int64_t l = 0; l < len; ++l) {
                          const float* xr = x + (o * len + l) * inner;
#pragma omp simd
                          for (int64_t i = 0; i < inner; ++i) r[i] += xr[i];
                        }
                      }
                    });
}

double sum_all(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float scale,
                float* out) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t l = 0; l < len; ++l) {
      float* r = out + (o * len + l) * inner;
      const float* gr = g + o * inner;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) r[i] = gr[i] * scale;
    }
}

void argmax_dim(const float* x, int64_t outer, int64_t len, int64_t inner, int64_t* out) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const float* p = x + o * len * inner + i;
      int64_t best = 0;
      float bv = p[0];
      for (int64_t l = 1; l < len && !std::isnan(bv); ++l) {
        float v = p[l * inner];
        if (v > bv || std::isnan(v)) bv = v, best = l;
      }
      out[o * inner + i] = best;
    }
}

void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate) {
  if (!accumulate) std::fill_n(out, n, 0.f);
  for (int64_t i = 0; i < rows; ++i) {
    const float* r = g + i * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] += r[j];
  }
}

}  // namespace galley::kernels::cpu
