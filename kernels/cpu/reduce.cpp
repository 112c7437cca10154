#include "kernels/reduce.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace galley::kernels::cpu {

double sum_all(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

void sum_rows(const float* x, int64_t rows, int64_t ld, int64_t n, float* out, bool accumulate,
              double divisor) {
  // The rows streamed in order, each added into the double sums whole (a walk down the columns
  // in blocks ran 2-3x slower on wide matrices; float32 partial sums of a few rows each left the
  // result two ulps off the double sum).
  std::vector<double> acc(static_cast<size_t>(n));
  double* a = acc.data();
  for (int64_t j = 0; j < n; ++j) a[j] = accumulate ? double(out[j]) : 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) a[j] += double(xr[j]);
  }
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(a[j] / divisor);
}

void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, float* out,
             double divisor) {
  parallel_balanced(outer,
                    std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(len * inner, 1)),
                    [&](int64_t o0, int64_t o1) {
                      for (int64_t o = o0; o < o1; ++o) {
                        const float* xo = x + o * len * inner;
                        if (inner == 1)  // a contiguous row: one vectorised double sum
                          out[o] = static_cast<float>(sum_all(xo, len) / divisor);
                        else
                          sum_rows(xo, len, inner, inner, out + o * inner, false, divisor);
                      }
                    });
}

void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float* out) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t l = 0; l < len; ++l) {
      float* r = out + (o * len + l) * inner;
      const float* gr = g + o * inner;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) r[i] = gr[i];
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
  sum_rows(g, rows, n, n, out, accumulate, 1.0);
}

}  // namespace galley::kernels::cpu
