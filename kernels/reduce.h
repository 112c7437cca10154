#pragma once
// Float32 sums and argmax along one dimension of a contiguous tensor viewed as
// [outer, len, inner], and the column sums of a matrix (bias gradients). The CUDA launchers take
// device pointers and the cudaStream_t to run on; they only enqueue, and sum in a fixed order
// (the same bits at every run, never atomics). A mean is the sum divided by the count (a true
// division, as PyTorch's: not a product with the reciprocal, an ulp off in a third of cases).
// Sums run in double (on a GPU each thread's share too): a float32 running sum of 2e7 ones stops
// at 16777216. The host and a GPU add in different orders, so their results may differ in the
// last bit.
#include <cstdint>

namespace galley::kernels {
namespace cpu {

// out[o, i] = sum_l x[o, l, i] / divisor
void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, float* out,
             double divisor = 1.0);
// Sum of all n elements, accumulated in double for stability.
double sum_all(const float* x, int64_t n);
// out[o, l, i] = g[o, i] (the backward of a sum, once its gradient is divided).
void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float* out);
// out[o, i] = argmax_l x[o, l, i] (first of equal maxima; NaN wins).
void argmax_dim(const float* x, int64_t outer, int64_t len, int64_t inner, int64_t* out);
// out[j] (+)= sum over rows i of g[i * n + j], for a rows x n matrix.
void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate);
// out[j] = ((accumulate ? out[j] : 0) + sum over r < rows of x[r * ld + j]) / divisor for j < n,
// summed in double.
void sum_rows(const float* x, int64_t rows, int64_t ld, int64_t n, float* out, bool accumulate,
              double divisor);

}  // namespace cpu

namespace cuda {

// out[o, i] = sum_l x[o, l, i] / divisor
void sum_dim(const float* x, int64_t outer, int64_t len, int64_t inner, double divisor, float* out,
             void* stream);
// out[0] = the sum of all n elements (accumulated in double, in an order set by n alone) / divisor.
void sum_all(const float* x, int64_t n, double divisor, float* out, void* stream);
// out[o, l, i] = g[o, i] (outer = inner = 1 spreads g[0]: the backward of sum_all).
void expand_dim(const float* g, int64_t outer, int64_t len, int64_t inner, float* out,
                void* stream);
void argmax_dim(const float* x, int64_t outer, int64_t len, int64_t inner, int64_t* out,
                void* stream);
// Many rows are split across blocks, with partial sums added in a fixed order.
void column_sums(const float* g, int64_t rows, int64_t n, float* out, bool accumulate,
                 void* stream);
// The float32 case of binary.h's sum_to (binary.cu's launcher calls it).
void sum_to_float32(const float* g, const int64_t* g_shape, float* out, const int64_t* shape,
                    int rank, void* stream);

}  // namespace cuda
}  // namespace galley::kernels
