#pragma once
// Sums and argmax along one dimension of a contiguous tensor viewed as [outer, len, inner].
#include <cstdint>

namespace galley::kernels::cpu {

// out[o, i] = sum_l x[o, l, i]
void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, float* out);
// Sum of all n elements, accumulated in double for stability.
double sum_all(const float* x, int64_t n);
// out[o, l, i] = g[o, i] * scale (the backward of a scaled sum).
void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float scale, float* out);
// out[o, i] = argmax_l x[o, l, i] (first of equal maxima; NaN wins).
void argmax_dim(const float* x, int64_t outer, int64_t len, int64_t inner, int64_t* out);

}  // namespace galley::kernels::cpu
