#pragma once
// What the ops in src/ops share: argument checks, the stream a launcher runs on, and the float32
// widening through which ops whose kernels take float32 run 16-bit inputs. Every op runs its
// kernel on the device of its inputs and allocates its outputs there.
#include <vector>

#include "galley/autograd.h"
#include "galley/tensor.h"

namespace galley::detail {

// Refuses a pooling input [N, C, H, W] with no channels or an empty plane, as PyTorch does (only
// the batch may be empty): under ceil_mode an empty axis would still get a window, of nothing.
void check_pool_planes(const char* op, const Tensor& x);

// The CUDA stream of `device` that the op's launchers enqueue on, with `device` made current on
// this thread (null for the host).
void* stream(Device device);
// The positions of a window of k taps `dilation` apart sliding by `stride` over `in` elements
// padded by `pad` on each side: (in + 2 pad - dilation (k - 1) - 1) / stride + 1, 0 where the
// window does not fit. With ceil_mode (pooling) the division rounds up, but the last window must
// start inside the input or the left padding (PyTorch's pooling_output_shape). Exact for any
// sizes and options (computed in 128 bits); an error naming `op` where the count leaves int64.
int64_t window_positions(const char* op, int64_t in, int64_t k, int64_t dilation, int64_t pad,
                         int64_t stride, bool ceil_mode = false);
// `s` with leading 1s up to `rank` dimensions (how the broadcasting kernels take shapes).
std::vector<int64_t> aligned(const Shape& s, size_t rank);

// `t` must be a defined float32, bfloat16 or float16 tensor on a device with kernels.
void check_floating(const char* op, const Tensor& t);
// Both must pass check_floating, have one dtype (no silent promotion: the error names both) and
// live on the same device.
void check_floating_pair(const char* op, const Tensor& a, const Tensor& b);
// `t` itself when it is float32, else a float32 copy outside the graph: how the ops whose
// kernels take float32 only (reductions, softmax) compute a 16-bit input in float32. Their result
// is rounded once with `rounded`.
Tensor widened(const Tensor& t);
// `t` (float32, outside the graph) converted to `dtype`.
Tensor rounded(const Tensor& t, DType dtype);

// How an op whose kernels take float32 only (matmul, linear, conv, pooling, the loss) runs on a
// 16-bit input: the kernels read `widened(x).contiguous()`, the output is `rounded` once, and
// the recorded backward is wrapped by `widened_backward`.
//
// What the backward keeps of an input `t` whose float32 contiguous form is `wide`: `wide` itself
// when `t` is float32 (what the op read), else `t`'s own 16-bit data (half the bytes, and
// usually no copy at all), which the backward reads through `widened` again.
Tensor kept_for_backward(const Tensor& t, const Tensor& wide);
// The backward of such an op on inputs of `dtype`: `f32` itself for float32; for bfloat16 and
// float16, `f32` run on the incoming gradient widened to float32, each input gradient it
// produces then rounded once to `dtype`.
autograd::BackwardFn widened_backward(DType dtype, autograd::BackwardFn f32);
// True when `t` is the only handle to its data (no views, no saved copies) and contiguous, so an
// op may write its result into t's buffer without anyone observing it.
bool sole_owner(const Tensor& t);
// Normalises a possibly negative dimension index against `rank`.
int64_t wrap_dim(const char* op, int64_t dim, int64_t rank);
// A contiguous tensor viewed as [outer, len, inner] around one dimension (how the reductions and
// softmax kernels take it).
struct Split3 {
  int64_t outer = 1, len = 1, inner = 1;
};
Split3 split_at(const Shape& s, int64_t dim);

}  // namespace galley::detail
