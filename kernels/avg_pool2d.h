#pragma once
// 2-D average pooling, NCHW: fixed windows (avg_pool2d: kernel, stride, padding, ceil_mode,
// count_include_pad) and adaptive windows (adaptive_avg_pool2d: PyTorch's start =
// floor(i * in / out), end = ceil((i + 1) * in / out)), in float32, bfloat16 or float16.
//
// The kernels are templated over the element type and compute in float32 (float32 sums, one
// rounding per output), instead of running float32 kernels on widened copies: pooling reads
// each input once or a few times, so a widening pass and a rounding pass would cost more
// memory traffic than the op itself. The 16-bit kernels widen each plane into float32 scratch
// on the host, and load elements as float32 on the GPU.
//
// Both windows are separable (a window is a row range times a column range, and its divisor
// is the product of the two counts), so one geometry and one window rule serve both ops, on the
// host and on the GPU. The CUDA launchers take device pointers and the cudaStream_t to run on.
#include <cstdint>

#include "galley/dtype.h"
#include "galley/half.h"

namespace galley::kernels {

struct AvgPool2dGeometry {
  int64_t planes, h, w;  // planes = N * C
  int64_t oh, ow;
  // Fixed windows when k > 0; k == 0: adaptive windows (stride, pad, include_pad unused).
  int64_t k, stride, pad;
  bool count_include_pad;
};

// The input range [start, end) of output index i along an axis of `in` inputs and `out`
// outputs, and the count its window divides by.
struct PoolWindow {
  int64_t start, end, count;
};

GALLEY_HOST_DEVICE inline PoolWindow avg_pool_window(const AvgPool2dGeometry& g, int64_t i,
                                                     int64_t in, int64_t out) {
  if (g.k == 0) {
    const int64_t s = i * in / out, e = ((i + 1) * in + out - 1) / out;
    return {s, e, e - s};
  }
  // PyTorch's rule: the count with padding stops at the padded edge (a ceil_mode window may
  // reach past it); without padding it is the clipped window's size.
  const int64_t s0 = i * g.stride - g.pad;
  const int64_t e0 = s0 + g.k < in + g.pad ? s0 + g.k : in + g.pad;
  const int64_t s = s0 > 0 ? s0 : 0, e = e0 < in ? e0 : in;
  return {s, e, g.count_include_pad ? e0 - s0 : e - s};
}

// v (a window's sum, or an output's gradient) divided by the window's count as PyTorch does:
// once by the product for fixed windows, by the row count then the column count for adaptive
// ones (which gives other bits when the counts are not powers of two).
GALLEY_HOST_DEVICE inline float avg_pool_divide(const AvgPool2dGeometry& g, float v,
                                                const PoolWindow& r, const PoolWindow& c) {
  return g.k == 0 ? v / float(r.count) / float(c.count) : v / float(r.count * c.count);
}

// The output indices whose windows may hold input index j (a superset for adaptive windows:
// test each with avg_pool_window): [lo, hi], empty when lo > hi.
GALLEY_HOST_DEVICE inline void avg_pool_outputs_of(const AvgPool2dGeometry& g, int64_t j,
                                                   int64_t in, int64_t out, int64_t* lo,
                                                   int64_t* hi) {
  if (g.k == 0) {
    *lo = j * out / in;
    const int64_t h = (j + 1) * out / in;
    *hi = h < out - 1 ? h : out - 1;
    return;
  }
  const int64_t a = j + g.pad - g.k + 1;
  *lo = a > 0 ? (a + g.stride - 1) / g.stride : 0;
  const int64_t h = (j + g.pad) / g.stride;
  *hi = h < out - 1 ? h : out - 1;
}

namespace cpu {

// y [planes, oh, ow] = the mean of each window of x [planes, h, w], all of `dtype`. An adaptive
// 1x1 output (global average pooling) is a plain vectorised mean of each plane.
void avg_pool2d_forward(const AvgPool2dGeometry& g, DType dtype, const void* x, void* y);
// gx [planes, h, w] (overwritten) = the sum over the windows holding each element of gy / count.
void avg_pool2d_backward(const AvgPool2dGeometry& g, DType dtype, const void* gy, void* gx);

}  // namespace cpu

namespace cuda {

void avg_pool2d_forward(const AvgPool2dGeometry& g, DType dtype, const void* x, void* y,
                        void* stream);
void avg_pool2d_backward(const AvgPool2dGeometry& g, DType dtype, const void* gy, void* gx,
                         void* stream);

}  // namespace cuda
}  // namespace galley::kernels
